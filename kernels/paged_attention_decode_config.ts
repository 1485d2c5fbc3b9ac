/**
 * The decode attention's shapes and bindings (kernels/paged_attention_decode.ts): the limits of
 * its kernels, the config of one model's kernel and its check, the buffers and strides of a call
 * site, and which kernel a profile runs by default.
 *
 * @module
 */

import type { GpuContext } from "../gpu/context.ts";
import type { KvDtype } from "../gpu/dtype.ts";
import { SPLIT_UNIT } from "./decode_split.ts";
import type { PagedAttentionScratch } from "./paged_attention_decode_op.ts";
import type {
  DecodeRopeConfig,
  PagedAttentionDecodeRopeBuffers,
} from "./paged_attention_decode_rope.ts";

/** Default tokens per split-K partition. */
export const DEFAULT_PARTITION_SIZE = 512;
/** Default longest context (tokens) above which the op switches to split-K. */
export const DEFAULT_SPLIT_THRESHOLD = 1024;
/** Largest supported `numQHeads / numKvHeads`. */
export const MAX_GQA_GROUP = 8;
/** Largest supported `headDim`. */
export const MAX_HEAD_DIM = 256;

/** Largest `GROUP * headDim` of the `unrolled` kernel (its workgroup memory is 16 KiB). */
export const MAX_UNROLLED_GROUP_DIM = 512;

/** Whether the `unrolled` kernel takes `group` query heads per kv head of `headDim`. */
export function unrolledShapeFits(group: number, headDim: number): boolean {
  return group * headDim <= MAX_UNROLLED_GROUP_DIM && headDim % 8 === 0;
}

/**
 * The kernel a `PagedAttentionDecode` runs by default: `unrolled` under the cpu kernel
 * profile where the shape fits it, else `workgroup`.
 */
export function defaultDecodeVariant(
  ctx: GpuContext,
  group: number,
  headDim: number,
): PagedAttentionDecodeVariant {
  return ctx.isCpuProfile && unrolledShapeFits(group, headDim) ? "unrolled" : "workgroup";
}

/** The two decode attention kernels (see kernels/paged_attention_decode.ts). */
export type PagedAttentionDecodeVariant = "workgroup" | "unrolled";

/** Model shape and tuning of a `PagedAttentionDecode` kernel. */
export interface PagedAttentionDecodeConfig {
  readonly numQHeads: number;
  /** Divides `numQHeads`; `numQHeads / numKvHeads` <= 8. */
  readonly numKvHeads: number;
  /** Multiple of 4, at most 256. */
  readonly headDim: number;
  /** Tokens per cache block. */
  readonly blockSize: number;
  /** KV cache dtype; default the context's weight dtype. */
  readonly dtype?: KvDtype;
  /** Softmax scale; default `1 / sqrt(headDim)`. */
  readonly scale?: number;
  /** Tokens per split-K partition, a multiple of 16 (`SPLIT_UNIT`); default 512. */
  readonly partitionSize?: number;
  /** Split-K is used when the longest context exceeds this many tokens; default 1024. */
  readonly splitThreshold?: number;
  /**
   * Kernel; default `unrolled` on a CPU adapter when `GROUP * headDim` <= 512 and `headDim` is
   * a multiple of 8, else `workgroup`.
   */
  readonly variant?: PagedAttentionDecodeVariant;
  /**
   * Also compile the fused variant (the `unrolled` kernel's where it fits the workgroup memory,
   * `unrolledFusedFits`): q/k head norms with weights of
   * `normDtype` (null: no norms, Llama / Qwen2), RoPE and the K/V write of the new tokens.
   */
  readonly rope?: DecodeRopeConfig;
}

/** Per-layer buffers of one decode attention call site; fixed for the op's lifetime. */
export interface PagedAttentionDecodeBuffers {
  /** f32 `[num_seqs, qStride]`: q(s, h, d) at `s * qStride + h * headDim + d`. */
  readonly q: GPUBufferBinding;
  /** KV dtype `[num_blocks, numKvHeads, blockSize, headDim]`. */
  readonly kCache: GPUBufferBinding;
  /** KV dtype, same shape as `kCache`. */
  readonly vCache: GPUBufferBinding;
  /** u32 `[num_seqs, btStride]`: physical block ids of each sequence's tokens. */
  readonly blockTables: GPUBufferBinding;
  /** u32 `[num_seqs]`: tokens of each sequence in the cache, including the new one (>= 1). */
  readonly contextLens: GPUBufferBinding;
  /** f32 `[num_seqs, numQHeads, headDim]`, contiguous. */
  readonly out: GPUBufferBinding;
  /**
   * Split-K partials, shareable by every layer's op
   * (see `PagedAttentionDecode.createScratch`).
   */
  readonly scratch: PagedAttentionScratch;
  /** The fused variant's inputs (a kernel compiled with `rope`); without them it is not bound. */
  readonly rope?: PagedAttentionDecodeRopeBuffers;
}

/** Strides of the bound buffers. */
export interface PagedAttentionDecodeLayout {
  /** f32 elements between consecutive sequences' queries; >= numQHeads * headDim, mult. of 4. */
  readonly qStride: number;
  /** u32 entries per block-table row. */
  readonly btStride: number;
}

/**
 * Checks `config`'s shape against the restrictions of the decode attention kernels and returns
 * its partition size (default {@linkcode DEFAULT_PARTITION_SIZE}).
 *
 * @throws {RangeError} when the shape is outside them (see kernels/paged_attention_decode.ts).
 */
export function checkDecodeShape(config: PagedAttentionDecodeConfig): number {
  const { numQHeads, numKvHeads, headDim, blockSize } = config;
  const group = numQHeads / numKvHeads;
  if (!Number.isInteger(group) || group < 1 || group > MAX_GQA_GROUP || numKvHeads < 1) {
    throw new RangeError(
      `Cannot create paged attention: ${numQHeads} query heads over ${numKvHeads} kv heads ` +
        `(the ratio must be an integer from 1 to ${MAX_GQA_GROUP})`,
    );
  }
  if (!Number.isInteger(headDim) || headDim < 4 || headDim % 4 !== 0 || headDim > MAX_HEAD_DIM) {
    throw new RangeError(
      `Cannot create paged attention: headDim ${headDim} must be a multiple of 4 ` +
        `from 4 to ${MAX_HEAD_DIM}`,
    );
  }
  if (!Number.isInteger(blockSize) || blockSize < 1) {
    throw new RangeError(`Cannot create paged attention: blockSize ${blockSize} must be >= 1`);
  }
  const partitionSize = config.partitionSize ?? DEFAULT_PARTITION_SIZE;
  if (
    !Number.isInteger(partitionSize) || partitionSize < SPLIT_UNIT ||
    partitionSize % SPLIT_UNIT !== 0
  ) {
    throw new RangeError(
      `Cannot create paged attention: partitionSize ${partitionSize} must be a multiple of ` +
        `${SPLIT_UNIT}`,
    );
  }
  return partitionSize;
}
