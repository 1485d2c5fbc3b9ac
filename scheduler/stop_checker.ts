/**
 * Token-level stop checks, a pure function over a sequence whose last output token was just
 * appended. Stop strings are the detokenizer's business: it calls the scheduler's
 * `finishRequest(id, "stop", stopString)` itself.
 *
 * @module
 */

import type { FinishReason, Sequence } from "./sequence.ts";

/** A stop decision. */
export interface StopDecision {
  /** "stop" (EOS or a stop token id) or "length" (max_tokens or max_model_len). */
  readonly reason: Exclude<FinishReason, "abort">;
  /** The stop token id that ended the request (null for EOS and length stops, like vLLM). */
  readonly stopReason: number | null;
}

/**
 * Whether `seq` must stop after its last known output token. In order: no stop before
 * `minTokens` outputs (except length limits); EOS (one of `eosTokenIds`) unless `ignoreEos`;
 * a stop token id; `maxTokens` outputs; `maxModelLen` tokens in all.
 */
export function checkStop(
  seq: Sequence,
  eosTokenIds: readonly number[],
  maxModelLen: number,
): StopDecision | null {
  const outputs = seq.outputTokenIds;
  const last = outputs[outputs.length - 1];
  if (last === undefined) return null;
  if (outputs.length >= seq.params.minTokens) {
    if (!seq.params.ignoreEos && eosTokenIds.includes(last)) {
      return { reason: "stop", stopReason: null };
    }
    if (seq.params.stopTokenIds.includes(last)) return { reason: "stop", stopReason: last };
  }
  if (outputs.length >= seq.maxTokens || seq.numKnownTokens >= maxModelLen) {
    return { reason: "length", stopReason: null };
  }
  return null;
}
