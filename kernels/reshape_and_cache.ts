/**
 * `reshape_and_cache`: scatters this step's new K and V vectors (read in place from the fused
 * qkv projection output) into the paged KV cache, converting f32 to the cache dtype. See
 * `reshape_and_cache.wgsl` for bindings and grid, and `paged_attention_decode.ts` for the cache
 * layout.
 *
 * @module
 */

import source from "./reshape_and_cache.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { KvDtype } from "../gpu/dtype.ts";
import { kvVec4Prelude } from "./kv_codec.ts";
import type { ParamArena, ParamSlot } from "../gpu/params.ts";
import { dispatch1d, groupsFor } from "./dispatch.ts";

/** Slot value that makes `reshape_and_cache` skip a token (e.g. a padding token). */
export const SKIP_SLOT = 0xffffffff;

/** Fixed shape of one `reshape_and_cache` call site (one layer). */
export interface ReshapeAndCacheShape {
  readonly numKvHeads: number;
  /** Elements per head; a multiple of 4. */
  readonly headDim: number;
  /** Tokens per cache block. */
  readonly blockSize: number;
  /** f32 elements from one token's row of `src` to the next; a multiple of 4. */
  readonly srcStride: number;
  /** Offset of K head 0 in a `src` row, in elements (Hq * headDim for a fused qkv); mult. of 4. */
  readonly kOffset: number;
  /** Offset of V head 0 in a `src` row, in elements ((Hq + Hkv) * headDim); a multiple of 4. */
  readonly vOffset: number;
}

/** Buffers of one `reshape_and_cache` call site; fixed for the op's lifetime. */
export interface ReshapeAndCacheBuffers {
  /** f32 `[tokens, srcStride]`: k(t, h, d) at `t * srcStride + kOffset + h * headDim + d`. */
  readonly src: GPUBufferBinding;
  /** u32 `[tokens]`: cache slot `block * blockSize + offset` of each token, or SKIP_SLOT. */
  readonly slotMapping: GPUBufferBinding;
  /** Cache dtype `[num_blocks, numKvHeads, blockSize, headDim]`. */
  readonly kCache: GPUBufferBinding;
  /** Cache dtype, same shape as `kCache`. */
  readonly vCache: GPUBufferBinding;
}

/** The compiled `reshape_and_cache` pipeline for one cache dtype. */
export class ReshapeAndCache {
  /** Element type of the KV cache. */
  readonly dtype: KvDtype;
  readonly #ctx: GpuContext;
  readonly #pipeline: GPUComputePipeline;

  /** Compiles the kernel for a KV cache of `dtype` (default: the context's weight dtype). */
  constructor(ctx: GpuContext, dtype: KvDtype = ctx.weightDtype) {
    this.#ctx = ctx;
    this.dtype = dtype;
    this.#pipeline = ctx.pipeline(
      `reshape_and_cache/${dtype}`,
      () => kvVec4Prelude(ctx, dtype) + source,
    );
  }

  /**
   * Creates a call site: its bind group and parameter slot are made once, here.
   *
   * @throws {RangeError} when a size is not a multiple of 4 or K/V do not fit in a `src` row.
   */
  bind(
    arena: ParamArena,
    buffers: ReshapeAndCacheBuffers,
    shape: ReshapeAndCacheShape,
  ): ReshapeAndCacheOp {
    const { numKvHeads, headDim, blockSize, srcStride, kOffset, vOffset } = shape;
    for (const [name, value] of Object.entries({ headDim, srcStride, kOffset, vOffset })) {
      if (!Number.isInteger(value) || value < 0 || value % 4 !== 0) {
        throw new RangeError(
          `Cannot bind reshape_and_cache: ${name} ${value} is not a multiple of 4`,
        );
      }
    }
    if (headDim === 0 || numKvHeads < 1 || blockSize < 1) {
      throw new RangeError(
        `Cannot bind reshape_and_cache: numKvHeads ${numKvHeads}, headDim ${headDim}, ` +
          `blockSize ${blockSize} must be positive`,
      );
    }
    const width = numKvHeads * headDim;
    if (kOffset + width > srcStride || vOffset + width > srcStride) {
      throw new RangeError(
        `Cannot bind reshape_and_cache: K at ${kOffset} or V at ${vOffset} (${width} wide) ` +
          `exceeds the source row of ${srcStride}`,
      );
    }
    const slot = arena.allocate();
    slot.setU32(1, numKvHeads, headDim, blockSize, srcStride, kOffset, vOffset);
    const bindGroup = this.#ctx.device.createBindGroup({
      label: "reshape_and_cache",
      layout: this.#pipeline.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: buffers.src },
        { binding: 1, resource: buffers.slotMapping },
        { binding: 2, resource: buffers.kCache },
        { binding: 3, resource: buffers.vCache },
        { binding: 4, resource: slot.binding },
      ],
    });
    return new ReshapeAndCacheOp(this.#pipeline, bindGroup, slot, numKvHeads * headDim / 4);
  }
}

/** One `reshape_and_cache` call site. */
export class ReshapeAndCacheOp {
  constructor(
    private readonly pipeline: GPUComputePipeline,
    private readonly bindGroup: GPUBindGroup,
    private readonly slot: ParamSlot,
    private readonly vec4sPerToken: number,
  ) {}

  /** Encodes the cache writes of `tokens` tokens (rows of `src` / entries of `slotMapping`). */
  encode(pass: GPUComputePassEncoder, tokens: number): void {
    if (tokens <= 0) return;
    this.slot.setU32(0, tokens);
    pass.setPipeline(this.pipeline);
    pass.setBindGroup(0, this.bindGroup);
    dispatch1d(pass, groupsFor(tokens * this.vec4sPerToken, 64));
  }
}
