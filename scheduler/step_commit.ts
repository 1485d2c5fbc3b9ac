/**
 * The two per-step mutations every scheduler shares: committing a request's share of a step
 * (advance computed tokens, add the sampled-token placeholder, build the plain-data record) and
 * applying a sampled token read back later (resolve the placeholder, run the stop checks).
 *
 * @module
 */

import {
  type RequestUpdate,
  SAMPLED_TOKEN,
  type ScheduledRequest,
  type SchedulerOutput,
} from "./scheduler_output.ts";
import type { HostReady } from "./scheduler_api.ts";
import type { Sequence } from "./sequence.ts";
import { checkStop, type StopDecision } from "./stop_checker.ts";

/**
 * Commits `n` tokens of `seq` (which must hold blocks for them) to step `step` and returns its
 * {@linkcode ScheduledRequest}. When the step reaches the sequence's end a placeholder is added
 * for the token it samples, in sampler row `row` (the caller counts rows).
 */
export function commitTokens(
  seq: Sequence,
  n: number,
  blockSize: number,
  isNew: boolean,
  step: number,
  row: number,
): ScheduledRequest {
  const start = seq.numComputedTokens;
  let sampledFrom: ScheduledRequest["sampledFrom"] = null;
  const tokenIds: number[] = new Array(n);
  const slotMapping: number[] = new Array(n);
  for (let k = 0; k < n; k++) {
    const p = start + k;
    const t = seq.tokenAt(p);
    if (t < 0) {
      if (k !== n - 1 || seq.lastSampledAt === null) {
        throw new RangeError(
          `Cannot schedule request "${seq.requestId}": token ${p} is not known and not the latest sampled`,
        );
      }
      sampledFrom = seq.lastSampledAt;
    }
    tokenIds[k] = t < 0 ? SAMPLED_TOKEN : t;
    const block = seq.blockTable[Math.floor(p / blockSize)];
    if (block === undefined) {
      throw new RangeError(
        `Cannot schedule request "${seq.requestId}": position ${p} has no KV block`,
      );
    }
    slotMapping[k] = block * blockSize + (p % blockSize);
  }
  seq.numComputedTokens += n;
  const samplesToken = seq.numComputedTokens === seq.numTokens;
  if (samplesToken) {
    seq.addPlaceholder();
    seq.lastSampledAt = { step, row };
  }
  return {
    requestId: seq.requestId,
    numTokens: n,
    tokenIds,
    positionStart: start,
    // The sequence's own array, not a copy (see ScheduledRequest.blockTable).
    blockTable: seq.blockTable,
    slotMapping,
    samplesToken,
    isNew,
    numCachedTokens: isNew ? seq.numCachedTokens : 0,
    params: seq.params,
    sampleRow: samplesToken ? row : -1,
    sampledFrom,
  };
}

/**
 * Appends a sampled token read back from the step `step` to `seq` and returns the stop
 * decision. Throws TypeError for an invalid token id.
 */
export function applySampledToken(
  seq: Sequence,
  token: number,
  eosTokenIds: readonly number[],
  maxModelLen: number,
): StopDecision | null {
  if (!Number.isInteger(token) || token < 0) {
    throw new TypeError(`Cannot update request "${seq.requestId}": token id ${token} is invalid`);
  }
  seq.appendToken(token);
  return checkStop(seq, eosTokenIds, maxModelLen);
}

/**
 * Tokens `seq` could run now, ignoring the budget: what it has not computed, or 0 while its
 * latest sampled token is its final one (max_tokens or maxModelLen reached), and for a
 * grammar-constrained request (or one with bad words) while its latest token or its next mask is
 * not on the host.
 */
export function tokensToRun(
  seq: Sequence,
  maxModelLen: number,
  hostReady: HostReady = () => true,
): number {
  if (seq.numOutputTokens >= seq.maxTokens || seq.numTokens >= maxModelLen) return 0;
  // A grammar-constrained request (or one with bad words) waits for its last sampled token and
  // then for its next mask (which depends on it).
  const masked = (seq.params.structuredOutput ?? null) !== null ||
    (seq.params.badWords?.length ?? 0) > 0;
  if (masked && (seq.numPlaceholders > 0 || !hostReady(seq.requestId))) return 0;
  return seq.numTokens - seq.numComputedTokens;
}

/**
 * Applies one step's sampled tokens (request id -> token) to the live requests of a scheduler:
 * appends each token, runs the stop checks, finishes requests through `finish`, and returns one
 * update per live request that got a token. Requests no longer live (finished, aborted) are
 * skipped. Shared by every scheduler; the caller checks step order.
 *
 * @throws {RangeError} when a request that sampled in this step has no token in `sampled`.
 */
export function applyStepTokens(
  output: SchedulerOutput,
  sampled: ReadonlyMap<string, number>,
  live: (requestId: string) => Sequence | undefined,
  finish: (seq: Sequence, reason: "stop" | "length", stopReason: number | null) => void,
  eosTokenIds: readonly number[],
  maxModelLen: number,
): RequestUpdate[] {
  const updates: RequestUpdate[] = [];
  for (const r of output.scheduled) {
    if (!r.samplesToken) continue;
    const seq = live(r.requestId);
    if (seq === undefined || seq.isFinished) continue;
    const token = sampled.get(r.requestId);
    if (token === undefined) {
      throw new RangeError(
        `Cannot update request "${r.requestId}": step ${output.step} sampled a token for it but none was given`,
      );
    }
    const stop = applySampledToken(seq, token, eosTokenIds, maxModelLen);
    if (stop !== null) finish(seq, stop.reason, stop.stopReason);
    updates.push({
      requestId: seq.requestId,
      newTokenIds: [token],
      finishReason: stop?.reason ?? null,
      stopReason: stop?.stopReason ?? null,
    });
  }
  return updates;
}
