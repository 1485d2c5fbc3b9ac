/**
 * The checks of a matmul call site's buffers against the kernels that will run it, before
 * {@linkcode Matmul.bind} makes the call site: weight dtype and row stride, bias, `ldy`, the norm
 * of a norm X form, and how many rows of X the buffers hold.
 *
 * @module
 */

import type { DType } from "../gpu/dtype.ts";
import { isNormXForm, type MatmulPolicy, type XForm } from "./matmul_kernels.ts";
import { bindingBytes, type MatmulBuffers } from "./matmul_op.ts";

/** What the checks need of the {@linkcode Matmul} binding the call site. */
export interface CallSiteKernel {
  readonly dtype: DType;
  readonly bias: boolean;
  readonly policy: MatmulPolicy;
  /** Whether the policy's kernels read X as the RMSNorm of the residual stream. */
  readonly readsNorm: boolean;
}

/** A checked call site: the row stride of Y, the most rows of X its buffers hold, the X form. */
export interface CheckedCallSite {
  readonly ldy: number;
  readonly maxRows: number;
  readonly xForm: XForm;
}

/**
 * Checks `buffers` for `kernel`.
 *
 * @throws {TypeError} when the weight dtype, the bias presence or the norm does not match.
 * @throws {RangeError} when the weight row stride is not a multiple of 4, `ldy < N`, or a
 *   buffer cannot hold one row.
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
  return { ldy, maxRows: Math.min(xRows, yRows), xForm };
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
