/**
 * `add`: element-wise `out = a + b` over f32 tensors (GPT-2's residual connections), out of place
 * or in place (`a += b`): an {@linkcode Elementwise} op. See `add.wgsl` for bindings and grid.
 *
 * @module
 */

import source from "./add.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import { Elementwise, type ElementwiseOp, type ElementwiseSpec } from "./elementwise.ts";

/** Buffers of one `add` call site; fixed for the op's lifetime. */
export interface AddBuffers {
  /** f32 `[count]`: first operand; also the output when `out` is omitted (in place). */
  readonly a: GPUBufferBinding;
  /** f32 `[count]`: second operand. Must not overlap `a` or `out`. */
  readonly b: GPUBufferBinding;
  /** f32 `[count]`: the sum. Omit to add in place into `a`. */
  readonly out?: GPUBufferBinding;
}

const SPEC: ElementwiseSpec<AddBuffers> = {
  name: "add",
  source,
  bindings: (b) => [b.a, b.b, b.out],
  inPlace: { name: "a", binding: 0, outBinding: 2, inPlace: (b) => b.out === undefined },
  checkCapacity: true,
};

/**
 * The compiled `add` pipelines (in place, out of place); `bind` makes call sites, whose
 * `encode(pass, count)` adds the first `count` elements (RangeError past the bound buffers).
 */
export class Add extends Elementwise<AddBuffers, [count: number]> {
  constructor(ctx: GpuContext) {
    super(ctx, SPEC);
  }
}

/** One `add` call site: `encode(pass, count)`. */
export type AddOp = ElementwiseOp<[count: number]>;
