/**
 * Float64 reference of rotate-half rotary position embedding (GPT-NeoX / Hugging Face Llama).
 *
 * @module
 */

/** Head addressing shared with `kernels/rope.ts`. */
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
