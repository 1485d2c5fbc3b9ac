/**
 * The two per-step mutations every scheduler shares: committing a request's share of a step
 * (advance computed tokens, add the sampled-token placeholder, build the plain-data record) and
 * applying a sampled token read back later (resolve the placeholder, run the stop checks).
 *
 * @module
 */

import {
  type PromptLogprobRows,
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
  const prompt = promptRange(seq, start, n);
  let promptLogprobs: PromptLogprobRows | null = null;
  if (prompt.end > prompt.start) {
    promptLogprobs = {
      first: prompt.start - start,
      targets: seq.promptTokenIds.slice(prompt.start + 1, prompt.end + 1),
      topLogprobs: seq.params.promptLogprobs ?? 0,
    };
    seq.promptLogprobsUntil = prompt.end;
  }
  seq.numComputedTokens += n;
  const samplesToken = seq.numComputedTokens === seq.numTokens;
  if (samplesToken) {
    seq.addPlaceholder();
    seq.lastSampledAt = { step, row };
  }
  return {
    requestId: seq.requestId,
    order: seq.order,
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
    ...(promptLogprobs === null ? {} : { promptLogprobs }),
  };
}

/**
 * The prompt positions `[start, end)` whose log-probability rows a chunk of `n` tokens of `seq`
 * from position `from` computes (`params.promptLogprobs`): each position before the prompt's
 * last not given to an earlier step. Empty (`end <= start`) when none.
 */
function promptRange(seq: Sequence, from: number, n: number): { start: number; end: number } {
  if (seq.params.promptLogprobs === null) return { start: from, end: from };
  const start = Math.max(from, seq.promptLogprobsUntil);
  return { start, end: Math.max(start, Math.min(from + n, seq.promptTokenIds.length - 1)) };
}

/**
 * Whether `seq` still has prompt log-probabilities to compute: it must then compute its prompt
 * itself, without reading the prefix cache.
 */
export function needsPromptRows(seq: Sequence): boolean {
  return seq.params.promptLogprobs !== null &&
    seq.promptLogprobsUntil < seq.promptTokenIds.length - 1;
}

/**
 * Rows a chunk of `n` tokens of `seq` from position `from` takes in its step's sampler (whose
 * rows are bounded by the runner's `samplerRows`): one when it samples (it reaches the sequence's
 * end) and one per prompt position whose log-probability it computes.
 */
export function samplerRows(seq: Sequence, from: number, n: number): number {
  const p = promptRange(seq, from, n);
  return p.end - p.start + (from + n === seq.numTokens ? 1 : 0);
}

/**
 * The longest chunk of at most `n` tokens of `seq` from position `from` whose sampler rows fit
 * in `rows` (0 when none does). Only a request with prompt log-probabilities is ever cut
 * shorter than `n` while `rows >= 1`.
 */
export function fitRows(seq: Sequence, from: number, n: number, rows: number): number {
  if (samplerRows(seq, from, n) <= rows) return n;
  // Too many rows: stop the chunk after `rows` prompt positions (before the prompt's end, so
  // it samples nothing).
  const start = Math.max(from, seq.promptLogprobsUntil);
  return Math.min(n, Math.max(0, start + Math.max(0, rows) - from));
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
 * update per live request that got a token. Requests no longer live (finished, aborted; or their id now another's) are
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
    // Ended, or its id reused by a newer request since this step was scheduled: not its token.
    if (seq === undefined || seq.isFinished || seq.order !== r.order) continue;
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
