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
