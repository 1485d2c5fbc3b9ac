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
import type { KvDtype } from "../../gpu/dtype.ts";

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

/**
 * Tolerance for attention over a KV cache of `dtype`: {@linkcode toleranceFor} its f16 / f32;
 * for fp8 the f32 one. The references read the cache's decoded values (every e4m3 value is exact
 * in f16 and f32) and the kernels compute in f32, so the 8-bit rounding is no error of theirs.
 */
export function kvTolerance(dtype: KvDtype): number {
  return toleranceFor(dtype === "fp8_e4m3" ? "f32" : dtype);
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

/**
 * Asserts that each `actual[i]`, `i` in `index`, a value a kernel computed in f32 and rounded
 * with `round` (monotone; e.g. to an fp8 cache's e4m3), is the rounding of a value within `slack`
 * of the float64 reference's unrounded `unrounded[i]`. Where the reference is farther than
 * `slack` from a rounding midpoint that is exactly its own rounding; within `slack` of one, the
 * kernel's f32 arithmetic may land on the other side, a whole step away (2^-3 relative for e4m3),
 * which neither an exact nor a normwise comparison could tell from an error. Pass as `slack` the
 * kernel's f32 error bound (its f32 results' tolerance times their largest magnitude). The
 * message names the first bad elements.
 */
export function assertRoundedWithin(
  actual: ArrayLike<number>,
  unrounded: ArrayLike<number>,
  index: Iterable<number>,
  slack: number,
  round: (x: number) => number,
  context: string,
): void {
  const bad: string[] = [];
  let n = 0;
  for (const i of index) {
    n++;
    const u = unrounded[i]!;
    const a = actual[i]!;
    if (!(a >= round(u - slack) && a <= round(u + slack)) && bad.length < 5) {
      bad.push(`[${i}] ${a} for ${u}`);
    }
  }
  if (bad.length > 0) {
    throw new AssertionError({
      message: `${context}: not the rounding of a value within ${
        slack.toExponential(2)
      } of the reference (n=${n}): ${bad.join(", ")}`,
    });
  }
}
