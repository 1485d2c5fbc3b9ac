/**
 * Least-squares fit of a straight line, used to calibrate the mock executor's latency model
 * `stepMs = a + b * batchedTokens` from step times measured on the WebGPU runner.
 *
 * @module
 */

/** One measurement: `y` (e.g. ms per step) at `x` (e.g. batched tokens). */
export interface FitPoint {
  readonly x: number;
  readonly y: number;
}

/** The fitted line `y = a + b * x` and its coefficient of determination. */
export interface LineFit {
  /** Intercept (ms per step at 0 tokens). */
  readonly a: number;
  /** Slope (ms per batched token). */
  readonly b: number;
  /** R^2 = 1 - SS_res / SS_tot (1 when every y is equal and fitted exactly). */
  readonly r2: number;
}

/**
 * Ordinary least squares over `points`: minimises the sum of (y - a - b x)^2.
 *
 * @throws {RangeError} with fewer than two points or when every x is equal (no slope).
 */
export function fitLine(points: readonly FitPoint[]): LineFit {
  const n = points.length;
  if (n < 2) throw new RangeError(`Cannot fit a line to ${n} point(s): need at least 2`);
  let sx = 0;
  let sy = 0;
  for (const p of points) {
    if (!Number.isFinite(p.x) || !Number.isFinite(p.y)) {
      throw new RangeError(`Cannot fit a line: point (${p.x}, ${p.y}) is not finite`);
    }
    sx += p.x;
    sy += p.y;
  }
  const mx = sx / n;
  const my = sy / n;
  let sxx = 0;
  let sxy = 0;
  let syy = 0;
  for (const p of points) {
    const dx = p.x - mx;
    const dy = p.y - my;
    sxx += dx * dx;
    sxy += dx * dy;
    syy += dy * dy;
  }
  if (sxx === 0) throw new RangeError(`Cannot fit a line: all ${n} points have x = ${mx}`);
  const b = sxy / sxx;
  const a = my - b * mx;
  let ssRes = 0;
  for (const p of points) ssRes += (p.y - a - b * p.x) ** 2;
  return { a, b, r2: syy === 0 ? 1 : 1 - ssRes / syy };
}
