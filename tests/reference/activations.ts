/**
 * Float64 references of the element-wise activations.
 *
 * @module
 */

/** SwiGLU: `out[t, i] = silu(gateUp[t, i]) * gateUp[t, inter + i]`. */
export function siluMulRef(gateUp: ArrayLike<number>, tokens: number, inter: number): Float64Array {
  const out = new Float64Array(tokens * inter);
  for (let t = 0; t < tokens; t++) {
    for (let i = 0; i < inter; i++) {
      const g = gateUp[t * 2 * inter + i]!;
      out[t * inter + i] = (g / (1 + Math.exp(-g))) * gateUp[t * 2 * inter + inter + i]!;
    }
  }
  return out;
}
