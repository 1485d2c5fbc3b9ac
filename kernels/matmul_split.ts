/**
 * Split-K for the `tiled` matmul (a tile's `sk`, kernels/matmul_tile.ts): the K steps of each tile
 * of Y divided among `sk` workgroups, which write partial sums to a buffer shared by every call
 * site of a context, and a second dispatch (matmul_split_reduce.wgsl) that adds them up, scales by
 * the row's RMSNorm factor (norm X forms) and adds the bias. For grids of few workgroups: at a
 * decode batch of 64 a 64 x 64 tile gives an N = 1,024 projection 16 workgroups, and each walks
 * all of K.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../gpu/context.ts";
import { biasBinding } from "./matmul_bindings.ts";
import { MAX_GROUPS_PER_DIM } from "./dispatch.ts";
import ioSource from "./matmul_io.wgsl" with { type: "text" };
import reduceSource from "./matmul_split_reduce.wgsl" with { type: "text" };

export { reduceSource as SPLIT_REDUCE_SOURCE };

/**
 * The most bytes of the partial buffer (`[sk, M, ldy]` partial sums and `[sk, M]` sums of
 * squares, f32): a call site whose M needs more runs its tile unsplit.
 */
export const SPLIT_SCRATCH_BYTES = 64 * 1024 * 1024;

/** Invocations per workgroup of the reduce (one output each). */
export const SPLIT_REDUCE_WG = 64;

const scratches = new WeakMap<GpuContext, GPUBuffer>();

/**
 * Bytes of `ctx`'s partial buffer: {@linkcode SPLIT_SCRATCH_BYTES}, or less where the context
 * binds less.
 */
export function splitScratchBytes(ctx: GpuContext): number {
  return Math.min(SPLIT_SCRATCH_BYTES, ctx.maxBindingBytes, ctx.limits.maxBufferSize);
}

/**
 * `ctx`'s partial buffer, created on first use and shared by its call sites (their dispatches
 * run one after another; each split matmul's reduce reads it before the next matmul writes it).
 * It lives as long as the context's device.
 */
export function splitScratch(ctx: GpuContext): GPUBuffer {
  let buffer = scratches.get(ctx);
  if (buffer === undefined) {
    buffer = ctx.createBuffer("matmul-split-partials", splitScratchBytes(ctx), STORAGE_RW);
    scratches.set(ctx, buffer);
  }
  return buffer;
}

/**
 * Whether `split` K slices of `m` rows of a Y of row stride `ldy` fit in `ctx`'s partial buffer
 * (and the reduce's grid: one row of X per workgroup row).
 */
export function splitFits(ctx: GpuContext, split: number, m: number, ldy: number): boolean {
  return split * m * (ldy + 1) * 4 <= splitScratchBytes(ctx) && m <= MAX_GROUPS_PER_DIM;
}

/**
 * The reduce's WGSL for `split` slices, with or without bias, with or without a row statistic
 * (`stat`: the norm X forms).
 */
export function splitReduceCode(split: number, bias: boolean, stat: boolean): string {
  return `const SPLIT = ${split}u;\nconst STAT = ${stat};\n` + biasBinding(bias) + ioSource +
    reduceSource;
}
