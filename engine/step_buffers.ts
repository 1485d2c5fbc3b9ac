/**
 * Every GPU buffer a forward step uses besides the weights and the KV cache, allocated once at
 * start-up for the largest step the runner accepts (`maxTokens` new tokens over `maxSeqs`
 * sequences). Bind groups point at these buffers, so they are created once too.
 *
 * @module
 */

import { blockTableEntries } from "./block_table_rows.ts";
import { type GpuContext, STORAGE_RW } from "../gpu/context.ts";
import { LOGITS_PROCESS_PARAMS_BYTES } from "../kernels/logits_process.ts";
import { normPartialsPerRow } from "../kernels/matmul_bindings.ts";
import { SAMPLE_PARAMS_BYTES } from "../kernels/sample.ts";
import { TOP_LOGPROBS_MAX } from "../kernels/top_logprobs.ts";

/** Sizes the buffers are allocated for. */
export interface StepCapacity {
  /** Largest number of new tokens in one step (max_num_batched_tokens). */
  readonly maxTokens: number;
  /** Largest number of sequences in one step (max_num_seqs); the logits' rows. */
  readonly maxSeqs: number;
  /**
   * Largest number of sampler rows in one step, sampled tokens and scored prompt positions
   * together: at least `maxSeqs` (the default). Rows past `maxSeqs` go through the LM head and
   * sampling in sub-batches of `maxSeqs` rows of the logits (engine/sampler.ts).
   */
  readonly maxRows?: number;
  /** Block-table entries per sequence (ceil(max_model_len / block_size)). */
  readonly maxBlocksPerSeq: number;
}

/** Model widths the activations need. */
export interface ActivationWidths {
  readonly hidden: number;
  /** Width of the fused projection output `[q | k | v]`. */
  readonly qkv: number;
  /** Width of the attention output (numHeads * headDim). */
  readonly attn: number;
  /** Width of the MLP's widest activation (2 * intermediate for SwiGLU, intermediate for GPT-2). */
  readonly mlp: number;
  readonly vocab: number;
}

const ALIGN = 256;
const align = (n: number) => Math.ceil(n / ALIGN) * ALIGN;

/** Sampled-token ring slots unless a runner asks for more steps in flight (7 in flight). */
export const DEFAULT_RING_SLOTS = 8;

/** The step's metadata, activations and outputs. Shapes are the maxima; dtypes in the names. */
export class StepBuffers {
  readonly capacity: StepCapacity;
  /** Sampler rows per step (`capacity.maxRows`, default `maxSeqs`): the rows below sized so. */
  readonly maxRows: number;
  /** u32 `[maxTokens]`: ids as written by the host (bit 31 = previous step's sample row). */
  readonly hostIds: GPUBuffer;
  /** u32 `[maxTokens]`: resolved input ids. */
  readonly ids: GPUBuffer;
  /** u32 `[maxTokens]`: token positions. */
  readonly positions: GPUBuffer;
  /** u32 `[maxTokens]`: KV cache slot of each new token. */
  readonly slotMapping: GPUBuffer;
  /**
   * u32 `[maxSeqs + 2 maxSeqs * maxBlocksPerSeq]`: block tables as indexed rows (a header of row
   * offsets, then rows kept across steps; engine/block_table_rows.ts).
   */
  readonly blockTables: GPUBuffer;
  /** u32 `[maxSeqs]`: cached tokens per sequence after this step. */
  readonly contextLens: GPUBuffer;
  /** u32 `[maxSeqs + 1]`: prefix sums of new tokens per sequence. */
  readonly cuQLens: GPUBuffer;
  /** u32 `[maxRows]`: token index of each sampler row. */
  readonly sampleIndices: GPUBuffer;
  /** `[maxRows]` sampling records of SAMPLE_PARAMS_BYTES bytes. */
  readonly sampleParams: GPUBuffer;
  /** `[maxSeqs]` logits-processing records of LOGITS_PROCESS_PARAMS_BYTES bytes. */
  readonly processParams: GPUBuffer;
  /** u32 `[maxRows]`: top log-probabilities wanted per sampler row (0 to TOP_LOGPROBS_MAX). */
  readonly topCounts: GPUBuffer;
  /** f32 `[maxTokens, hidden]`: the residual stream. */
  readonly hidden: GPUBuffer;
  /**
   * f32 `[maxTokens, hidden]`: normalised hidden states (input of projections); or, where the
   * projections normalise their input themselves (matmul X form `rms_residual`, the gpu kernel
   * profile), the residual stream's second buffer (the stream alternates with `hidden`); or,
   * where o and down end their sub-layer with the residual epilogue (matmul Y form
   * `residual_rms`, the cpu kernel profile), `h * gamma`, not yet scaled by the norm's factor.
   */
  readonly normed: GPUBuffer;
  /**
   * f32 `[maxTokens, ceil(hidden / NORM_PARTIAL_ROWS)]`: the residual epilogue's sums of squares
   * of the stream per row, in blocks of columns (kernels/matmul_bindings.ts), read by the next
   * projection (X form `rms_partials`).
   */
  readonly normPartials: GPUBuffer;
  /** f32 `[maxTokens, hidden]`: a sub-layer's output before it is added to the residual. */
  readonly delta: GPUBuffer;
  /** f32 `[maxTokens, qkv]`: fused q, k, v projections. */
  readonly qkv: GPUBuffer;
  /** f32 `[maxTokens, attn]`: attention output. */
  readonly attnOut: GPUBuffer;
  /**
   * f32 `[maxTokens, mlp]`: MLP up-projection (SwiGLU: gate then up, read by the down
   * projection as `silu(gate) * up`).
   */
  readonly mlpUp: GPUBuffer;
  /** f32 `[maxRows, hidden]`: hidden state of each sampler row. */
  readonly lastHidden: GPUBuffer;
  /** f32 `[maxRows, hidden]`: the same after the final norm. */
  readonly lastNormed: GPUBuffer;
  /** f32 `[maxSeqs, vocab]`: logits of the sampler rows (a sub-batch of them at a time). */
  readonly logits: GPUBuffer;
  /**
   * The sampler's output, a ring of {@linkcode StepBuffers.ringSlots} slots (step n writes slot
   * n mod ringSlots, so steps in flight do not overwrite samples a later step still feeds on).
   * Slot i starts at byte `i * slotStride`; every region starts 256-byte aligned:
   *
   * | byte of the slot     | contents                                                      |
   * | -------------------- | ------------------------------------------------------------- |
   * | 0                    | u32 `[maxRows]`: sampled token ids (scored rows: ranks)       |
   * | `logprobsOffset`     | f32 `[maxRows]`: their logprobs                               |
   * | `topIdsOffset`       | u32 `[maxRows, TOP_LOGPROBS_MAX]`: top-logprob token ids      |
   * | `topLogprobsOffset`  | f32 `[maxRows, TOP_LOGPROBS_MAX]`: their logprobs             |
   */
  readonly sampled: GPUBuffer;
  readonly ringSlots: number;
  readonly slotStride: number;
  readonly logprobsOffset: number;
  readonly topIdsOffset: number;
  readonly topLogprobsOffset: number;
  readonly #all: GPUBuffer[] = [];

  constructor(
    ctx: GpuContext,
    capacity: StepCapacity,
    widths: ActivationWidths,
    ringSlots = DEFAULT_RING_SLOTS,
  ) {
    this.capacity = capacity;
    const { maxTokens: T, maxSeqs: S, maxBlocksPerSeq: B } = capacity;
    const R = capacity.maxRows ?? S;
    if (!Number.isInteger(R) || R < S) {
      throw new RangeError(`Cannot allocate ${R} sampler rows: at least max_num_seqs (${S})`);
    }
    this.maxRows = R;
    const make = (label: string, bytes: number, usage = STORAGE_RW) => {
      if (bytes > ctx.maxBindingBytes) {
        throw new RangeError(
          `Cannot allocate step buffer ${label}: ${bytes} bytes exceed one binding (${ctx.maxBindingBytes}); lower max_num_batched_tokens or max_num_seqs`,
        );
      }
      const b = ctx.createBuffer(label, bytes, usage);
      this.#all.push(b);
      return b;
    };
    this.hostIds = make("hostIds", T * 4);
    this.ids = make("ids", T * 4);
    this.positions = make("positions", T * 4);
    this.slotMapping = make("slotMapping", T * 4);
    this.blockTables = make("blockTables", blockTableEntries(S, B) * 4);
    this.contextLens = make("contextLens", S * 4);
    this.cuQLens = make("cuQLens", (S + 1) * 4);
    this.sampleIndices = make("sampleIndices", R * 4);
    this.sampleParams = make("sampleParams", R * SAMPLE_PARAMS_BYTES);
    this.processParams = make("processParams", S * LOGITS_PROCESS_PARAMS_BYTES);
    this.topCounts = make("topCounts", R * 4);
    this.hidden = make("hidden", T * widths.hidden * 4);
    // What the projections read as X may also be bound as uniform (kernels/matmul.ts
    // uniformXCapacity: the cpu profile's decode matmuls read X that way).
    const x = STORAGE_RW | GPUBufferUsage.UNIFORM;
    this.normed = make("normed", T * widths.hidden * 4, x);
    this.normPartials = make("normPartials", T * normPartialsPerRow(widths.hidden) * 4);
    this.delta = make("delta", T * widths.hidden * 4);
    this.qkv = make("qkv", T * widths.qkv * 4);
    this.attnOut = make("attnOut", T * widths.attn * 4, x);
    this.mlpUp = make("mlpUp", T * widths.mlp * 4, x);
    this.lastHidden = make("lastHidden", R * widths.hidden * 4);
    this.lastNormed = make("lastNormed", R * widths.hidden * 4, x);
    this.logits = make("logits", S * widths.vocab * 4);
    this.logprobsOffset = align(R * 4);
    this.topIdsOffset = align(this.logprobsOffset + R * 4);
    this.topLogprobsOffset = align(this.topIdsOffset + R * TOP_LOGPROBS_MAX * 4);
    this.ringSlots = ringSlots;
    this.slotStride = align(this.topLogprobsOffset + R * TOP_LOGPROBS_MAX * 4);
    this.sampled = make("sampled", this.slotStride * ringSlots);
  }

  /** The token ids of ring slot `slot` of {@linkcode StepBuffers.sampled}. */
  sampledTokens(slot: number): GPUBufferBinding {
    return {
      buffer: this.sampled,
      offset: slot * this.slotStride,
      size: this.maxRows * 4,
    };
  }

  /** The logprobs of ring slot `slot` of {@linkcode StepBuffers.sampled}. */
  sampledLogprobs(slot: number): GPUBufferBinding {
    return {
      buffer: this.sampled,
      offset: slot * this.slotStride + this.logprobsOffset,
      size: this.maxRows * 4,
    };
  }

  /** The top-logprob token ids `[maxRows, TOP_LOGPROBS_MAX]` of ring slot `slot`. */
  sampledTopIds(slot: number): GPUBufferBinding {
    return {
      buffer: this.sampled,
      offset: slot * this.slotStride + this.topIdsOffset,
      size: this.maxRows * TOP_LOGPROBS_MAX * 4,
    };
  }

  /** The top logprobs `[maxRows, TOP_LOGPROBS_MAX]` of ring slot `slot`. */
  sampledTopLogprobs(slot: number): GPUBufferBinding {
    return {
      buffer: this.sampled,
      offset: slot * this.slotStride + this.topLogprobsOffset,
      size: this.maxRows * TOP_LOGPROBS_MAX * 4,
    };
  }

  /**
   * Bytes read back per step from the start of a ring slot for its first `rows` rows (default
   * all): tokens and logprobs, and with `top` the top-logprob regions too.
   */
  readbackBytes(top = false, rows = this.maxRows): number {
    const end = top ? this.topLogprobsOffset : this.logprobsOffset;
    return end + rows * (top ? TOP_LOGPROBS_MAX : 1) * 4;
  }

  /** Releases every buffer. */
  destroy(): void {
    for (const b of this.#all) b.destroy();
  }
}
