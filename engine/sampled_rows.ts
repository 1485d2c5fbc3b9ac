/**
 * The sampled rows of one step as the host reads them back: the layout of a read-back ring slot
 * ({@linkcode StepBuffers}: sampled ids, their log-probabilities, the top-logprob regions)
 * decoded into tokens, log-probabilities, top log-probabilities and scored prompt positions.
 *
 * @module
 */

import { TOP_LOGPROBS_MAX } from "../kernels/top_logprobs.ts";
import type { StepBuffers } from "./step_buffers.ts";

/** One entry of a row's top log-probabilities. */
export interface TopLogprob {
  readonly tokenId: number;
  /** log-softmax of the raw logits (before logits processing and temperature). */
  readonly logprob: number;
}

/** One scored prompt position (see `SequenceChunk.promptLogprobs`), once read back. */
export interface PromptLogprobRow {
  /** The prompt token scored. */
  readonly tokenId: number;
  /** Its log-softmax under the raw logits at the position before it. */
  readonly logprob: number;
  /** 1 + the number of tokens with a strictly larger logit there. */
  readonly rank: number;
  /** The `topLogprobs` most likely tokens there, best first (ties: lower id first). */
  readonly top: readonly TopLogprob[];
}

/** The sampled rows of one step, once read back. */
export interface SampledRows {
  /** u32 `[rows]`: token id per sampling sequence, in batch order. */
  readonly tokens: Uint32Array;
  /**
   * f32 `[rows]`: log-probability of each token under the logits `sample` saw: the raw logits,
   * or for a row with logits processing (penalties, bias) the processed ones.
   */
  readonly logprobs: Float32Array;
  /**
   * `[rows]`: each row's `min(topLogprobs, vocab)` most likely tokens under the raw logits, best
   * first (ties: lower id first); empty for rows that asked for none.
   */
  readonly top: readonly (readonly TopLogprob[])[];
  /**
   * The scored prompt positions of the step's sequences, in batch order and position order
   * (`SequenceChunk.promptLogprobs`); empty when none.
   */
  readonly prompt: readonly PromptLogprobRow[];
}

/** What a step sampled, as far as decoding its slot needs (the sampler's plan). */
export interface SampledLayout {
  /** Rows of the logits: the sampling sequences, then the scored prompt positions. */
  readonly rows: number;
  /** Sequences that sample (the first rows). */
  readonly sampled: number;
  /** The token each scored prompt position scores, in row order (rows `sampled` on). */
  readonly promptTargets: readonly number[];
  /** `[rows]`: top log-probabilities asked per row (0: none). */
  readonly topCounts: readonly number[];
  /** Some row asked for top log-probabilities (their regions were read back). */
  readonly anyTop: boolean;
}

/**
 * Decodes a read-back ring slot: `bytes` holds `bufs.readbackBytes(plan.anyTop, plan.rows)`
 * bytes from the start of the slot the step was encoded into; `vocab` bounds a row's top count.
 */
export function readSampledRows(
  bytes: ArrayBuffer,
  bufs: StepBuffers,
  plan: SampledLayout,
  vocab: number,
): SampledRows {
  const { rows, sampled, topCounts } = plan;
  const tokens = new Uint32Array(bytes, 0, rows);
  const logprobs = new Float32Array(bytes, bufs.logprobsOffset, rows);
  const top = plan.anyTop ? readTop(bytes, bufs, topCounts, vocab) : topCounts.map(() => []);
  // A scored row's "token" is the target's rank (kernels/sample.ts).
  const prompt = plan.promptTargets.map((tokenId, j) => ({
    tokenId,
    logprob: logprobs[sampled + j]!,
    rank: tokens[sampled + j]!,
    top: top[sampled + j]!,
  }));
  return {
    tokens: tokens.subarray(0, sampled),
    logprobs: logprobs.subarray(0, sampled),
    top: top.slice(0, sampled),
    prompt,
  };
}

/** Decodes the top-logprob regions of a read-back ring slot. */
function readTop(
  bytes: ArrayBuffer,
  bufs: StepBuffers,
  counts: readonly number[],
  vocab: number,
): TopLogprob[][] {
  const ids = new Uint32Array(bytes, bufs.topIdsOffset, counts.length * TOP_LOGPROBS_MAX);
  const lps = new Float32Array(bytes, bufs.topLogprobsOffset, counts.length * TOP_LOGPROBS_MAX);
  return counts.map((c, row) =>
    Array.from({ length: Math.min(c, vocab) }, (_, j) => ({
      tokenId: ids[row * TOP_LOGPROBS_MAX + j]!,
      logprob: lps[row * TOP_LOGPROBS_MAX + j]!,
    }))
  );
}
