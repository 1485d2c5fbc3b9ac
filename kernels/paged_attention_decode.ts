/**
 * Paged attention for decode: one new query token per sequence attends to that sequence's
 * tokens in the paged KV cache (written earlier in the same pass by `reshape_and_cache`).
 *
 * Paged KV cache layout (per layer, shared with prefill attention and `reshape_and_cache`):
 * a K cache and a V cache, each `[num_blocks, num_kv_heads, block_size, head_dim]` of the KV
 * dtype (f16, f32, or fp8 codes: kernels/kv_codec.ts); element (block b, kv head h, offset o,
 * dim d) is at `((b * num_kv_heads + h) * block_size + o) * head_dim + d`; token `j` of sequence
 * `s` is in block `block_tables[s * bt_stride + floor(j / block_size)]` at offset
 * `j % block_size`.
 *
 * Two paths behind one op (`paged_attention_decode.wgsl`, `paged_attention_merge.wgsl`):
 * - direct: one workgroup per (sequence, kv head) runs the whole context with an online softmax
 *   and writes the normalised output;
 * - split-K: the context is cut into partitions of `partitionSize` tokens, one workgroup per
 *   (partition, sequence, kv head) writes a partial (max, sum, unnormalised output) into a
 *   scratch buffer, and the merge kernel combines the partials by log-sum-exp. Used when the
 *   longest context exceeds `splitThreshold` (or when forced), to give long contexts at small
 *   batch enough workgroups; or, once a measured split choice is set
 *   ({@linkcode PagedAttentionDecode.setSplitTuning}, kernels/decode_split.ts), with the
 *   partition size measured fastest for the step's batch size.
 *
 * Two kernels compute both paths (same bindings, grid and outputs): `workgroup`
 * (`paged_attention_decode.wgsl`: 64 or 256 invocations, {@linkcode DECODE_WIDTHS}, tiles of as
 * many positions shared through workgroup memory; the GPU kernel, its width chosen per step by
 * the measured split tuning) and `unrolled` (`paged_attention_decode_unrolled.wgsl`: 8
 * invocations each taking every 8th position with queries and outputs in named registers, one
 * barrier; the default on CPU adapters such as lavapipe, where barriers are coroutine switches,
 * when `GROUP * headDim <= 512`). Measured on lavapipe: see docs/benchmarks.md.
 *
 * A fused variant of either kernel (`rope` in the config; all-decode steps) also does
 * `rope_and_cache`'s work for the step's new tokens (q/k head norms, RoPE, the K/V cache write;
 * `paged_attention_decode_rope.wgsl`), so a layer's decode step has one dispatch less: its op
 * encodes either variant ({@linkcode PagedAttentionDecodeOp.encode}'s `fused`).
 *
 * Restrictions: `headDim` a multiple of 4 and at most 256; `numQHeads / numKvHeads` an integer
 * from 1 to 8; `qStride` a multiple of 4; `partitionSize` a multiple of 16. One pipeline is
 * compiled per (kernel, KV dtype, GQA group, headDim).
 *
 * @module
 */

import decodeIo from "./paged_attention_decode_io.wgsl" with { type: "text" };
import decodeSource from "./paged_attention_decode.wgsl" with { type: "text" };
import mergeSource from "./paged_attention_merge.wgsl" with { type: "text" };
import unrolledSource from "./paged_attention_decode_unrolled.wgsl" with { type: "text" };
import {
  type DecodeRopeConfig,
  type PagedAttentionDecodeRopeBuffers,
  ROPE_PROLOGUE_SOURCES,
  ropeEntries,
  ropePrologueSource,
  UNROLLED_ROPE_STAGING,
  unrolledFusedBytes,
  unrolledFusedFits,
} from "./paged_attention_decode_rope.ts";
import { unrollTemplate } from "./unroll.ts";
import { KV_CODEC_SOURCES, kvLoad8Prelude, kvStageDtype, kvVec4Prelude } from "./kv_codec.ts";
import { type GpuContext, STORAGE_RW } from "../gpu/context.ts";
import type { KvDtype } from "../gpu/dtype.ts";
import type { ParamArena } from "../gpu/params.ts";
import { sourceDigest } from "./source_digest.ts";
import {
  checkDecodeSplitTuning,
  DECODE_WIDTHS,
  type DecodeSplitTuning,
  DEFAULT_DECODE_WIDTH,
  SPLIT_UNIT,
} from "./decode_split.ts";
import {
  LARGE_BATCH_CONTEXT,
  PagedAttentionDecodeOp,
  PagedAttentionScratch,
  SHORT_SPLIT_CONTEXT,
  SMALL_BATCH_SPLIT,
} from "./paged_attention_decode_op.ts";

import {
  checkDecodeShape,
  DEFAULT_SPLIT_THRESHOLD,
  defaultDecodeVariant,
  MAX_UNROLLED_GROUP_DIM,
  type PagedAttentionDecodeBuffers,
  type PagedAttentionDecodeConfig,
  type PagedAttentionDecodeLayout,
  type PagedAttentionDecodeVariant,
  unrolledShapeFits,
} from "./paged_attention_decode_config.ts";

export { PagedAttentionDecodeOp, PagedAttentionScratch, SHORT_SPLIT_CONTEXT, SMALL_BATCH_SPLIT };

export type { DecodeRopeConfig, PagedAttentionDecodeRopeBuffers };
export { unrolledFusedBytes, unrolledFusedFits };

/** A digest of the decode attention's WGSL: a cached split choice is re-measured once it changes. */
export const ATTENTION_SOURCES_DIGEST: string = sourceDigest(
  decodeIo,
  decodeSource,
  mergeSource,
  unrolledSource,
  ...ROPE_PROLOGUE_SOURCES,
  ...KV_CODEC_SOURCES,
);

/**
 * Bytes of workgroup memory the `workgroup` kernel declares at `width` invocations
 * (paged_attention_decode.wgsl, with the fused prologue's arrays in
 * paged_attention_decode_rope.wgsl).
 */
export function workgroupKernelBytes(
  group: number,
  headDim: number,
  width: number,
  fused: boolean,
): number {
  const maxGroup = 8;
  return 16 * group * 64 + 4 * headDim + 4 * group * width + 4 * maxGroup + 8 * width +
    4 * maxGroup + 16 * width + 4 * width + 4 + (fused ? 4 * (maxGroup + 1) * 9 : 0);
}

/** A call site's bound pipelines at one width: the kernel, and its fused variant or null. */
export interface DecodeSites {
  readonly decode: { readonly pipeline: GPUComputePipeline; readonly group: GPUBindGroup };
  readonly fused: { readonly pipeline: GPUComputePipeline; readonly group: GPUBindGroup } | null;
}

/** Partials an invocation of the merge kernel loads together (paged_attention_merge.wgsl). */
const MERGE_UNROLL = 8;

/**
 * Loads an invocation of the `workgroup` kernel issues together (paged_attention_decode.wgsl
 * UNROLL_K, UNROLL_V): key-row vec4s for its scores, and V vec4s for its outputs, `pairs` of them
 * per position (so UNROLL_V positions, at least 2).
 */
function decodeUnroll(pairs: number): { readonly k: number; readonly v: number } {
  return { k: 8, v: Math.max(2, Math.floor(8 / pairs)) };
}

/** The cache bindings 1 and 2 of both kernels (`array<KVT>`), read or read_write. */
function kvBindings(access: "read" | "read_write"): string {
  return `@group(0) @binding(1) var<storage, ${access}> k_cache: array<KVT>;\n` +
    `@group(0) @binding(2) var<storage, ${access}> v_cache: array<KVT>;\n`;
}

/** A kernel's prologue when it is not fused: none. */
const UNFUSED = "const FUSED: bool = false;\n" +
  "fn rope_prologue(seq: u32, kvh: u32, head0: u32, lid: u32, owner: bool) {}\n";

/** The compiled decode-attention and merge pipelines for one model shape and KV dtype. */
export class PagedAttentionDecode {
  readonly numQHeads: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly blockSize: number;
  readonly dtype: KvDtype;
  readonly scale: number;
  readonly partitionSize: number;
  readonly splitThreshold: number;
  /** The kernel in use. */
  readonly variant: PagedAttentionDecodeVariant;
  /** The fused variant's shape, or null when it was not compiled. */
  readonly rope: DecodeRopeConfig | null;
  /**
   * The workgroup widths this kernel runs ({@linkcode DECODE_WIDTHS} that fit the adapter's
   * workgroup limits; the `unrolled` kernel has its own, named here as the default).
   */
  readonly widths: readonly number[];
  readonly #ctx: GpuContext;
  /** The kernel and its fused variant at each width, compiled on first use. */
  readonly #pipelines: (width: number) => {
    decode: GPUComputePipeline;
    fused: GPUComputePipeline | null;
  };
  readonly #merge: GPUComputePipeline;
  #splitTuning: DecodeSplitTuning | null = null;

  /** @throws {RangeError} when the shape is outside the restrictions in the module doc. */
  constructor(ctx: GpuContext, config: PagedAttentionDecodeConfig) {
    const { numQHeads, numKvHeads, headDim, blockSize } = config;
    const group = numQHeads / numKvHeads;
    const partitionSize = checkDecodeShape(config);
    this.#ctx = ctx;
    this.numQHeads = numQHeads;
    this.numKvHeads = numKvHeads;
    this.headDim = headDim;
    this.blockSize = blockSize;
    this.dtype = config.dtype ?? ctx.weightDtype;
    this.scale = config.scale ?? 1 / Math.sqrt(headDim);
    this.partitionSize = partitionSize;
    this.splitThreshold = config.splitThreshold ?? DEFAULT_SPLIT_THRESHOLD;
    const dtype = this.dtype;
    const unrolledFits = unrolledShapeFits(group, headDim);
    this.variant = config.variant ?? defaultDecodeVariant(ctx, group, headDim);
    if (this.variant === "unrolled" && !unrolledFits) {
      throw new RangeError(
        `Cannot create unrolled paged attention: GROUP ${group} x headDim ${headDim} must be ` +
          `at most ${MAX_UNROLLED_GROUP_DIM} with headDim a multiple of 8`,
      );
    }
    if (
      config.rope !== undefined && this.variant === "unrolled" &&
      !unrolledFusedFits(ctx, group, headDim)
    ) {
      throw new RangeError(
        `Cannot create fused unrolled paged attention: GROUP ${group} x headDim ${headDim} needs ` +
          `${unrolledFusedBytes(group, headDim)} bytes of workgroup memory, the adapter has ` +
          `${ctx.limits.maxComputeWorkgroupStorageSize}`,
      );
    }
    this.rope = config.rope ?? null;
    const workgroup = (fused: string, width: number) => {
      const pairs = Math.ceil((group * headDim) / 4 / width);
      const unroll = decodeUnroll(pairs);
      return kvVec4Prelude(ctx, dtype) + decodeIo +
        `const GROUP = ${group}u;\nconst HEAD_DIM = ${headDim}u;\nconst WG = ${width}u;\n` +
        `const UNROLL_K = ${unroll.k}u;\nconst UNROLL_V = ${unroll.v}u;\n` + fused +
        unrollTemplate(decodeSource, { i: group, r: pairs, c: unroll.v, w: unroll.k });
    };
    const unrolled = (fused: string) =>
      kvLoad8Prelude(ctx, dtype) + decodeIo +
      `const GROUP = ${group}u;\nconst HEAD_DIM = ${headDim}u;\nconst D4 = ${headDim / 4}u;\n` +
      `const D8 = ${headDim / 8}u;\n` + fused +
      unrollTemplate(unrolledSource, { i: group, r: headDim / 8 });
    const normDtype = this.rope?.normDtype ?? null;
    // `enable f16` comes with an f16 stage dtype (kv_codec.ts); an f16 norm beside another adds it.
    const f16Norm = normDtype === "f16" && kvStageDtype(ctx, dtype) !== "f16"
      ? "enable f16;\n"
      : "";
    const variant = this.variant;
    const rope = this.rope;
    const limits = ctx.limits;
    this.widths = variant === "unrolled"
      ? [DEFAULT_DECODE_WIDTH]
      : DECODE_WIDTHS.filter((w) =>
        w === DEFAULT_DECODE_WIDTH ||
        (w <= limits.maxComputeInvocationsPerWorkgroup && w <= limits.maxComputeWorkgroupSizeX &&
          workgroupKernelBytes(group, headDim, w, rope !== null) <=
            limits.maxComputeWorkgroupStorageSize)
      );
    // Widths other than the default in the pipeline keys (the default's keys are unchanged).
    const tag = (width: number) => (width === DEFAULT_DECODE_WIDTH ? "" : `/w${width}`);
    this.#pipelines = (width) => {
      if (!this.widths.includes(width)) {
        throw new RangeError(
          `Cannot encode paged attention at width ${width}: this ${variant} kernel runs ` +
            `${this.widths.join(", ")}`,
        );
      }
      const decode = variant === "unrolled"
        ? ctx.pipeline(
          `paged_attention_decode_unrolled/${dtype}/group${group}/d${headDim}`,
          () => unrolled(kvBindings("read") + UNFUSED),
        )
        : ctx.pipeline(
          `paged_attention_decode/${dtype}/group${group}/d${headDim}${tag(width)}`,
          () => workgroup(kvBindings("read") + UNFUSED, width),
        );
      const fused = rope === null ? null : ctx.pipeline(
        `paged_attention_decode_rope/${variant}/${dtype}/group${group}/d${headDim}/norm-${normDtype}` +
          tag(width),
        () =>
          f16Norm + (variant === "unrolled"
            ? unrolled(
              kvBindings("read_write") + UNROLLED_ROPE_STAGING +
                ropePrologueSource(normDtype, dtype === "f32" ? "vec4" : `${dtype}x8`),
            )
            : workgroup(kvBindings("read_write") + ropePrologueSource(normDtype), width)),
      );
      return { decode, fused };
    };
    // The default width compiled now, as before; others when a tuning or an encode asks.
    this.#pipelines(DEFAULT_DECODE_WIDTH);
    this.#merge = ctx.pipeline(
      "paged_attention_merge",
      () =>
        `const UNROLL = ${MERGE_UNROLL}u;\n` +
        unrollTemplate(mergeSource, { i: 1, r: 1, c: MERGE_UNROLL }),
    );
  }

  /**
   * Allocates split-K scratch for up to `maxNumSeqs` sequences of up to `maxContextLen` tokens
   * (see {@linkcode PagedAttentionScratch} for sizes).
   *
   * @throws {RangeError} when a scratch buffer would exceed one storage binding; use a larger
   * `partitionSize` then.
   */
  createScratch(maxNumSeqs: number, maxContextLen: number): PagedAttentionScratch {
    const maxPartitions = Math.max(1, Math.ceil(maxContextLen / this.partitionSize));
    const base = Math.max(
      maxNumSeqs * maxPartitions,
      Math.min(maxNumSeqs, SMALL_BATCH_SPLIT) * Math.max(1, Math.ceil(maxContextLen / 64)),
      Math.min(maxNumSeqs, SMALL_BATCH_SPLIT) *
        Math.max(1, Math.ceil(Math.min(maxContextLen, SHORT_SPLIT_CONTEXT) / SPLIT_UNIT)),
    );
    // Every batch's 64-token partitions up to LARGE_BATCH_CONTEXT, where one binding holds them.
    const large = maxNumSeqs *
      Math.max(1, Math.ceil(Math.min(maxContextLen, LARGE_BATCH_CONTEXT) / 64));
    const bytesOf = (n: number) => n * this.numQHeads * this.headDim * 4;
    const pairs = large > base && bytesOf(large) <= this.#ctx.maxBindingBytes ? large : base;
    const rows = pairs * this.numQHeads;
    const outBytes = rows * this.headDim * 4;
    if (outBytes > this.#ctx.maxBindingBytes) {
      throw new RangeError(
        `Cannot create paged attention scratch: ${pairs} (sequence, partition) partials need ` +
          `${outBytes} bytes, one binding holds ${this.#ctx.maxBindingBytes}`,
      );
    }
    return new PagedAttentionScratch(
      this.#ctx.createBuffer("paged_attention/part_out", outBytes, STORAGE_RW),
      this.#ctx.createBuffer("paged_attention/part_ml", rows * 8, STORAGE_RW),
      maxNumSeqs,
      maxPartitions,
      this.partitionSize,
      pairs,
    );
  }

  /**
   * Follows measured split choices per batch size (kernels/decode_split.ts) from now on; null
   * returns to the default rule (split above `splitThreshold` tokens, partitions of
   * `partitionSize`, the default width).
   *
   * @throws {TypeError} when `tuning` is invalid or names a width this kernel does not run.
   */
  setSplitTuning(tuning: DecodeSplitTuning | null): void {
    if (tuning !== null) {
      checkDecodeSplitTuning(tuning, this.widths);
      // Its widths compiled now rather than inside a step.
      for (const c of [tuning, ...(tuning.shorter ?? [])]) {
        for (const width of Object.values(c.widthByBatch ?? {})) this.#pipelines(width);
      }
    }
    this.#splitTuning = tuning;
  }

  /**
   * The kernel and fused pipelines at `width` (one of {@linkcode widths}), compiled on first use.
   *
   * @throws {RangeError} at a width this kernel does not run.
   */
  pipelinesAt(width: number): { decode: GPUComputePipeline; fused: GPUComputePipeline | null } {
    return this.#pipelines(width);
  }

  /** The measured split choices in use, or null (the default rule). */
  get splitTuning(): DecodeSplitTuning | null {
    return this.#splitTuning;
  }

  /**
   * Creates a call site: its two parameter slots and the default width's bind groups are made
   * here, another width's bind groups when a step first runs it.
   *
   * @throws {RangeError} on strides that do not fit the shape, or a scratch made by a kernel
   * with another partition size.
   */
  bind(
    arena: ParamArena,
    buffers: PagedAttentionDecodeBuffers,
    layout: PagedAttentionDecodeLayout,
  ): PagedAttentionDecodeOp {
    const { qStride, btStride } = layout;
    const qWidth = this.numQHeads * this.headDim;
    if (!Number.isInteger(qStride) || qStride % 4 !== 0 || qStride < qWidth) {
      throw new RangeError(
        `Cannot bind paged attention: qStride ${qStride} must be a multiple of 4 and >= ${qWidth}`,
      );
    }
    if (!Number.isInteger(btStride) || btStride < 1) {
      throw new RangeError(`Cannot bind paged attention: btStride ${btStride} must be >= 1`);
    }
    const { scratch } = buffers;
    if (scratch.partitionSize !== this.partitionSize) {
      throw new RangeError(
        `Cannot bind paged attention: scratch has partitions of ${scratch.partitionSize} ` +
          `tokens, the kernel uses ${this.partitionSize}`,
      );
    }
    // Checked before any parameter slot is taken, so a refused bind leaks none.
    const ropeBindings = this.rope !== null && buffers.rope !== undefined
      ? ropeEntries(buffers.rope, this.rope!.normDtype, this.headDim)
      : null;
    const device = this.#ctx.device;
    const slot = arena.allocate();
    slot.setU32(0, this.numQHeads, this.numKvHeads, this.blockSize, btStride, qStride);
    slot.setU32(5, this.partitionSize, scratch.maxPartitions, 0);
    slot.setF32(8, this.scale, this.rope?.eps ?? 1e-6);
    const entries: GPUBindGroupEntry[] = [
      { binding: 0, resource: buffers.q },
      { binding: 1, resource: buffers.kCache },
      { binding: 2, resource: buffers.vCache },
      { binding: 3, resource: buffers.blockTables },
      { binding: 4, resource: buffers.contextLens },
      { binding: 5, resource: buffers.out },
      { binding: 6, resource: { buffer: scratch.partOut } },
      { binding: 7, resource: { buffer: scratch.partMl } },
      { binding: 8, resource: slot.binding },
    ];
    const mergeSlot = arena.allocate();
    mergeSlot.setU32(1, this.numQHeads, this.headDim, this.partitionSize, scratch.maxPartitions);
    const mergeGroup = device.createBindGroup({
      label: "paged_attention_merge",
      layout: this.#merge.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: buffers.contextLens },
        { binding: 1, resource: { buffer: scratch.partOut } },
        { binding: 2, resource: { buffer: scratch.partMl } },
        { binding: 3, resource: buffers.out },
        { binding: 4, resource: mergeSlot.binding },
      ],
    });
    /** The bind groups of `width`'s pipelines (each "auto" layout takes its own groups). */
    const sitesAt = (width: number): DecodeSites => {
      const pipelines = this.#pipelines(width);
      const group = (label: string, pipeline: GPUComputePipeline, all: GPUBindGroupEntry[]) =>
        device.createBindGroup({ label, layout: pipeline.getBindGroupLayout(0), entries: all });
      return {
        decode: {
          pipeline: pipelines.decode,
          group: group("paged_attention_decode", pipelines.decode, entries),
        },
        fused: pipelines.fused !== null && ropeBindings !== null
          ? {
            pipeline: pipelines.fused,
            group: group("paged_attention_decode_rope", pipelines.fused, [
              ...entries,
              ...ropeBindings,
            ]),
          }
          : null,
      };
    };
    return new PagedAttentionDecodeOp(
      this,
      sitesAt,
      { pipeline: this.#merge, group: mergeGroup },
      { decode: slot, merge: mergeSlot },
      scratch,
      btStride,
    );
  }
}
