/**
 * Float64 references for the safetensors conversions and RoPE frequencies, written from the
 * format definitions with plain arithmetic (no bit reinterpretation through typed arrays).
 *
 * @module
 */

/**
 * The value of a bfloat16 bit pattern: 1 sign bit, 8 exponent bits (bias 127), 7 mantissa bits.
 * Exponent 0 is subnormal (`m / 128 * 2^-126`), 255 is infinity (m = 0) or NaN.
 */
export function bf16Value(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >> 7) & 0xff;
  const man = bits & 0x7f;
  if (exp === 0xff) return man === 0 ? sign * Infinity : NaN;
  if (exp === 0) return sign * (man / 128) * 2 ** -126;
  return sign * (1 + man / 128) * 2 ** (exp - 127);
}

/**
 * The bfloat16 nearest to `x` (ties to the even mantissa), as its value; `x` must be finite and
 * within bfloat16 range. Found by bracketing `x` between adjacent representable values.
 */
export function roundToBf16(x: number): number {
  if (x === 0) return x;
  const a = Math.abs(x);
  // Spacing of bf16 values around a: 2^(floor(log2 a) - 7), at least the subnormal step.
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e -= 1;
  if (2 ** (e + 1) <= a) e += 1;
  const step = 2 ** Math.max(e - 7, -133);
  const lo = Math.floor(a / step) * step;
  const hi = lo + step;
  let r: number;
  if (a - lo < hi - a) r = lo;
  else if (hi - a < a - lo) r = hi;
  else r = Math.round(lo / step) % 2 === 0 ? lo : hi;
  return Math.sign(x) * r;
}

/**
 * RoPE inverse frequencies as transformers computes them (`_compute_default_rope_parameters`,
 * `_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`), in float64, written
 * mask-style as there.
 */
export function ropeInvFreqReference(
  dim: number,
  theta: number,
  scaling:
    | { type: "none" }
    | { type: "linear"; factor: number }
    | {
      type: "llama3";
      factor: number;
      low: number;
      high: number;
      original: number;
    },
): number[] {
  const base: number[] = [];
  for (let j = 0; j < dim; j += 2) base.push(1 / Math.pow(theta, j / dim));
  if (scaling.type === "none") return base;
  if (scaling.type === "linear") return base.map((f) => f / scaling.factor);
  const lowWavelen = scaling.original / scaling.low;
  const highWavelen = scaling.original / scaling.high;
  return base.map((f) => {
    const wavelen = (2 * Math.PI) / f;
    const scaled = wavelen > lowWavelen ? f / scaling.factor : f;
    const smooth = (scaling.original / wavelen - scaling.low) / (scaling.high - scaling.low);
    const smoothed = ((1 - smooth) * scaled) / scaling.factor + smooth * scaled;
    const isMedium = !(wavelen < highWavelen) && !(wavelen > lowWavelen);
    return isMedium ? smoothed : scaled;
  });
}
