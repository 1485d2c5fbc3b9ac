/**
 * X through a uniform binding, for the `cpu` profile's `unrolled` matmul at decode (its X loads
 * are the same for every invocation; kernels/matmul_bindings.ts `xBinding8`): how many vec4s of a
 * call site's X buffer such a binding can hold, and which of the kernel's row blocks fit in it.
 *
 * @module
 */

import type { GpuContext } from "../gpu/context.ts";
import { UNROLLED_BLOCKS, type XForm } from "./matmul_kernels.ts";
import { bindingBytes } from "./matmul_op.ts";

/** The fewest vec4s of X worth a uniform binding (256 bytes). */
const MIN_UNIFORM_X_VEC4S = 16;
/**
 * The most bytes of X bound as uniform (WebGPU's default limit, lavapipe's own), whatever larger
 * limit an adapter reports: a uniform array is a fixed-size type the shader compiler must lay out.
 */
const MAX_UNIFORM_X_BYTES = 65536;

/** vec4s per row of the buffer a call site reads X from (`swiglu`: gate and up, 2K). */
export function xRowVec4s(cols: number, xForm: XForm): number {
  return ((xForm === "swiglu" ? 2 : 1) * cols) / 4;
}

/**
 * How many vec4s of `x` the `unrolled` kernel can read through a uniform binding on `ctx` (0:
 * none): the largest power of two (at least 16) of vec4s that `x` holds and the device binds as
 * uniform (at most 64 KiB), when `x`'s buffer has `UNIFORM` usage and its offset the uniform
 * alignment.
 */
export function uniformXCapacity(ctx: GpuContext, x: GPUBufferBinding): number {
  if ((x.buffer.usage & GPUBufferUsage.UNIFORM) === 0) return 0;
  if ((x.offset ?? 0) % ctx.device.limits.minUniformBufferOffsetAlignment !== 0) return 0;
  const bytes = Math.min(
    bindingBytes(x),
    ctx.limits.maxUniformBufferBindingSize,
    MAX_UNIFORM_X_BYTES,
  );
  if (bytes < 16 * MIN_UNIFORM_X_VEC4S) return 0;
  return 2 ** Math.floor(Math.log2(bytes / 16));
}

/**
 * The `unrolled` row blocks some decode M of a call site runs with X in a uniform binding of
 * `xUniform` vec4s: those whose smallest M (one more than the block below) fits, X of `cols`
 * columns read as `xForm`.
 */
export function uniformXBlocks(cols: number, xForm: XForm, xUniform: number): number[] {
  const rowVec4s = xRowVec4s(cols, xForm);
  return UNROLLED_BLOCKS.filter((_, i) => {
    const smallest = i === 0 ? 1 : UNROLLED_BLOCKS[i - 1]! + 1;
    return smallest * rowVec4s <= xUniform;
  });
}
