/**
 * Float64 references of RMSNorm (plain, per-head, fused residual add) and LayerNorm.
 *
 * @module
 */

/**
 * Row addressing shared with `kernels/rms_norm.ts`: row `(t, h)` covers
 * `[offset + t * tokenStride + h * cols, ... + cols)`.
 */
export interface RowLayout {
  readonly tokens: number;
  readonly heads: number;
  readonly cols: number;
  readonly tokenStride: number;
  readonly offset: number;
}

/** The dense `[tokens, cols]` layout. */
export function denseRows(tokens: number, cols: number): RowLayout {
  return { tokens, heads: 1, cols, tokenStride: cols, offset: 0 };
}

/** Calls `visit(start)` with the first element of every row of `layout`. */
export function forEachRow(layout: RowLayout, visit: (start: number) => void): void {
  for (let t = 0; t < layout.tokens; t++) {
    for (let h = 0; h < layout.heads; h++) {
      visit(layout.offset + t * layout.tokenStride + h * layout.cols);
    }
  }
}

/**
 * RMSNorm of every row of `layout` in `buffer`: `y = x / sqrt(mean(x^2) + eps) * w`. Returns a
 * copy of the whole buffer with those rows replaced (elements outside them are copied as is).
 */
export function rmsNormRef(
  buffer: ArrayLike<number>,
  weight: ArrayLike<number>,
  layout: RowLayout,
  eps: number,
): Float64Array {
  const out = Float64Array.from(buffer);
  const { cols } = layout;
  forEachRow(layout, (start) => {
    let sumSq = 0;
    for (let c = 0; c < cols; c++) sumSq += buffer[start + c]! ** 2;
    const scale = 1 / Math.sqrt(sumSq / cols + eps);
    for (let c = 0; c < cols; c++) out[start + c] = buffer[start + c]! * scale * weight[c]!;
  });
  return out;
}

/**
 * vLLM's fused_add_rms_norm: `residual += x; out = rmsNorm(residual) * w`, over the rows of
 * `layout`. Returns the updated residual and the normalised rows (as whole-buffer copies).
 */
export function fusedAddRmsNormRef(
  x: ArrayLike<number>,
  residual: ArrayLike<number>,
  weight: ArrayLike<number>,
  layout: RowLayout,
  eps: number,
): { residual: Float64Array; out: Float64Array } {
  const sum = Float64Array.from(residual);
  forEachRow(layout, (start) => {
    for (let c = 0; c < layout.cols; c++) sum[start + c] = residual[start + c]! + x[start + c]!;
  });
  return { residual: sum, out: rmsNormRef(sum, weight, layout, eps) };
}

/** LayerNorm of `[rows, cols]`: `(x - mean) / sqrt(var + eps) * w + b` (biased variance). */
export function layerNormRef(
  x: ArrayLike<number>,
  weight: ArrayLike<number>,
  bias: ArrayLike<number>,
  rows: number,
  cols: number,
  eps: number,
): Float64Array {
  const out = new Float64Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    let sum = 0;
    for (let c = 0; c < cols; c++) sum += x[r * cols + c]!;
    const mean = sum / cols;
    let sq = 0;
    for (let c = 0; c < cols; c++) sq += (x[r * cols + c]! - mean) ** 2;
    const invStd = 1 / Math.sqrt(sq / cols + eps);
    for (let c = 0; c < cols; c++) {
      out[r * cols + c] = (x[r * cols + c]! - mean) * invStd * weight[c]! + bias[c]!;
    }
  }
  return out;
}
