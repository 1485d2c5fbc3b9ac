/**
 * The checks of a matmul call site's buffers against the kernels that will run it, before
 * {@linkcode Matmul.bind} makes the call site: weight dtype and row stride, bias, `ldy`, the norm
 * of a norm X form, the row factor of `"rms_partials"`, the outputs of `"residual_rms"`, and how
 * many rows of X the buffers hold.
 *
 * @module
 */

import type { DType } from "../gpu/dtype.ts";
import { isNormXForm, type MatmulPolicy, type XForm, type YForm } from "./matmul_kernels.ts";
import { normPartialsPerRow } from "./matmul_bindings.ts";
import { bindingBytes, type MatmulBuffers } from "./matmul_op.ts";

/** What the checks need of the {@linkcode Matmul} binding the call site. */
export interface CallSiteKernel {
  readonly dtype: DType;
  readonly bias: boolean;
  readonly policy: MatmulPolicy;
  /** Whether the policy's kernels read X as the RMSNorm of the residual stream. */
  readonly readsNorm: boolean;
}

/**
 * A checked call site: the row stride of Y, the most rows of X its buffers hold, the X and Y
 * forms.
 */
export interface CheckedCallSite {
  readonly ldy: number;
  readonly maxRows: number;
  readonly xForm: XForm;
  readonly yForm: YForm;
}

/**
 * Checks `buffers` for `kernel`.
 *
 * @throws {TypeError} when the weight dtype, the bias presence, the norm, the row factor or the
 *   residual outputs do not match.
 * @throws {RangeError} when the weight row stride is not a multiple of 4 (8 for the forms only
 *   `unrolled` runs), `ldy < N`, a buffer cannot hold one row, or an output aliases another
 *   buffer of the call site.
 */
export function checkCallSite(buffers: MatmulBuffers, kernel: CallSiteKernel): CheckedCallSite {
  const w = buffers.weight;
  if (w.quant === null && w.dtype !== kernel.dtype) {
    throw new TypeError(
      `Cannot bind matmul: weight ${w.label} is ${w.dtype}, kernel is ${kernel.dtype}`,
    );
  }
  if (w.rowStride % 4 !== 0) {
    throw new RangeError(
      `Cannot bind matmul: weight ${w.label} has row stride ${w.rowStride}, not a multiple of 4 ` +
        `(create it with padColsTo: 4)`,
    );
  }
  if (kernel.bias !== (buffers.bias !== undefined)) {
    throw new TypeError(
      `Cannot bind matmul: kernel was created ${kernel.bias ? "with" : "without"} bias, ` +
        `bias buffer ${buffers.bias === undefined ? "missing" : "given"}`,
    );
  }
  const ldy = buffers.ldy ?? w.rows;
  if (!Number.isInteger(ldy) || ldy < w.rows) {
    throw new RangeError(`Cannot bind matmul: ldy ${ldy} is less than N = ${w.rows}`);
  }
  const xForm = buffers.xForm ?? "plain";
  // A SwiGLU X row holds gate and up: 2K values.
  const xCols = xForm === "swiglu" ? 2 * w.cols : w.cols;
  const xRows = Math.min(
    Math.floor(bindingBytes(buffers.x) / (4 * xCols)),
    normRows(buffers, xForm, kernel),
    rowNormRows(buffers, xForm, kernel),
    residualRows(buffers, ldy, kernel),
  );
  const yRows = Math.floor((bindingBytes(buffers.y) / 4 - w.rows) / ldy) + 1;
  if (xRows < 1) {
    throw new RangeError(
      `Cannot bind matmul: x holds ${
        bindingBytes(buffers.x)
      } bytes, less than one row of ${xCols} values (K = ${w.cols}, X ${xForm})`,
    );
  }
  if (bindingBytes(buffers.y) < 4 * w.rows) {
    throw new RangeError(
      `Cannot bind matmul: y holds ${
        bindingBytes(buffers.y)
      } bytes, less than one row of N = ${w.rows}`,
    );
  }
  if (buffers.bias !== undefined && bindingBytes(buffers.bias) < 4 * w.rows) {
    throw new RangeError(
      `Cannot bind matmul: bias holds ${bindingBytes(buffers.bias)} bytes, N = ${w.rows} needs ${
        4 * w.rows
      }`,
    );
  }
  const yForm = buffers.residual === undefined ? "plain" : "residual_rms";
  return { ldy, maxRows: Math.min(xRows, yRows), xForm, yForm };
}

/** Throws unless `kernel` runs `unrolled` on the call site's weight (`what` needs it). */
function checkUnrolled(buffers: MatmulBuffers, kernel: CallSiteKernel, what: string): void {
  if (kernel.policy !== "cpu") {
    throw new TypeError(
      `Cannot bind matmul with ${what}: only the cpu policy's kernel (unrolled) has it`,
    );
  }
  const stride = buffers.weight.rowStride;
  if (stride % 8 !== 0) {
    throw new RangeError(
      `Cannot bind matmul with ${what}: weight row stride ${stride} is not a multiple of 8 ` +
        "(unrolled)",
    );
  }
}

/**
 * Checks the row factor of X form `"rms_partials"` and returns the rows its partial sums hold
 * (Infinity without it).
 */
function rowNormRows(buffers: MatmulBuffers, xForm: XForm, kernel: CallSiteKernel): number {
  const rowNorm = buffers.rowNorm;
  if ((rowNorm !== undefined) !== (xForm === "rms_partials")) {
    throw new TypeError(
      `Cannot bind matmul with X ${xForm}: a row norm goes with X rms_partials and only with it`,
    );
  }
  if (rowNorm === undefined) return Infinity;
  checkUnrolled(buffers, kernel, "X rms_partials");
  return Math.floor(bindingBytes(rowNorm.partials) / (4 * normPartialsPerRow(buffers.weight.cols)));
}

/**
 * Checks the outputs of the `"residual_rms"` form and returns the rows they hold (Infinity
 * without them).
 */
function residualRows(buffers: MatmulBuffers, ldy: number, kernel: CallSiteKernel): number {
  const out = buffers.residual;
  if (out === undefined) return Infinity;
  const what = "Y residual_rms";
  checkUnrolled(buffers, kernel, what);
  const w = buffers.weight;
  if (w.parts.length !== 1) {
    throw new RangeError(
      `Cannot bind matmul with ${what}: weight ${w.label} is in ${w.parts.length} parts, not one`,
    );
  }
  if (out.weight.cols !== w.rows || out.weight.dtype !== kernel.dtype) {
    throw new TypeError(
      `Cannot bind matmul with ${what}: needs a norm weight [1, ${w.rows}] of ${kernel.dtype}`,
    );
  }
  const written = [out.normed.buffer, out.partials.buffer];
  const read = [buffers.x.buffer, buffers.y.buffer, buffers.rowNorm?.partials.buffer];
  if (written[0] === written[1] || written.some((b) => read.includes(b))) {
    throw new RangeError(
      `Cannot bind matmul with ${what}: normed and partials must be buffers of their own`,
    );
  }
  const normedRows = Math.floor((bindingBytes(out.normed) / 4 - w.rows) / ldy) + 1;
  const partialRows = Math.floor(bindingBytes(out.partials) / (4 * normPartialsPerRow(w.rows)));
  if (normedRows < 1 || partialRows < 1) {
    throw new RangeError(
      `Cannot bind matmul with ${what}: normed (${bindingBytes(out.normed)} bytes) or partials ` +
        `(${bindingBytes(out.partials)} bytes) cannot hold one row of N = ${w.rows}`,
    );
  }
  return Math.min(normedRows, partialRows);
}

/**
 * Checks the norm of a norm X form and returns the rows of K values its `delta` and `out`
 * hold (Infinity without them).
 */
function normRows(buffers: MatmulBuffers, xForm: XForm, kernel: CallSiteKernel): number {
  const norm = buffers.norm;
  if (!isNormXForm(xForm)) {
    if (norm !== undefined) {
      throw new TypeError(`Cannot bind matmul: a norm is given but X is read as ${xForm}`);
    }
    return Infinity;
  }
  if (!kernel.readsNorm) {
    throw new TypeError(
      `Cannot bind matmul with X ${xForm}: the ${kernel.policy} policy's kernels do not read ` +
        `the norm (run rms_norm before the matmul)`,
    );
  }
  const k = buffers.weight.cols;
  if (norm === undefined || norm.weight.cols !== k || norm.weight.dtype !== kernel.dtype) {
    throw new TypeError(
      `Cannot bind matmul with X ${xForm}: needs a norm weight [1, ${k}] of ${kernel.dtype}`,
    );
  }
  const residual = xForm === "rms_residual";
  if ((norm.delta !== undefined) !== residual || (norm.out !== undefined) !== residual) {
    throw new TypeError(
      `Cannot bind matmul with X ${xForm}: delta and out are ${
        residual ? "required" : "only for rms_residual"
      }`,
    );
  }
  if (!residual) return Infinity;
  if (norm.out!.buffer === buffers.x.buffer) {
    throw new RangeError("Cannot bind matmul with X rms_residual: out must not be x's buffer");
  }
  return Math.floor(Math.min(bindingBytes(norm.delta!), bindingBytes(norm.out!)) / (4 * k));
}
