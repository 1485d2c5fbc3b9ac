/**
 * `gather_rows`: `out[i] = src[indices[i]]` row by row: an {@linkcode Elementwise} op (one
 * invocation per output element). See `gather_rows.wgsl` for bindings and grid.
 *
 * @module
 */

import source from "./gather_rows.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import { Elementwise, type ElementwiseOp, type ElementwiseSpec } from "./elementwise.ts";

/** Buffers of one `gather_rows` call site; fixed for the op's lifetime. */
export interface GatherRowsBuffers {
  /** f32 `[srcRows, cols]`. */
  readonly src: GPUBufferBinding;
  /** u32 `[rows]`: source row of each output row. */
  readonly indices: GPUBufferBinding;
  /** f32 `[rows, cols]` (output). */
  readonly out: GPUBufferBinding;
}

const SPEC: ElementwiseSpec<GatherRowsBuffers> = {
  name: "gather_rows",
  source,
  bindings: (b) => [b.src, b.indices, b.out],
};

/**
 * The compiled `gather_rows` pipeline; `bind` makes call sites, whose
 * `encode(pass, rows, cols)` copies `rows` rows of width `cols`.
 */
export class GatherRows extends Elementwise<GatherRowsBuffers, [rows: number, cols: number]> {
  constructor(ctx: GpuContext) {
    super(ctx, SPEC);
  }
}

/** One `gather_rows` call site: `encode(pass, rows, cols)`. */
export type GatherRowsOp = ElementwiseOp<[rows: number, cols: number]>;
