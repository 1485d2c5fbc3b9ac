/**
 * `paged_attention_prefill`: causal, varlen attention of a batch of new query tokens (packed,
 * sequence after sequence) over the paged KV cache, for prefill, chunked prefill and
 * prefix-cache hits. All keys and values, the new tokens' included, come from the cache
 * (`reshape_and_cache` runs first in the same pass). See `paged_attention_prefill.wgsl` for
 * bindings, the work split and the grid. On CPU adapters the `unrolled` kernel
 * (`paged_attention_prefill_unrolled.wgsl`, same bindings and grid, 8 query tokens per tile)
 * computes the same without barriers; measured on lavapipe in docs/benchmarks.md. The `tiled`
 * kernel (`paged_attention_prefill_tiled.wgsl`) splits each row's scores and output across
 * several invocations, flash-attention style, for GPUs, and the `blocked` kernel
 * (`paged_attention_prefill_blocked.wgsl`) does the same with register blocks of rows by keys and
 * rows by output dims (both chosen explicitly, see {@linkcode PagedAttentionPrefillConfig.variant};
 * the start-up tuning measures them, kernels/prefill_attention_tuner.ts).
 *
 * Restrictions: `headDim` a multiple of 4 and at most 256; `numQHeads` a multiple of
 * `numKvHeads` with a group of at most the workgroup size; `qStride` a multiple of 4.
 *
 * @module
 */

import prefillIo from "./paged_attention_prefill_io.wgsl" with { type: "text" };
import source from "./paged_attention_prefill.wgsl" with { type: "text" };
import unrolledSource from "./paged_attention_prefill_unrolled.wgsl" with { type: "text" };
import tiledSource from "./paged_attention_prefill_tiled.wgsl" with { type: "text" };
import blockedSource from "./paged_attention_prefill_blocked.wgsl" with { type: "text" };
import { unrollTemplate } from "./unroll.ts";
import { KV_CODEC_SOURCES, kvLoad8Prelude, kvStageDtype, kvVec4Prelude } from "./kv_codec.ts";
import type { GpuContext } from "../gpu/context.ts";
import type { KvDtype } from "../gpu/dtype.ts";
import type { ParamArena } from "../gpu/params.ts";
import { PagedAttentionPrefillOp } from "./paged_attention_prefill_op.ts";
import { sourceDigest } from "./source_digest.ts";
import {
  prefillTileRows,
  prefillTileShape,
  TILED_ROWS,
  type TiledPrefillVariant,
} from "./prefill_attention_shapes.ts";

export { PagedAttentionPrefillOp };
export {
  prefillTileRows,
  prefillTileShape,
  TILED_ROWS,
  type TiledPrefillVariant,
} from "./prefill_attention_shapes.ts";

/** Shape of the attention layer a {@linkcode PagedAttentionPrefill} is compiled for. */
export interface PagedAttentionPrefillConfig {
  /** Query heads (Hq). */
  readonly numQHeads: number;
  /** KV heads (Hkv); `numQHeads` must be a multiple. */
  readonly numKvHeads: number;
  /** Elements per head (D): a multiple of 4, at most 256. */
  readonly headDim: number;
  /** Element type of the KV cache; default the context's weight dtype. */
  readonly dtype?: KvDtype;
  /** Invocations per workgroup, one per (query, head of the group) row; default 64. */
  readonly workgroupSize?: number;
  /**
   * Keys staged in workgroup memory and scored per online-softmax rescale; default 16, or less
   * when `keyChunk * (2 * headDim + workgroupSize) * 4` bytes (K and V rows, one score per
   * invocation) exceed the device's workgroup storage.
   */
  readonly keyChunk?: number;
  /**
   * Kernel: `workgroup` (`paged_attention_prefill.wgsl`, keys staged in workgroup memory, one row
   * per invocation), `unrolled` (`paged_attention_prefill_unrolled.wgsl`, one query token per
   * invocation with the GQA group in registers, no barriers; 8 queries per tile; K and V read 8
   * elements per load), `tiled` (`paged_attention_prefill_tiled.wgsl`, 64 invocations share
   * 8-32 rows, the largest that fits the workgroup storage) or `blocked`
   * (`paged_attention_prefill_blocked.wgsl`, 64 invocations share 8-32 rows, each a block of
   * rows by keys and rows by output dims); for these two `workgroupSize` and `keyChunk` do not
   * apply and the GQA group is at most the rows (kernels/prefill_attention_shapes.ts). Default
   * `unrolled` on CPU adapters when `GROUP * headDim <= 512` and `headDim` is a multiple of 8,
   * else `workgroup`.
   */
  readonly variant?: PagedAttentionPrefillVariant;
  /**
   * `tiled` and `blocked` only: the rows per workgroup (one of {@linkcode TILED_ROWS}), with the
   * most keys per step that fit; default the largest that fits.
   */
  readonly tiledRows?: number;
}

/** A digest of the prefill attention's WGSL: a cached choice is re-measured once it changes. */
export const PREFILL_SOURCES_DIGEST: string = sourceDigest(
  prefillIo,
  source,
  unrolledSource,
  tiledSource,
  blockedSource,
  ...KV_CODEC_SOURCES,
);

/** The prefill attention kernels. */
export type PagedAttentionPrefillVariant = "workgroup" | "unrolled" | "tiled" | "blocked";

/**
 * The GPU prefill kernels with a tile of rows per workgroup for `config`'s shape, of `variants`
 * (default `tiled`, then `blocked`), each at its default shape and then at each other row count
 * that fits (kernels/prefill_attention_shapes.ts); none of a kernel that does not fit.
 */
export function gpuPrefillKernels(
  ctx: GpuContext,
  config: Omit<PagedAttentionPrefillConfig, "variant" | "tiledRows">,
  variants: readonly TiledPrefillVariant[] = ["tiled", "blocked"],
): PagedAttentionPrefill[] {
  const group = config.numQHeads / config.numKvHeads;
  const storage = ctx.limits.maxComputeWorkgroupStorageSize;
  const dtype = kvStageDtype(ctx, config.dtype ?? ctx.weightDtype);
  return variants.flatMap((variant) => {
    if (prefillTileShape(variant, config.headDim, group, storage, dtype) === null) return [];
    return [
      new PagedAttentionPrefill(ctx, { ...config, variant }),
      ...prefillTileRows(variant, config.headDim, group, storage, dtype).map((tiledRows) =>
        new PagedAttentionPrefill(ctx, { ...config, variant, tiledRows })
      ),
    ];
  });
}

/**
 * The `tiled` or `blocked` kernel's source after the prelude and the shape constants (D4, BR, BK),
 * its register blocks written out (kernels/unroll.ts).
 */
function tileKernelBody(variant: TiledPrefillVariant, headDim: number, br: number, bk: number) {
  const su = stageUnroll(bk, headDim / 4, 64);
  const stage = `const STAGE_U: u32 = ${su}u;\n`;
  if (variant === "blocked") {
    return stage +
      unrollTemplate(blockedSource, { r: br / 8, i: bk / 8, c: Math.ceil(headDim / 32), w: su });
  }
  const ipr = 64 / br;
  const od = Math.ceil(headDim / 4 / ipr);
  return stage + `const IPR: u32 = ${ipr}u;\nconst OD: u32 = ${od}u;\n` +
    unrollTemplate(tiledSource, { i: bk / ipr, r: od, w: su });
}

/**
 * The K / V vec4s each invocation of a GPU prefill kernel stages per step and loads together
 * (STAGE_U in paged_attention_prefill{,_tiled,_blocked}.wgsl): the step's `keys` rows of `d4`
 * vec4s over `invocations`, at most 8 (two vec4 registers each, K and V).
 */
function stageUnroll(keys: number, d4: number, invocations: number): number {
  return Math.min(8, Math.ceil((keys * d4) / invocations));
}

/** Largest `GROUP * headDim` of the `unrolled` kernel (registers and code size). */
export const MAX_UNROLLED_PREFILL_GROUP_DIM = 512;

/** Buffers of one call site (one layer); fixed for the op's lifetime. */
export interface PagedAttentionPrefillBuffers {
  /**
   * f32 queries, `q(t, h, d)` at `t * qStride + h * headDim + d` for the packed new tokens
   * `t` of all sequences (in the engine: the q part of the fused `[q | k | v]` projection).
   */
  readonly q: GPUBufferBinding;
  /** KV dtype `[numBlocks, numKvHeads, blockSize, headDim]`: the layer's K cache. */
  readonly kCache: GPUBufferBinding;
  /** KV dtype `[numBlocks, numKvHeads, blockSize, headDim]`: the layer's V cache. */
  readonly vCache: GPUBufferBinding;
  /** u32 `[numSeqs, btStride]`: physical block of tokens `[j * blockSize, (j + 1) * blockSize)`. */
  readonly blockTables: GPUBufferBinding;
  /** u32 `[numSeqs + 1]`: prefix sums of the new tokens per sequence (`cu[0] = 0`). */
  readonly cuQLens: GPUBufferBinding;
  /** u32 `[numSeqs]`: tokens of each sequence in the cache, this step's new ones included. */
  readonly contextLens: GPUBufferBinding;
  /** f32 `[numTokens, numQHeads, headDim]`, contiguous. */
  readonly out: GPUBufferBinding;
}

/** Cache geometry and query layout of one call site. */
export interface PagedAttentionPrefillLayout {
  /** Tokens per cache block. */
  readonly blockSize: number;
  /** Row stride of `blockTables` (entries per sequence). */
  readonly btStride: number;
  /** f32 elements from one query token to the next; default `numQHeads * headDim`. */
  readonly qStride?: number;
  /** Softmax scale; default `1 / sqrt(headDim)`. */
  readonly scale?: number;
}

/** The compiled prefill attention pipeline; {@linkcode PagedAttentionPrefill.bind} makes call sites. */
export class PagedAttentionPrefill {
  /** Query tokens per tile: `floor(workgroupSize / (numQHeads / numKvHeads))`. */
  readonly tileQueries: number;
  readonly config: Required<PagedAttentionPrefillConfig>;
  /** The kernel in use. */
  readonly variant: PagedAttentionPrefillVariant;
  /**
   * Its name among a model's prefill kernels: the variant, with the `tiled` or `blocked`
   * kernel's rows when they were asked for (`tiled br16`).
   */
  readonly name: string;
  readonly #ctx: GpuContext;
  readonly #pipeline: GPUComputePipeline;

  constructor(ctx: GpuContext, config: PagedAttentionPrefillConfig) {
    const { numQHeads, numKvHeads, headDim } = config;
    const dtype = config.dtype ?? ctx.weightDtype;
    const workgroupSize = config.workgroupSize ?? 64;
    const storage = ctx.limits.maxComputeWorkgroupStorageSize;
    // Per key of a step: its K and V rows as f32, and one score per invocation.
    const bytesPerKey = 8 * headDim + 4 * workgroupSize;
    const keyChunk = config.keyChunk ??
      Math.max(1, Math.min(16, Math.floor(storage / bytesPerKey)));
    const positive = (n: number) => Number.isInteger(n) && n > 0;
    if (!positive(numQHeads) || !positive(numKvHeads) || numQHeads % numKvHeads !== 0) {
      throw new RangeError(
        `Cannot create paged_attention_prefill: ${numQHeads} query heads is not a multiple of ` +
          `${numKvHeads} kv heads`,
      );
    }
    if (!positive(headDim) || headDim % 4 !== 0 || headDim > 256) {
      throw new RangeError(
        `Cannot create paged_attention_prefill: head_dim ${headDim} must be a multiple of 4 and at most 256`,
      );
    }
    const group = numQHeads / numKvHeads;
    const maxWg = ctx.limits.maxComputeInvocationsPerWorkgroup;
    if (!positive(workgroupSize) || workgroupSize > maxWg || workgroupSize < group) {
      throw new RangeError(
        `Cannot create paged_attention_prefill: workgroup size ${workgroupSize} must be in ` +
          `[${group}, ${maxWg}] (at least the GQA group of ${group})`,
      );
    }
    if (!positive(keyChunk) || keyChunk * bytesPerKey > storage) {
      throw new RangeError(
        `Cannot create paged_attention_prefill: key chunk ${keyChunk} x (head_dim ${headDim}, ` +
          `workgroup ${workgroupSize}) needs ${
            keyChunk * bytesPerKey
          } bytes of workgroup storage, the device has ${storage}`,
      );
    }
    if (dtype === "f16" && !ctx.hasF16) {
      throw new TypeError("Cannot create paged_attention_prefill: f16 KV needs shader-f16");
    }
    const unrolledFits = group * headDim <= MAX_UNROLLED_PREFILL_GROUP_DIM && headDim % 8 === 0;
    const variant = config.variant ??
      (ctx.isCpuProfile && unrolledFits ? "unrolled" : "workgroup");
    if (variant === "unrolled" && !unrolledFits) {
      throw new RangeError(
        `Cannot create unrolled paged_attention_prefill: GROUP ${group} x head_dim ${headDim} ` +
          `must be at most ${MAX_UNROLLED_PREFILL_GROUP_DIM} with head_dim a multiple of 8`,
      );
    }
    const rows = config.tiledRows;
    const tileVariant = variant === "tiled" || variant === "blocked" ? variant : null;
    if (rows !== undefined && (tileVariant === null || !TILED_ROWS.includes(rows))) {
      throw new RangeError(
        `Cannot create ${variant} paged_attention_prefill with ${rows} rows per workgroup: ` +
          `tiled and blocked only, ${TILED_ROWS.join(", ")}`,
      );
    }
    const tileShape = tileVariant === null
      ? null
      : prefillTileShape(tileVariant, headDim, group, storage, kvStageDtype(ctx, dtype), rows);
    if (tileVariant !== null && tileShape === null) {
      throw new RangeError(
        `Cannot create ${variant} paged_attention_prefill: GQA group ${group} or head_dim ` +
          `${headDim} does not fit ${storage} bytes of workgroup storage` +
          (rows === undefined ? "" : ` in ${rows} rows per workgroup`),
      );
    }
    this.#ctx = ctx;
    this.variant = variant;
    this.name = rows === undefined ? variant : `${variant} br${rows}`;
    this.config = {
      numQHeads,
      numKvHeads,
      headDim,
      dtype,
      workgroupSize,
      keyChunk,
      variant,
      tiledRows: tileShape?.br ?? 0,
    };
    if (tileVariant !== null && tileShape !== null) {
      const { br, bk } = tileShape;
      this.tileQueries = Math.floor(br / group);
      this.#pipeline = ctx.pipeline(
        `paged_attention_prefill_${tileVariant}/${dtype}/d${headDim}/br${br}/bk${bk}`,
        () =>
          kvVec4Prelude(ctx, dtype) + prefillIo +
          `const D4: u32 = ${headDim / 4}u;\nconst BR: u32 = ${br}u;\nconst BK: u32 = ${bk}u;\n` +
          tileKernelBody(tileVariant, headDim, br, bk),
      );
    } else if (variant === "unrolled") {
      this.tileQueries = 8;
      this.#pipeline = ctx.pipeline(
        `paged_attention_prefill_unrolled/${dtype}/group${group}/d${headDim}`,
        () =>
          kvLoad8Prelude(ctx, dtype) + prefillIo +
          `const GROUP: u32 = ${group}u;\nconst D4: u32 = ${headDim / 4}u;\n` +
          `const D8: u32 = ${headDim / 8}u;\n` +
          unrollTemplate(unrolledSource, { i: group, r: headDim / 8 }),
      );
    } else {
      this.tileQueries = Math.floor(workgroupSize / group);
      const prelude = kvVec4Prelude(ctx, dtype) + prefillIo +
        `const D4: u32 = ${headDim / 4}u;\nconst KC: u32 = ${keyChunk}u;\n` +
        `const WG: u32 = ${workgroupSize}u;\n`;
      const su = stageUnroll(keyChunk, headDim / 4, workgroupSize);
      this.#pipeline = ctx.pipeline(
        `paged_attention_prefill/${dtype}/d${headDim}/kc${keyChunk}/wg${workgroupSize}`,
        () =>
          prelude + `const STAGE_U: u32 = ${su}u;\n` +
          unrollTemplate(source, { i: 1, r: headDim / 4, w: su }),
      );
    }
  }

  /**
   * Number of tiles (workgroups per kv head) for these query lengths: the exact count to pass
   * to {@linkcode PagedAttentionPrefillOp.encode} when the host knows the lengths.
   */
  countTiles(queryLens: ArrayLike<number>): number {
    let tiles = 0;
    for (let s = 0; s < queryLens.length; s++) {
      tiles += Math.ceil(queryLens[s]! / this.tileQueries);
    }
    return tiles;
  }

  /** Creates a call site: its bind group and parameter slot are made once, here. */
  bind(
    arena: ParamArena,
    buffers: PagedAttentionPrefillBuffers,
    layout: PagedAttentionPrefillLayout,
  ): PagedAttentionPrefillOp {
    const { numQHeads, numKvHeads, headDim } = this.config;
    const qStride = layout.qStride ?? numQHeads * headDim;
    const scale = layout.scale ?? 1 / Math.sqrt(headDim);
    if (!Number.isInteger(qStride) || qStride < numQHeads * headDim || qStride % 4 !== 0) {
      throw new RangeError(
        `Cannot bind paged_attention_prefill: q stride ${qStride} must be a multiple of 4 and at ` +
          `least ${numQHeads} heads x ${headDim}`,
      );
    }
    if (!Number.isInteger(layout.blockSize) || layout.blockSize <= 0) {
      throw new RangeError(
        `Cannot bind paged_attention_prefill: block size ${layout.blockSize} is not a positive integer`,
      );
    }
    if (!Number.isInteger(layout.btStride) || layout.btStride <= 0) {
      throw new RangeError(
        `Cannot bind paged_attention_prefill: block table stride ${layout.btStride} is not a positive integer`,
      );
    }
    if (!(scale > 0) || !Number.isFinite(scale)) {
      throw new RangeError(`Cannot bind paged_attention_prefill: scale ${scale} is not positive`);
    }
    const slot = arena.allocate();
    const bindGroup = this.#ctx.device.createBindGroup({
      label: "paged_attention_prefill",
      layout: this.#pipeline.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: buffers.q },
        { binding: 1, resource: buffers.kCache },
        { binding: 2, resource: buffers.vCache },
        { binding: 3, resource: buffers.blockTables },
        { binding: 4, resource: buffers.cuQLens },
        { binding: 5, resource: buffers.contextLens },
        { binding: 6, resource: buffers.out },
        { binding: 7, resource: slot.binding },
      ],
    });
    slot.setU32(0, 0, numQHeads, numKvHeads, qStride, layout.blockSize, layout.btStride);
    slot.setU32(6, this.tileQueries, 0);
    slot.setF32(8, scale * Math.LOG2E);
    return new PagedAttentionPrefillOp(
      this.#pipeline,
      bindGroup,
      slot,
      this.tileQueries,
      numKvHeads,
      layout.btStride,
    );
  }
}
