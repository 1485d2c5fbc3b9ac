/**
 * `gelu_new`: GPT-2's tanh-approximated GELU, element-wise over f32, out of place or in place:
 * an {@linkcode Elementwise} op. See `gelu_new.wgsl` for the formula, bindings and grid.
 *
 * @module
 */

import source from "./gelu_new.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import { Elementwise, type ElementwiseOp, type ElementwiseSpec } from "./elementwise.ts";

/** Buffers of one `gelu_new` call site; fixed for the op's lifetime. */
export interface GeluNewBuffers {
  /** f32 `[count]`: the input; also the output when `out` is omitted (in place). */
  readonly input: GPUBufferBinding;
  /** f32 `[count]`: the activations. Omit to overwrite `input` (in place). */
  readonly out?: GPUBufferBinding;
}

const SPEC: ElementwiseSpec<GeluNewBuffers> = {
  name: "gelu_new",
  source,
  bindings: (b) => [b.input, b.out],
  inPlace: { name: "inp", binding: 0, outBinding: 1, inPlace: (b) => b.out === undefined },
  checkCapacity: true,
};

/**
 * The compiled `gelu_new` pipelines; `bind` makes call sites, whose `encode(pass, count)` applies
 * it to the first `count` elements, e.g. `tokens * 4 * hidden` (RangeError past the bound
 * buffers).
 */
export class GeluNew extends Elementwise<GeluNewBuffers, [count: number]> {
  constructor(ctx: GpuContext) {
    super(ctx, SPEC);
  }
}

/** One `gelu_new` call site: `encode(pass, count)`. */
export type GeluNewOp = ElementwiseOp<[count: number]>;
