/**
 * The paged KV cache on the GPU: per layer, one K and one V buffer of
 * `[numBlocks, numKvHeads, blockSize, headDim]` elements of the KV dtype (the weights' f16 or
 * f32, or one-byte fp8 codes: kernels/kv_codec.ts). A token's slot is
 * `block * blockSize + offset`; element (block b, kv head h, offset o, dim d) is at
 * `((b * numKvHeads + h) * blockSize + o) * headDim + d`. Which block holds which tokens is the
 * block manager's business (scheduler/); this file only owns memory.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../gpu/context.ts";
import { kvBytesPerElement, type KvDtype } from "../gpu/dtype.ts";

/** Geometry of a KV cache. */
export interface KvCacheShape {
  readonly numLayers: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly blockSize: number;
  readonly dtype: KvDtype;
}

/** Bytes one block takes in ONE layer's K (or V) buffer. */
export function blockBytesPerLayer(shape: KvCacheShape): number {
  return shape.numKvHeads * shape.blockSize * shape.headDim * kvBytesPerElement(shape.dtype);
}

/** Bytes one block takes across all layers, K and V. */
export function blockBytes(shape: KvCacheShape): number {
  return 2 * shape.numLayers * blockBytesPerLayer(shape);
}

/**
 * The start-up log's line on a cache of `shape`: its dtype and bytes per token, e.g.
 * `KV cache dtype: fp8_e4m3, 57,344 bytes per token (K and V of 28 layers)` (Qwen3-0.6B).
 */
export function kvCacheDtypeLine(shape: KvCacheShape): string {
  const perToken = (blockBytes(shape) / shape.blockSize).toLocaleString("en-US");
  return `KV cache dtype: ${shape.dtype}, ${perToken} bytes per token (K and V of ` +
    `${shape.numLayers} layers)`;
}

/**
 * The most blocks a cache can have on `ctx`: each layer's K (and V) buffer must fit one storage
 * binding.
 */
export function maxBlocks(ctx: GpuContext, shape: KvCacheShape): number {
  return Math.floor(ctx.maxBindingBytes / blockBytesPerLayer(shape));
}

/** The K and V buffers of every layer. */
export class KvCache {
  readonly shape: KvCacheShape;
  readonly numBlocks: number;
  /** Per layer: K `[numBlocks, numKvHeads, blockSize, headDim]` of `shape.dtype`. */
  readonly k: readonly GPUBuffer[];
  /** Per layer: V, same layout as K. */
  readonly v: readonly GPUBuffer[];

  constructor(ctx: GpuContext, shape: KvCacheShape, numBlocks: number) {
    const limit = maxBlocks(ctx, shape);
    if (!Number.isInteger(numBlocks) || numBlocks < 1 || numBlocks > limit) {
      throw new RangeError(
        `Cannot allocate ${numBlocks} KV blocks: between 1 and ${limit} fit one binding per layer`,
      );
    }
    this.shape = shape;
    this.numBlocks = numBlocks;
    const bytes = numBlocks * blockBytesPerLayer(shape);
    const k: GPUBuffer[] = [];
    const v: GPUBuffer[] = [];
    for (let l = 0; l < shape.numLayers; l++) {
      k.push(ctx.createBuffer(`kv.k[${l}]`, bytes, STORAGE_RW));
      v.push(ctx.createBuffer(`kv.v[${l}]`, bytes, STORAGE_RW));
    }
    this.k = k;
    this.v = v;
  }

  /** Total bytes of all K and V buffers. */
  get byteSize(): number {
    return this.numBlocks * blockBytes(this.shape);
  }

  /** Releases every buffer. */
  destroy(): void {
    for (const b of [...this.k, ...this.v]) b.destroy();
  }
}
