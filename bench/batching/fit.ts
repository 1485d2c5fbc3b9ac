/**
 * Least-squares fits, used to calibrate the mock executor's latency model from step times
 * measured on the WebGPU runner (bench/batching/calibrate.ts).
 *
 * @module
 */

/** A least-squares fit `y = sum_j coef[j] * x[j]` and its coefficient of determination. */
export interface LinearFit {
  /** One coefficient per column of the rows. */
  readonly coef: readonly number[];
  /** R^2 = 1 - SS_res / SS_tot. */
  readonly r2: number;
}

/**
 * Ordinary least squares over rows `x` (put a constant 1 column in for an intercept): solves
 * the normal equations `X^T X c = X^T y` by Gaussian elimination with partial pivoting.
 *
 * @throws {RangeError} with fewer rows than columns, ragged or non-finite rows, or columns that
 *   are linear combinations of each other (the coefficients are then not determined).
 */
export function fitLinear(x: readonly (readonly number[])[], y: readonly number[]): LinearFit {
  const n = x.length;
  const k = x[0]?.length ?? 0;
  if (k === 0 || n < k || y.length !== n) {
    throw new RangeError(`Cannot fit ${k} coefficients to ${n} row(s) and ${y.length} value(s)`);
  }
  for (let i = 0; i < n; i++) {
    const row = x[i]!;
    if (row.length !== k || !row.every(Number.isFinite) || !Number.isFinite(y[i]!)) {
      throw new RangeError(`Cannot fit: row ${i} is not ${k} finite numbers with a finite value`);
    }
  }
  // Augmented normal equations [X^T X | X^T y], k x (k + 1).
  const m = Array.from({ length: k }, (_, a) => {
    const r = new Array<number>(k + 1).fill(0);
    for (let i = 0; i < n; i++) {
      const row = x[i]!;
      for (let b = 0; b < k; b++) r[b]! += row[a]! * row[b]!;
      r[k]! += row[a]! * y[i]!;
    }
    return r;
  });
  const scale = Math.max(...m.map((r, a) => Math.abs(r[a]!)), 1e-300);
  for (let c = 0; c < k; c++) {
    let p = c;
    for (let r = c + 1; r < k; r++) if (Math.abs(m[r]![c]!) > Math.abs(m[p]![c]!)) p = r;
    if (Math.abs(m[p]![c]!) <= 1e-12 * scale) {
      throw new RangeError(`Cannot fit: column ${c} is a linear combination of the others`);
    }
    [m[c], m[p]] = [m[p]!, m[c]!];
    const pivot = m[c]!;
    for (let r = 0; r < k; r++) {
      if (r === c) continue;
      const row = m[r]!;
      const f = row[c]! / pivot[c]!;
      if (f === 0) continue;
      for (let j = c; j <= k; j++) row[j]! -= f * pivot[j]!;
    }
  }
  const coef = m.map((r, c) => r[k]! / r[c]!);
  const my = y.reduce((s, v) => s + v, 0) / n;
  let ssRes = 0;
  let ssTot = 0;
  for (let i = 0; i < n; i++) {
    const fitted = x[i]!.reduce((s, v, j) => s + v * coef[j]!, 0);
    ssRes += (y[i]! - fitted) ** 2;
    ssTot += (y[i]! - my) ** 2;
  }
  return { coef, r2: ssTot === 0 ? 1 : 1 - ssRes / ssTot };
}
