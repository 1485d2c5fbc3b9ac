/**
 * Float64 reference of the matmul kernels.
 *
 * @module
 */

/**
 * `y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n])` in float64, for `x` `[M, K]`, `w` `[N, K]`
 * (row-major, the Hugging Face `[out, in]` layout) and `bias` `[N]`; returns `[M, N]`. Pass the
 * f16-rounded weights when the kernel sees f16 data.
 */
export function matmulRef(
  x: ArrayLike<number>,
  w: ArrayLike<number>,
  bias: ArrayLike<number> | undefined,
  m: number,
  n: number,
  k: number,
): Float64Array {
  const y = new Float64Array(m * n);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let s = bias === undefined ? 0 : bias[j]!;
      for (let l = 0; l < k; l++) s += x[i * k + l]! * w[j * k + l]!;
      y[i * n + j] = s;
    }
  }
  return y;
}

/**
 * A floor for `assertClose` when comparing with `matmulRef`: `fraction` of the largest output's
 * term magnitude `sum_k |x| |w| (+ |bias|)`. A few outputs cancel to near zero on random inputs
 * (one output of a short sum, `x w + b`), where the normwise error would measure only the
 * cancellation; rounding errors scale with the terms, not with what is left of them.
 */
export function termFloor(
  x: ArrayLike<number>,
  w: ArrayLike<number>,
  bias: ArrayLike<number> | undefined,
  m: number,
  n: number,
  k: number,
  fraction = 1e-3,
): number {
  const abs = (v: ArrayLike<number>) => Array.from(v, Math.abs);
  const terms = matmulRef(abs(x), abs(w), bias && abs(bias), m, n, k);
  return fraction * terms.reduce((a, t) => Math.max(a, t), 0);
}

/**
 * The {@linkcode termFloor} fraction for outputs compared at `tolerance`: never below 1e-3, and at
 * least what an f32 sum of `k` terms rounds off, taken as 4 sqrt(k) 2^-24 of the terms' magnitude
 * (rounding errors add up like a random walk; the worst case, k 2^-24, would loosen long sums too
 * far to catch small errors), so that `tolerance` times the floor covers it. At 1e-4 (f32 weights)
 * and k = 32 that is 0.0135; 1e-3 allowed about 2 ulp of the terms, less than such a sum rounds
 * off. With f16 tolerances (3e-3) it stays 1e-3 up to k = 158 (0.0025 at k = 1,000).
 */
export function sumFloorFraction(k: number, tolerance: number): number {
  return Math.max(1e-3, (4 * Math.sqrt(k) * 2 ** -24) / tolerance);
}
