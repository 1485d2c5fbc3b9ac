/**
 * The plain-data input of one forward step, as the engine builds it from the scheduler's output:
 * which sequences run, how many new tokens each, where those tokens go in the paged KV cache,
 * and which sequences sample a token. The model runner turns it into GPU buffers; it decides
 * nothing.
 *
 * Token order: the new tokens of `seqs[0]`, then those of `seqs[1]`, and so on.
 *
 * @module
 */

import type { SampleParams } from "../kernels/sample.ts";
import { FROM_SAMPLED } from "../kernels/token_feed.ts";

/** One sequence's share of a step. */
export interface SequenceChunk {
  /** New tokens computed this step (>= 1). */
  readonly queryLen: number;
  /** Tokens in the KV cache after this step, this step's included (>= queryLen). */
  readonly contextLen: number;
  /**
   * Physical KV blocks holding tokens `[j * blockSize, (j + 1) * blockSize)`, j = 0, 1, ... The
   * runner keeps tables on the GPU across steps keyed by this array (engine/block_table_rows.ts):
   * pass the same array while only appending to it, a new one when it changes otherwise.
   */
  readonly blockTable: readonly number[];
  /**
   * Sampling parameters when this step samples the sequence's next token (its last new token
   * is the last prompt token or a decode token), else `null` (a prefill chunk mid-prompt).
   */
  readonly sample: SampleParams | null;
  /**
   * Logits processing of the sampled row before `sample` (logit bias, repetition / presence /
   * frequency penalties; see {@linkcode LogitsProcessing}). Absent, `null` or all off: the row's
   * logits are sampled as computed. Only with `sample`.
   */
  readonly process?: LogitsProcessing | null;
  /**
   * Top log-probabilities (of the raw logits, before processing) to return for the sampled row,
   * 0 to TOP_LOGPROBS_MAX (20); absent or 0: none. Only with `sample`.
   */
  readonly topLogprobs?: number;
  /**
   * Structured outputs: the tokens the sequence's grammar allows next, a bitmask of
   * `ceil(vocab / 32)` u32 (bit v % 32 of word v / 32, xgrammar's layout); every other token's
   * logit becomes MASKED_LOGIT before processing and sampling. Absent or null: unconstrained.
   * Only with `sample`.
   */
  readonly tokenMask?: Uint32Array | null;
  /**
   * Prompt log-probabilities (vLLM's `prompt_logprobs`): new tokens `first`, `first + 1`, ...
   * of this chunk each score `targets[j]`, the prompt token after them (its log-softmax under
   * the raw logits at that token, its rank, and the `topLogprobs` most likely tokens there).
   * Each is one more row of the step's sampler, after every sampled row; a step holds at most
   * `maxSeqs` rows in all. Absent or null: none.
   */
  readonly promptLogprobs?: PromptLogprobRows | null;
}

/** The prompt positions of a chunk that are scored (see `SequenceChunk.promptLogprobs`). */
export interface PromptLogprobRows {
  /** Index among the chunk's new tokens of the first scored one. */
  readonly first: number;
  /** Token ids scored, one per position from `first` on (each < vocab). */
  readonly targets: readonly number[];
  /** Most likely tokens returned per position, 0 to TOP_LOGPROBS_MAX (20). */
  readonly topLogprobs: number;
}

/**
 * The logits processing of one sampled row (kernels/logits_process.ts; vLLM / OpenAI meanings).
 *
 * Penalties read the sequence's token history, which the runner keeps on the GPU for the
 * sequence's lifetime (engine/logits_process_lists.ts), under {@linkcode PenaltyHistoryKey.key}:
 * the prompt, uploaded once when the history is created, then the output tokens, appended on
 * the GPU. The row's context (positions `[0, contextLen)`) is the prompt followed by the output
 * so far, so the row has `contextLen - promptLen` output tokens before the one it samples, and
 * its last fed token, when at or past the prompt, is the newest of them: each step appends that
 * token (as resolved on the GPU) to the history. So every output token but the newest must have
 * been the last fed token of an earlier sampled row with the same key (decode steps are; so is
 * the end of a recompute after a preemption, whose earlier tokens the history kept).
 */
export interface LogitsProcessing {
  /** vLLM / HF repetition penalty over prompt and output tokens; `> 0`, default 1 = off. */
  readonly repetitionPenalty?: number;
  /** Subtracted once from every token present in the output; default 0 = off. */
  readonly presencePenalty?: number;
  /** Subtracted per occurrence of a token in the output; default 0 = off. */
  readonly frequencyPenalty?: number;
  /** `logit_bias`: (token id, bias) pairs with distinct tokens, added before the penalties. */
  readonly logitBias?: Iterable<readonly [number, number]>;
  /** The sequence's penalty history: required when a penalty is on. */
  readonly history?: PenaltyHistoryKey;
}

/** Which penalty history a row reads and grows (see {@linkcode LogitsProcessing}). */
export interface PenaltyHistoryKey {
  /**
   * Names the history (the engine: the request id). It lives until the caller frees it
   * (`ModelRunner.penaltyHistories.free(key)`), which it must when the sequence ends.
   */
  readonly key: string;
  /** The prompt's token ids: read only when the history is created (the key's first row). */
  readonly promptTokens: readonly number[];
}

/** The whole step. */
export interface ForwardBatch {
  /**
   * u32 `[numTokens]`: input token ids; an id with bit 31 set ({@linkcode FROM_SAMPLED} | j)
   * means "the token sampled in row j of the previous step", resolved on the GPU.
   */
  readonly inputIds: Uint32Array;
  /** u32 `[numTokens]`: position of each token in its sequence. */
  readonly positions: Uint32Array;
  /** u32 `[numTokens]`: KV cache slot (block * blockSize + offset) of each token. */
  readonly slotMapping: Uint32Array;
  /** The sequences, in token order. */
  readonly seqs: readonly SequenceChunk[];
}

/**
 * Checks a batch against the runner's capacity and the cache geometry.
 *
 * @throws {RangeError} naming the first inconsistency.
 */
export function validateBatch(
  batch: ForwardBatch,
  limits: { maxTokens: number; maxSeqs: number; maxBlocksPerSeq: number; blockSize: number },
): void {
  const n = batch.inputIds.length;
  if (n === 0) throw new RangeError("Cannot run an empty batch");
  if (n > limits.maxTokens) {
    throw new RangeError(
      `Cannot run ${n} tokens in one step: the runner holds ${limits.maxTokens}`,
    );
  }
  if (batch.positions.length !== n || batch.slotMapping.length !== n) {
    throw new RangeError(
      `Batch arrays disagree: ${n} ids, ${batch.positions.length} positions, ${batch.slotMapping.length} slots`,
    );
  }
  if (batch.seqs.length > limits.maxSeqs) {
    throw new RangeError(
      `Cannot run ${batch.seqs.length} sequences in one step: the runner holds ${limits.maxSeqs}`,
    );
  }
  let tokens = 0;
  batch.seqs.forEach((s, i) => {
    if (s.queryLen < 1 || s.contextLen < s.queryLen) {
      throw new RangeError(`Sequence ${i}: queryLen ${s.queryLen}, contextLen ${s.contextLen}`);
    }
    if (s.sample === null && ((s.topLogprobs ?? 0) > 0 || (s.process ?? null) !== null)) {
      throw new RangeError(`Sequence ${i}: logits processing or top logprobs without sampling`);
    }
    const prompt = s.promptLogprobs ?? null;
    if (
      prompt !== null &&
      (!(prompt.first >= 0) || prompt.first + prompt.targets.length > s.queryLen)
    ) {
      throw new RangeError(
        `Sequence ${i}: prompt logprobs of ${prompt.targets.length} tokens from token ${prompt.first} of ${s.queryLen}`,
      );
    }
    const needed = Math.ceil(s.contextLen / limits.blockSize);
    if (s.blockTable.length < needed || s.blockTable.length > limits.maxBlocksPerSeq) {
      throw new RangeError(
        `Sequence ${i}: ${s.blockTable.length} blocks for ${s.contextLen} tokens (need ${needed}, at most ${limits.maxBlocksPerSeq})`,
      );
    }
    tokens += s.queryLen;
  });
  if (tokens !== n) {
    throw new RangeError(`Sequences hold ${tokens} new tokens, the batch has ${n}`);
  }
}

export { FROM_SAMPLED };
