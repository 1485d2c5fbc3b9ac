/**
 * Float64 references of paged attention and helpers that build a random paged KV cache.
 *
 * Paged KV cache layout (shared by `reshape_and_cache`, decode and prefill attention): per layer
 * a K cache and a V cache, each `[num_blocks, num_kv_heads, block_size, head_dim]`; element
 * (block b, kv head h, offset o, dim d) is at `((b * num_kv_heads + h) * block_size + o) *
 * head_dim + d`. `block_tables[s * bt_stride + j]` is the physical block holding tokens
 * `[j * block_size, (j + 1) * block_size)` of sequence `s`.
 *
 * @module
 */

import type { KvDtype } from "../../gpu/dtype.ts";
import { roundToKv, toKvData } from "./kv_values.ts";
import type { Rng } from "../support/random.ts";

/** Inputs of {@linkcode pagedAttentionRef}. */
export interface PagedAttentionRefInput {
  /**
   * Queries, f32 values: `q(t, h, d)` at `t * qStride + h * headDim + d`. Tokens are the new
   * query tokens of all sequences, concatenated in sequence order.
   */
  readonly q: ArrayLike<number>;
  /** Elements from one query token to the next (>= numQHeads * headDim). */
  readonly qStride: number;
  readonly numQHeads: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly blockSize: number;
  /** K cache values as the kernel sees them (already rounded to the KV dtype). */
  readonly kCache: ArrayLike<number>;
  /** V cache values, same layout as `kCache`. */
  readonly vCache: ArrayLike<number>;
  /** u32 `[numSeqs, btStride]` physical block ids. */
  readonly blockTables: ArrayLike<number>;
  readonly btStride: number;
  /** Tokens of each sequence in the cache, including this step's new ones. */
  readonly contextLens: ArrayLike<number>;
  /**
   * New query tokens of each sequence (each <= its context length); default 1 per sequence
   * (decode). Query `i` of sequence `s` sits at position `contextLens[s] - queryLens[s] + i` and
   * attends causally to positions `0..that position`.
   */
  readonly queryLens?: ArrayLike<number>;
  /** Softmax scale; default `1 / sqrt(headDim)`. */
  readonly scale?: number;
}

/**
 * Paged attention in float64: `out(t, h, :) = softmax(scale * q(t, h) . K[0..pos]) V[0..pos]`
 * with K/V read through the block table, GQA (query head `h` uses kv head
 * `floor(h / (numQHeads / numKvHeads))`) and a causal mask by position.
 *
 * @returns `[tokens, numQHeads, headDim]` contiguous.
 */
export function pagedAttentionRef(input: PagedAttentionRefInput): Float64Array {
  const { q, qStride, numQHeads, numKvHeads, headDim, blockSize, kCache, vCache } = input;
  const { blockTables, btStride, contextLens } = input;
  const numSeqs = contextLens.length;
  const queryLens = input.queryLens ?? new Array<number>(numSeqs).fill(1);
  const scale = input.scale ?? 1 / Math.sqrt(headDim);
  const group = numQHeads / numKvHeads;
  if (!Number.isInteger(group)) {
    throw new RangeError(`numQHeads ${numQHeads} is not a multiple of numKvHeads ${numKvHeads}`);
  }
  let tokens = 0;
  for (let s = 0; s < numSeqs; s++) tokens += queryLens[s]!;
  const out = new Float64Array(tokens * numQHeads * headDim);
  const slotBase = (s: number, pos: number, kvh: number) => {
    const block = blockTables[s * btStride + Math.floor(pos / blockSize)]!;
    return ((block * numKvHeads + kvh) * blockSize + (pos % blockSize)) * headDim;
  };
  let t = 0;
  for (let s = 0; s < numSeqs; s++) {
    const ctxLen = contextLens[s]!;
    const qLen = queryLens[s]!;
    if (qLen > ctxLen) {
      throw new RangeError(`Sequence ${s}: ${qLen} query tokens but context length ${ctxLen}`);
    }
    for (let i = 0; i < qLen; i++, t++) {
      const last = ctxLen - qLen + i;
      for (let h = 0; h < numQHeads; h++) {
        const kvh = Math.floor(h / group);
        const qBase = t * qStride + h * headDim;
        const scores = new Float64Array(last + 1);
        let max = -Infinity;
        for (let p = 0; p <= last; p++) {
          const kb = slotBase(s, p, kvh);
          let dot = 0;
          for (let d = 0; d < headDim; d++) dot += q[qBase + d]! * kCache[kb + d]!;
          scores[p] = dot * scale;
          if (scores[p]! > max) max = scores[p]!;
        }
        let sum = 0;
        for (let p = 0; p <= last; p++) {
          scores[p] = Math.exp(scores[p]! - max);
          sum += scores[p]!;
        }
        const oBase = (t * numQHeads + h) * headDim;
        for (let p = 0; p <= last; p++) {
          const vb = slotBase(s, p, kvh);
          const w = scores[p]! / sum;
          for (let d = 0; d < headDim; d++) out[oBase + d] = out[oBase + d]! + w * vCache[vb + d]!;
        }
      }
    }
  }
  return out;
}

/** Options for {@linkcode buildPagedCache}. */
export interface BuildPagedCacheOptions {
  /** Per sequence, K values `[len, numKvHeads, headDim]` (f32 or float64, any precision). */
  readonly seqK: readonly ArrayLike<number>[];
  /** Per sequence, V values with the same shapes as `seqK`. */
  readonly seqV: readonly ArrayLike<number>[];
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly blockSize: number;
  /** KV cache dtype (the values are rounded to it). */
  readonly dtype: KvDtype;
  /** Shuffles the physical block ids. */
  readonly rng: Rng;
  /** Unused blocks added to the pool (default 2); unused block-table entries point at them. */
  readonly spareBlocks?: number;
  /** Row stride of the block table; default the largest number of blocks of a sequence. */
  readonly btStride?: number;
  /** Value of every cache element no sequence owns; default NaN (a kernel reading it fails). */
  readonly fill?: number;
}

/** A paged cache built by {@linkcode buildPagedCache}. */
export interface PagedCache {
  readonly numBlocks: number;
  /** K cache as the GPU holds it (upload this), `[numBlocks, numKvHeads, blockSize, headDim]`. */
  readonly kData: Float32Array | Float16Array | Uint8Array;
  /** V cache as the GPU holds it. */
  readonly vData: Float32Array | Float16Array | Uint8Array;
  /** K cache values after rounding to the dtype, for references. */
  readonly k: Float64Array;
  /** V cache values after rounding to the dtype. */
  readonly v: Float64Array;
  /** u32 `[numSeqs, btStride]`, shuffled non-contiguous physical ids. */
  readonly blockTables: Uint32Array;
  readonly btStride: number;
  /** u32 `[numSeqs]`: tokens of each sequence. */
  readonly contextLens: Uint32Array;
}

/**
 * Scatters per-sequence K/V arrays into a paged cache whose physical blocks are a random
 * permutation, so block tables are non-contiguous; unowned slots hold `fill` (NaN by default).
 */
export function buildPagedCache(options: BuildPagedCacheOptions): PagedCache {
  const { seqK, seqV, numKvHeads, headDim, blockSize, dtype, rng } = options;
  const numSeqs = seqK.length;
  const lens = seqK.map((k, s) => {
    const len = k.length / (numKvHeads * headDim);
    if (!Number.isInteger(len) || seqV[s]?.length !== k.length) {
      throw new RangeError(`Sequence ${s}: K/V lengths do not match [len, Hkv, D]`);
    }
    return len;
  });
  const blocksPer = lens.map((len) => Math.ceil(len / blockSize));
  const maxBlocks = Math.max(1, ...blocksPer);
  const btStride = options.btStride ?? maxBlocks;
  if (btStride < maxBlocks) throw new RangeError(`btStride ${btStride} < ${maxBlocks} blocks`);
  const spare = options.spareBlocks ?? 2;
  const used = blocksPer.reduce((a, b) => a + b, 0);
  const numBlocks = used + Math.max(1, spare);
  const perm = rng.permutation(numBlocks);
  const blockTables = new Uint32Array(numSeqs * btStride);
  const fill = options.fill ?? NaN;
  const k = new Float64Array(numBlocks * numKvHeads * blockSize * headDim).fill(fill);
  const v = new Float64Array(k.length).fill(fill);
  let next = 0;
  for (let s = 0; s < numSeqs; s++) {
    for (let j = 0; j < btStride; j++) {
      // Unused entries point at a spare (unowned, poisoned) block.
      blockTables[s * btStride + j] = j < blocksPer[s]! ? perm[next++]! : perm[used]!;
    }
    const ks = roundToKv(seqK[s]!, dtype);
    const vs = roundToKv(seqV[s]!, dtype);
    for (let p = 0; p < lens[s]!; p++) {
      const block = blockTables[s * btStride + Math.floor(p / blockSize)]!;
      for (let h = 0; h < numKvHeads; h++) {
        const dst = ((block * numKvHeads + h) * blockSize + (p % blockSize)) * headDim;
        const src = (p * numKvHeads + h) * headDim;
        for (let d = 0; d < headDim; d++) {
          k[dst + d] = ks[src + d]!;
          v[dst + d] = vs[src + d]!;
        }
      }
    }
  }
  return {
    numBlocks,
    kData: toKvData(k, dtype),
    vData: toKvData(v, dtype),
    k,
    v,
    blockTables,
    btStride,
    contextLens: Uint32Array.from(lens),
  };
}

/**
 * `reshape_and_cache` in plain TS: writes token `t`'s K and V (read from `src` at
 * `t * srcStride + kOffset + h * headDim + d` and `... + vOffset + ...`) into slot
 * `slotMapping[t]` of copies of `kCache` / `vCache` (values rounded to `dtype`); slots
 * `0xFFFFFFFF` are skipped.
 */
export function reshapeAndCacheRef(
  src: ArrayLike<number>,
  slotMapping: ArrayLike<number>,
  kCache: ArrayLike<number>,
  vCache: ArrayLike<number>,
  shape: {
    srcStride: number;
    kOffset: number;
    vOffset: number;
    numKvHeads: number;
    headDim: number;
    blockSize: number;
    dtype: KvDtype;
  },
): { k: Float64Array; v: Float64Array } {
  const { srcStride, kOffset, vOffset, numKvHeads, headDim, blockSize, dtype } = shape;
  const k = Float64Array.from(kCache);
  const v = Float64Array.from(vCache);
  for (let t = 0; t < slotMapping.length; t++) {
    const slot = slotMapping[t]!;
    if (slot === 0xffffffff) continue;
    const block = Math.floor(slot / blockSize);
    const offset = slot % blockSize;
    for (let h = 0; h < numKvHeads; h++) {
      const dst = ((block * numKvHeads + h) * blockSize + offset) * headDim;
      const base = t * srcStride + h * headDim;
      const ks = roundToKv(
        Array.from({ length: headDim }, (_, d) => src[base + kOffset + d]!),
        dtype,
      );
      const vs = roundToKv(
        Array.from({ length: headDim }, (_, d) => src[base + vOffset + d]!),
        dtype,
      );
      k.set(ks, dst);
      v.set(vs, dst);
    }
  }
  return { k, v };
}

/**
 * The same block tables in the indexed layout (kernels/block_table_stride.ts INDEXED_ROWS):
 * a header of one row offset per sequence, then the rows `btStride` entries long in a shuffled
 * order with a spare row between, so a kernel that read row s at `s * btStride` (or past its
 * row) would read the wrong blocks: unused entries hold 0xFFFFFFFF.
 */
export function indexedBlockTables(
  tables: Uint32Array,
  btStride: number,
  rng: Rng,
): Uint32Array {
  const numSeqs = tables.length / btStride;
  const order = rng.permutation(numSeqs);
  const out = new Uint32Array(numSeqs + 2 * numSeqs * btStride).fill(0xffffffff);
  order.forEach((s, i) => {
    const at = numSeqs + (2 * i + 1) * btStride;
    out[s] = at;
    out.set(tables.subarray(s * btStride, (s + 1) * btStride), at);
  });
  return out;
}
