/**
 * `gather_rows`: `out[i] = src[indices[i]]` row by row. See `gather_rows.wgsl` for bindings and
 * grid.
 *
 * @module
 */

import source from "./gather_rows.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import { CallSite } from "./call_site.ts";
import { groupsFor } from "./dispatch.ts";

/** Buffers of one `gather_rows` call site; fixed for the op's lifetime. */
export interface GatherRowsBuffers {
  /** f32 `[srcRows, cols]`. */
  readonly src: GPUBufferBinding;
  /** u32 `[rows]`: source row of each output row. */
  readonly indices: GPUBufferBinding;
  /** f32 `[rows, cols]` (output). */
  readonly out: GPUBufferBinding;
}

/** The compiled `gather_rows` pipeline; {@linkcode GatherRows.bind} makes call sites. */
export class GatherRows {
  readonly #ctx: GpuContext;
  readonly #pipeline: GPUComputePipeline;

  constructor(ctx: GpuContext) {
    this.#ctx = ctx;
    this.#pipeline = ctx.pipeline("gather_rows", () => source);
  }

  /** Creates a call site: its bind group and parameter slot are made once, here. */
  bind(arena: ParamArena, buffers: GatherRowsBuffers): GatherRowsOp {
    return new GatherRowsOp(
      new CallSite(this.#ctx, arena, this.#pipeline, "gather_rows", [
        buffers.src,
        buffers.indices,
        buffers.out,
      ]),
    );
  }
}

/** One `gather_rows` call site. */
export class GatherRowsOp {
  constructor(private readonly site: CallSite) {}

  /** Encodes the copy of `rows` rows of width `cols`. */
  encode(pass: GPUComputePassEncoder, rows: number, cols: number): void {
    this.site.slot.setU32(0, rows, cols);
    this.site.dispatch(pass, groupsFor(rows * cols, 256));
  }
}
