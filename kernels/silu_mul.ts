/**
 * `silu_mul`: SwiGLU activation, `out = silu(gate) * up` over a fused `[tokens, 2 * inter]`
 * gate/up projection: an {@linkcode Elementwise} op. See `silu_mul.wgsl` for bindings and grid.
 *
 * @module
 */

import source from "./silu_mul.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import { Elementwise, type ElementwiseOp, type ElementwiseSpec } from "./elementwise.ts";

/** Buffers of one `silu_mul` call site; fixed for the op's lifetime. */
export interface SiluMulBuffers {
  /** f32 `[tokens, 2 * inter]`: gate values then up values per token. */
  readonly gateUp: GPUBufferBinding;
  /** f32 `[tokens, inter]`. */
  readonly out: GPUBufferBinding;
}

const SPEC: ElementwiseSpec<SiluMulBuffers> = {
  name: "silu_mul",
  source,
  bindings: (b) => [b.gateUp, b.out],
};

/**
 * The compiled `silu_mul` pipeline; `bind` makes call sites, whose
 * `encode(pass, tokens, inter)` computes `out = silu(gate) * up` for `tokens` rows of width
 * `inter`.
 */
export class SiluMul extends Elementwise<SiluMulBuffers, [tokens: number, inter: number]> {
  constructor(ctx: GpuContext) {
    super(ctx, SPEC);
  }
}

/** One `silu_mul` call site: `encode(pass, tokens, inter)`. */
export type SiluMulOp = ElementwiseOp<[tokens: number, inter: number]>;
