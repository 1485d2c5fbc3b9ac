/**
 * Comparison of GPU results with float64 references.
 *
 * The tolerance is a normwise relative error: `max_i |actual_i - expected_i| / max_i |expected_i|`
 * (the largest error measured against the largest reference magnitude). Every element is
 * compared; NaN or Infinity anywhere (e.g. an output element the kernel never wrote, left
 * poisoned with NaN) fails the check.
 *
 * Tolerances used across the suite: f32 weights 1e-4, f16 weights 3e-3.
 *
 * @module
 */

import { AssertionError } from "node:assert";

/**
 * Normwise relative error of `actual` against `expected` (see module doc); with `floor`, the
 * reference magnitude it is measured against is at least `floor`.
 */
export function relativeError(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  floor = 1e-30,
): number {
  if (actual.length !== expected.length) {
    throw new AssertionError({
      message: `length mismatch: actual ${actual.length}, expected ${expected.length}`,
    });
  }
  let maxErr = 0;
  let maxRef = 0;
  for (let i = 0; i < actual.length; i++) {
    const a = actual[i]!;
    const e = expected[i]!;
    if (!Number.isFinite(a)) return Infinity;
    maxErr = Math.max(maxErr, Math.abs(a - e));
    maxRef = Math.max(maxRef, Math.abs(e));
  }
  return maxErr / Math.max(maxRef, floor);
}

/**
 * Asserts `relativeError(actual, expected, floor) < tolerance`; the message names the first bad
 * index, the values there, and `context` (put the seed and shape in it). `floor` (default none)
 * bounds the reference magnitude from below: a result that cancels to near zero (e.g. one output
 * of a one-term sum `x w + b`) is then measured against the size of its terms, not its own.
 */
export function assertClose(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  tolerance: number,
  context: string,
  floor?: number,
): void {
  const err = relativeError(actual, expected, floor);
  if (err < tolerance) return;
  let worst = 0;
  let worstErr = -1;
  for (let i = 0; i < actual.length; i++) {
    const d = Number.isFinite(actual[i]!) ? Math.abs(actual[i]! - expected[i]!) : Infinity;
    if (d > worstErr) {
      worstErr = d;
      worst = i;
    }
  }
  throw new AssertionError({
    message: `${context}: relative error ${err.toExponential(3)} >= ${tolerance} ` +
      `(worst at [${worst}]: got ${actual[worst]}, expected ${
        expected[worst]
      }; n=${actual.length})`,
  });
}

/** Tolerance for results computed from weights of `dtype`. */
export function toleranceFor(dtype: "f32" | "f16"): number {
  return dtype === "f16" ? 3e-3 : 1e-4;
}

/** Fails when any of `got[from..)` is not NaN: an element of a poisoned buffer past the rows was written. */
export function assertUntouchedFrom(got: Float32Array, from: number, context: string): void {
  const written = got.findIndex((v, i) => i >= from && !Number.isNaN(v));
  if (written >= 0) {
    throw new AssertionError({
      message: `${context}: element ${written} past the rows was written`,
    });
  }
}
