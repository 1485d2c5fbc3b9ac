/**
 * The int8 / int4 weight format written again from its text (gpu/quant.ts's module
 * documentation), independently of the engine's code: per group of 32 values along a row,
 * `s = f16(f32(max|w| / Q))`, `q = clamp(roundHalfEven(f32(w / s)), lo, Q)` (`q = 0` where
 * `s = 0`), `w' = q * s`. Returns the dequantized weights `w'` in float64 and the integers `q`.
 */

/** Q and the lowest value of each format. */
const RANGE = { int4: { q: 7, lo: -8 }, int8: { q: 127, lo: -127 } } as const;

/** Round half to even, written from its definition. */
function roundHalfToEven(v: number): number {
  const floor = Math.floor(v);
  const frac = v - floor;
  if (frac < 0.5) return floor;
  if (frac > 0.5) return floor + 1;
  return floor % 2 === 0 ? floor : floor + 1;
}

/** `w'` (float64) and `q` of row-major `[rows, cols]` values, `cols % 32 == 0`. */
export function quantizeRef(
  values: ArrayLike<number>,
  cols: number,
  format: "int4" | "int8",
): { dequantized: Float64Array; q: Int32Array; scales: Float64Array } {
  if (cols % 32 !== 0) throw new RangeError(`cols ${cols} is not a multiple of 32`);
  const { q: Q, lo } = RANGE[format];
  const n = values.length;
  const dequantized = new Float64Array(n);
  const q = new Int32Array(n);
  const scales = new Float64Array(n / 32);
  for (let g = 0; g < n / 32; g++) {
    let max = 0;
    for (let i = g * 32; i < g * 32 + 32; i++) {
      max = Math.max(max, Math.abs(Math.fround(values[i]!)));
    }
    const s = Math.f16round(Math.fround(max / Q));
    scales[g] = s;
    for (let i = g * 32; i < g * 32 + 32; i++) {
      q[i] = s === 0
        ? 0
        : Math.min(Q, Math.max(lo, roundHalfToEven(Math.fround(Math.fround(values[i]!) / s))));
      dequantized[i] = q[i]! * s;
    }
  }
  return { dequantized, q, scales };
}

/** The signed values packed in `words` (bits per value 4 or 8, value i at bits bits*(i%per)). */
export function unpackRef(words: Uint32Array, bits: 4 | 8): Int32Array {
  const per = 32 / bits;
  const out = new Int32Array(words.length * per);
  for (let i = 0; i < out.length; i++) {
    const raw = (words[Math.floor(i / per)]! >>> (bits * (i % per))) & ((1 << bits) - 1);
    out[i] = raw >= 1 << (bits - 1) ? raw - (1 << bits) : raw;
  }
  return out;
}
