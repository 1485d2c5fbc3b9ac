/**
 * The sampling stage of a step, after the model's forward pass: the LM head over the sampled
 * rows only (and the scored prompt positions), then `token_mask` on the rows of
 * grammar-constrained sequences (structured outputs; only when some row has a mask), then for
 * those rows `top_logprobs` on the raw logits (only when some row asks for top logprobs),
 * `logits_process` in place (only when some row has a penalty or a logit bias), and GPU sampling
 * into the step's slot of the sampled-token ring ({@linkcode StepBuffers.sampled}).
 *
 * The logits hold `maxSeqs` rows; a step with more rows (scored prompt positions, up to
 * `maxRows`) runs the LM head, `top_logprobs` and `sample` once per sub-batch of `maxSeqs` rows,
 * each sub-batch's logits overwriting the last's (the step's pass orders them); the sampled rows,
 * at most `maxSeqs` and first, all fall in the first sub-batch, which alone has token masks and
 * logits processing.
 *
 * Every call site is bound once, at construction; {@linkcode Sampler.prepare} packs and uploads
 * one step's per-row records, {@linkcode Sampler.encode} dispatches, {@linkcode Sampler.read}
 * decodes the read-back slot (engine/sampled_rows.ts). The model runner owns the pass, the
 * submission and the readback. The logits-processing records, the penalty histories kept on the
 * GPU per sequence, and their bounds, live in {@linkcode LogitsProcessLists}
 * (logits_process_lists.ts).
 *
 * @module
 */

import { KERNEL_GROUPS, type StepPasses } from "./models/step_passes.ts";
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import type { GpuMatrix } from "../gpu/tensor.ts";
import type { SequenceChunk } from "./forward_batch.ts";
import {
  LogitsProcessLists,
  type PenaltyHistorySlots,
  type ProcessRow,
} from "./logits_process_lists.ts";
import type { KernelSet } from "./models/kernel_set.ts";
import type { StepBuffers } from "./step_buffers.ts";
import type { LogitsProcessOp } from "../kernels/logits_process.ts";
import {
  packSampleParams,
  SAMPLE_PARAMS_BYTES,
  type SampleOp,
  type SampleParams,
} from "../kernels/sample.ts";
import {
  packTopLogprobCounts,
  TOP_LOGPROBS_MAX,
  TopLogprobs,
  type TopLogprobsOp,
} from "../kernels/top_logprobs.ts";
import type { MatmulOp } from "../kernels/matmul.ts";
import { maskWords, type TokenMaskOp } from "../kernels/token_mask.ts";
import { STORAGE_RW } from "../gpu/context.ts";
import type { StagedWrites } from "../gpu/staged_writes.ts";
import { readSampledRows, type SampledLayout, type SampledRows } from "./sampled_rows.ts";

/** Sizes fixed at load time. */
export interface SamplerLimits {
  /** Most sequences in one step (max_num_seqs): the logits' rows. */
  readonly maxSeqs: number;
  /**
   * Most rows in one step, sampled and scored (`StepBuffers.maxRows`, at least `maxSeqs`; more
   * only where {@linkcode samplerRowsFor} allows).
   */
  readonly maxRows: number;
  /** Longest sequence, prompt and output (max_model_len). */
  readonly maxModelLen: number;
  /** Vocabulary size (columns of the logits). */
  readonly vocab: number;
}

/**
 * What one step samples, packed and uploaded by {@linkcode Sampler.prepare}: the rows and what
 * their read-back slot holds ({@linkcode SampledLayout}), and what the step dispatches for them.
 */
export interface SamplingPlan extends SampledLayout {
  /** The `logits_process` op to encode, or null when no row has a penalty or a bias. */
  readonly process: LogitsProcessOp | null;
  /** Rows with a grammar mask (structured outputs); 0: no `token_mask` dispatch. */
  readonly masked: number;
}

/** The LM head and sampling call sites of one model runner (see the module doc). */
export class Sampler {
  readonly ctx: GpuContext;
  readonly limits: SamplerLimits;
  readonly #bufs: StepBuffers;
  /** One per sub-batch of `maxSeqs` rows: X is that sub-batch's rows of `bufs.lastNormed`. */
  readonly #lmHead: MatmulOp[];
  /** `[ring slot][sub-batch]`. */
  readonly #sample: SampleOp[][];
  /** `[ring slot][sub-batch]`. */
  readonly #top: TopLogprobsOp[][];
  readonly #lists: LogitsProcessLists;
  readonly #mask: TokenMaskOp;
  /** u32 `[maxSeqs, maskWords(vocab)]` grammar masks, then u32 `[maxSeqs]` their rows. */
  readonly #maskBuffers: { readonly masks: GPUBuffer; readonly rows: GPUBuffer };
  readonly #host: {
    /** u32 `[maxRows]`: token index of each row. */
    sampleIndices: Uint32Array<ArrayBuffer>;
    /** `[maxRows]` records of SAMPLE_PARAMS_BYTES bytes. */
    sampleParams: ArrayBuffer;
    /** u32 `[maxRows]`: top log-probabilities per row. */
    topCounts: Uint32Array<ArrayBuffer>;
    /** u32 `[maxSeqs, maskWords(vocab)]`: the step's grammar masks, packed. */
    masks: Uint32Array<ArrayBuffer>;
    /** u32 `[maxSeqs]`: the row of each packed mask. */
    maskRows: Uint32Array<ArrayBuffer>;
  };

  /**
   * Binds the LM head (`bufs.lastNormed` x `lmHead` -> `bufs.logits`) per sub-batch of rows, a
   * `sample` and a `top_logprobs` per ring slot of `bufs.sampled` and sub-batch;
   * `logits_process` is bound on the first step that needs it.
   *
   * @param lmHead `[vocab, hidden]` weight (f16 or f32) of the LM head.
   * @throws {RangeError} when `limits.maxRows` exceeds what {@linkcode samplerRowsFor} allows.
   */
  constructor(
    ctx: GpuContext,
    kernels: KernelSet,
    arena: ParamArena,
    bufs: StepBuffers,
    lmHead: GpuMatrix,
    limits: SamplerLimits,
  ) {
    const hidden = lmHead.cols;
    const allowed = samplerRowsFor(limits.maxSeqs, hidden, limits.maxRows);
    if (allowed !== limits.maxRows || bufs.maxRows !== limits.maxRows) {
      throw new RangeError(
        `Cannot sample ${limits.maxRows} rows per step in sub-batches of ${limits.maxSeqs} ` +
          `(hidden size ${hidden}, step buffers of ${bufs.maxRows} rows): at most ${allowed}`,
      );
    }
    this.ctx = ctx;
    this.limits = limits;
    this.#bufs = bufs;
    const b = (buffer: GPUBuffer) => ({ buffer });
    const C = limits.maxSeqs;
    const subBatches = Math.ceil(limits.maxRows / C);
    this.#lmHead = Array.from({ length: subBatches }, (_, k) =>
      kernels.matmul(false).bind(arena, {
        x: {
          buffer: bufs.lastNormed,
          offset: k * C * hidden * 4,
          size: Math.min(C, limits.maxRows - k * C) * hidden * 4,
        },
        weight: lmHead,
        y: b(bufs.logits),
      }));
    this.#sample = Array.from(
      { length: bufs.ringSlots },
      (_, slot) =>
        Array.from({ length: subBatches }, () =>
          kernels.sample.bind(arena, {
            logits: b(bufs.logits),
            params: b(bufs.sampleParams),
            tokens: bufs.sampledTokens(slot),
            logprobs: bufs.sampledLogprobs(slot),
          })),
    );
    const top = new TopLogprobs(ctx);
    this.#top = Array.from(
      { length: bufs.ringSlots },
      (_, slot) =>
        Array.from({ length: subBatches }, () =>
          top.bind(arena, {
            logits: b(bufs.logits),
            counts: b(bufs.topCounts),
            ids: bufs.sampledTopIds(slot),
            logprobs: bufs.sampledTopLogprobs(slot),
          })),
    );
    this.#lists = new LogitsProcessLists(ctx, arena, bufs, limits);
    const S = limits.maxSeqs;
    const R = limits.maxRows;
    const words = maskWords(limits.vocab);
    this.#maskBuffers = {
      masks: ctx.createBuffer("sampler.tokenMasks", S * words * 4, STORAGE_RW),
      rows: ctx.createBuffer("sampler.tokenMaskRows", S * 4, STORAGE_RW),
    };
    this.#mask = kernels.tokenMask.bind(arena, {
      logits: b(bufs.logits),
      masks: b(this.#maskBuffers.masks),
      rows: b(this.#maskBuffers.rows),
    });
    this.#host = {
      sampleIndices: new Uint32Array(R),
      sampleParams: new ArrayBuffer(R * SAMPLE_PARAMS_BYTES),
      topCounts: new Uint32Array(R),
      masks: new Uint32Array(S * words),
      maskRows: new Uint32Array(S),
    };
  }

  /**
   * Packs the sampled rows of a (validated) step's sequences, validating their parameters, and
   * stages into `writes` the sample indices, sampling records, top-logprob counts, token masks
   * and logits-processing records (creating the penalty histories of sequences penalised for the
   * first time). Nothing is staged when a check fails.
   *
   * @throws {RangeError} on an invalid sampling parameter, logit bias, penalty or prompt, or
   * beyond the bounds of {@linkcode LogitsProcessLists}.
   */
  prepare(seqs: readonly SequenceChunk[], writes: StagedWrites): SamplingPlan {
    const h = this.#host;
    const samples: SampleParams[] = [];
    const processes: ProcessRow[] = [];
    const topCounts: number[] = [];
    let anyTop = false;
    let tokens = 0;
    let rows = 0;
    let masked = 0;
    const words = maskWords(this.limits.vocab);
    for (const seq of seqs) {
      tokens += seq.queryLen;
      if (seq.sample !== null) {
        const mask = seq.tokenMask ?? null;
        if (mask !== null) {
          if (mask.length < words) {
            throw new RangeError(
              `Cannot sample with a token mask of ${mask.length} words: ${this.limits.vocab} tokens need ${words}`,
            );
          }
          h.masks.set(mask.subarray(0, words), masked * words);
          h.maskRows[masked++] = rows;
        }
        h.sampleIndices[rows++] = tokens - 1;
        samples.push(seq.sample);
        processes.push({
          process: seq.process ?? null,
          contextLen: seq.contextLen,
          lastIndex: tokens - 1,
        });
        const n = seq.topLogprobs ?? 0;
        topCounts.push(n);
        if (n !== 0) anyTop = true;
      }
    }
    const sampled = rows;
    const promptTargets: number[] = [];
    tokens = 0;
    for (const seq of seqs) {
      const prompt = seq.promptLogprobs ?? null;
      if (prompt !== null && prompt.targets.length > 0) {
        const n = prompt.topLogprobs;
        if (rows + prompt.targets.length > this.limits.maxRows) {
          throw new RangeError(
            `Cannot score ${prompt.targets.length} prompt tokens: the step has ${rows} of ${this.limits.maxRows} sampler rows taken`,
          );
        }
        prompt.targets.forEach((target, j) => {
          if (!Number.isInteger(target) || target < 0 || target >= this.limits.vocab) {
            throw new RangeError(
              `Cannot score prompt token ${target}: the vocabulary has ${this.limits.vocab}`,
            );
          }
          h.sampleIndices[rows++] = tokens + prompt.first + j;
          samples.push({ target });
          topCounts.push(n);
          promptTargets.push(target);
          if (n !== 0) anyTop = true;
        });
      }
      tokens += seq.queryLen;
    }
    packSampleParams(samples, h.sampleParams);
    if (anyTop) packTopLogprobCounts(topCounts, h.topCounts);
    // Packs and uploads the records (validating them) before anything else is uploaded: one per
    // sampled row (the first rows); scored rows are not processed.
    const process = sampled > 0 ? this.#lists.upload(processes, writes) : null;
    if (rows > 0) {
      const bufs = this.#bufs;
      writes.write(bufs.sampleIndices, h.sampleIndices, rows);
      writes.write(bufs.sampleParams, h.sampleParams, rows * SAMPLE_PARAMS_BYTES);
      if (anyTop) writes.write(bufs.topCounts, h.topCounts, rows);
      if (masked > 0) {
        writes.write(this.#maskBuffers.masks, h.masks, masked * words);
        writes.write(this.#maskBuffers.rows, h.maskRows, masked);
      }
    }
    return { rows, sampled, promptTargets, topCounts, anyTop, process, masked };
  }

  /**
   * Encodes the stage for a prepared step into ring slot `slot` of `bufs.sampled` (nothing when
   * no row samples), per sub-batch of `maxSeqs` rows: LM head, then raw-logit top logprobs,
   * (first sub-batch) token masks and processing in place, sampling, each into its kernel
   * group's pass (models/step_passes.ts).
   */
  encode(passes: StepPasses, plan: SamplingPlan, slot: number): void {
    const { rows } = plan;
    const vocab = this.limits.vocab;
    const C = this.limits.maxSeqs;
    for (let k = 0; k * C < rows; k++) {
      const row0 = k * C;
      const n = Math.min(C, rows - row0);
      this.#lmHead[k]!.encode(passes.at(KERNEL_GROUPS.lmHead), n);
      const pass = passes.at(KERNEL_GROUPS.sample);
      if (k === 0) this.#mask.encode(pass, plan.masked, vocab, maskWords(vocab));
      // Raw logits first (vLLM's default logprobs), then processing in place, then sampling.
      if (plan.anyTop) this.#top[slot]![k]!.encode(pass, n, vocab, TOP_LOGPROBS_MAX, row0);
      if (k === 0) plan.process?.encode(pass, plan.sampled, vocab);
      this.#sample[slot]![k]!.encode(pass, n, vocab, row0);
    }
  }

  /**
   * Decodes a read-back ring slot: `bytes` holds `bufs.readbackBytes(plan.anyTop, plan.rows)`
   * bytes from the start of the slot the step was encoded into.
   */
  read(bytes: ArrayBuffer, plan: SamplingPlan): SampledRows {
    return readSampledRows(bytes, this.#bufs, plan, this.limits.vocab);
  }

  /** The penalty histories kept on the GPU, by key (see `LogitsProcessing.history`). */
  get penaltyHistories(): PenaltyHistorySlots {
    return this.#lists.histories;
  }

  /** Releases the logits-processing lists and the mask buffers (the step buffers are the runner's). */
  destroy(): void {
    this.#lists.destroy();
    this.#maskBuffers.masks.destroy();
    this.#maskBuffers.rows.destroy();
  }
}

/**
 * The sampler rows a step may hold when `wanted` are asked for: `wanted`, at least `maxSeqs`
 * (the logits' rows), where the sub-batches of `maxSeqs` rows of `hidden`-wide LM head inputs
 * start on the 256-byte offsets a binding needs; `maxSeqs` (one sub-batch) otherwise.
 */
export function samplerRowsFor(maxSeqs: number, hidden: number, wanted: number): number {
  if (wanted <= maxSeqs || (maxSeqs * hidden * 4) % 256 !== 0) return maxSeqs;
  return wanted;
}
