/**
 * Float64 reference of rotate-half rotary position embedding (GPT-NeoX / Hugging Face Llama),
 * and of `kernels/rope_and_cache.ts` (q/k head norm, RoPE, K/V cache write).
 *
 * @module
 */

import type { DType } from "../../gpu/dtype.ts";
import { reshapeAndCacheRef } from "./attention.ts";

/** Head addressing: head `h` of token `t` starts at `offset + t * tokenStride + h * headDim`. */
export interface RopeRefLayout {
  readonly tokens: number;
  readonly heads: number;
  readonly headDim: number;
  readonly tokenStride: number;
  readonly offset: number;
  /** Rotated elements per head; `invFreq.length * 2`. */
  readonly rotaryDim: number;
}

/**
 * Rotates pairs `(i, i + rotaryDim / 2)` of every addressed head by `positions[t] * invFreq[i]`
 * (angle and cos / sin in float64; pass `invFreq` as the f32 values the GPU sees). Returns a
 * copy of the whole buffer; elements outside the rotated pairs are copied as is.
 */
export function ropeRef(
  qkv: ArrayLike<number>,
  positions: ArrayLike<number>,
  invFreq: ArrayLike<number>,
  layout: RopeRefLayout,
): Float64Array {
  const out = Float64Array.from(qkv);
  const half = layout.rotaryDim / 2;
  for (let t = 0; t < layout.tokens; t++) {
    for (let i = 0; i < half; i++) {
      const a = positions[t]! * invFreq[i]!;
      const c = Math.cos(a);
      const s = Math.sin(a);
      for (let h = 0; h < layout.heads; h++) {
        const j = layout.offset + t * layout.tokenStride + h * layout.headDim + i;
        const x0 = qkv[j]!;
        const x1 = qkv[j + half]!;
        out[j] = x0 * c - x1 * s;
        out[j + half] = x1 * c + x0 * s;
      }
    }
  }
  return out;
}

/** `theta^(-2 i / rotaryDim)` for `i < rotaryDim / 2`, in float64. */
export function ropeInvFreqRef(theta: number, rotaryDim: number): Float64Array {
  return Float64Array.from({ length: rotaryDim / 2 }, (_, i) => theta ** ((-2 * i) / rotaryDim));
}

/** Shape of {@linkcode ropeAndCacheRef}'s inputs (the fused `[q | k | v]` rows, the cache). */
export interface RopeAndCacheRefShape {
  readonly tokens: number;
  readonly numHeads: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly blockSize: number;
  /** Cache element type: the k and v written to the cache are rounded to it. */
  readonly dtype: DType;
  readonly eps: number;
}

/**
 * `rope_and_cache` in float64: RMS-normalises every q and k head of `qkv` with `norm.q` /
 * `norm.k` when given, rotates them ({@linkcode ropeRef}), and writes the k and v heads of each
 * token to its slot of copies of `kCache` / `vCache` (`reshapeAndCacheRef`). Returns the
 * expected qkv (rotated q; k and v as given) and caches.
 */
export function ropeAndCacheRef(
  qkv: ArrayLike<number>,
  positions: ArrayLike<number>,
  invFreq: ArrayLike<number>,
  slotMapping: ArrayLike<number>,
  cache: { readonly k: ArrayLike<number>; readonly v: ArrayLike<number> },
  shape: RopeAndCacheRefShape,
  norm?: { readonly q: ArrayLike<number>; readonly k: ArrayLike<number> },
): { qkv: Float64Array; k: Float64Array; v: Float64Array } {
  const { tokens, numHeads: hq, numKvHeads: hkv, headDim: d } = shape;
  const stride = (hq + 2 * hkv) * d;
  const x = Float64Array.from(qkv);
  for (let t = 0; t < tokens && norm !== undefined; t++) {
    for (let h = 0; h < hq + hkv; h++) {
      const base = t * stride + h * d;
      const w = h < hq ? norm.q : norm.k;
      let sumSq = 0;
      for (let j = 0; j < d; j++) sumSq += x[base + j]! ** 2;
      const scale = 1 / Math.sqrt(sumSq / d + shape.eps);
      for (let j = 0; j < d; j++) x[base + j] = x[base + j]! * scale * w[j]!;
    }
  }
  const rotated = ropeRef(x, positions, invFreq, {
    tokens,
    heads: hq + hkv,
    headDim: d,
    tokenStride: stride,
    offset: 0,
    rotaryDim: d,
  });
  const { k, v } = reshapeAndCacheRef(rotated, slotMapping, cache.k, cache.v, {
    srcStride: stride,
    kOffset: hq * d,
    vOffset: (hq + hkv) * d,
    numKvHeads: hkv,
    headDim: d,
    blockSize: shape.blockSize,
    dtype: shape.dtype,
  });
  const out = Float64Array.from(qkv);
  for (let t = 0; t < tokens; t++) {
    out.set(rotated.subarray(t * stride, t * stride + hq * d), t * stride);
  }
  return { qkv: out, k, v };
}
