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

/** GPT-2's tanh-approximated GELU: `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`. */
export function geluNewRef(x: ArrayLike<number>): Float64Array {
  const k = Math.sqrt(2 / Math.PI);
  return Float64Array.from(x, (v) => 0.5 * v * (1 + Math.tanh(k * (v + 0.044715 * v ** 3))));
}
