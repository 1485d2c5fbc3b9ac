/**
 * `silu_mul`: SwiGLU activation, `out = silu(gate) * up` over a fused `[tokens, 2 * inter]`
 * gate/up projection. See `silu_mul.wgsl` for bindings and grid.
 *
 * @module
 */

import source from "./silu_mul.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import { CallSite } from "./call_site.ts";
import { groupsFor } from "./dispatch.ts";

/** Buffers of one `silu_mul` call site; fixed for the op's lifetime. */
export interface SiluMulBuffers {
  /** f32 `[tokens, 2 * inter]`: gate values then up values per token. */
  readonly gateUp: GPUBufferBinding;
  /** f32 `[tokens, inter]`. */
  readonly out: GPUBufferBinding;
}

/** The compiled `silu_mul` pipeline; {@linkcode SiluMul.bind} makes call sites. */
export class SiluMul {
  readonly #ctx: GpuContext;
  readonly #pipeline: GPUComputePipeline;

  constructor(ctx: GpuContext) {
    this.#ctx = ctx;
    this.#pipeline = ctx.pipeline("silu_mul", () => source);
  }

  /** Creates a call site: its bind group and parameter slot are made once, here. */
  bind(arena: ParamArena, buffers: SiluMulBuffers): SiluMulOp {
    return new SiluMulOp(
      new CallSite(this.#ctx, arena, this.#pipeline, "silu_mul", [buffers.gateUp, buffers.out]),
    );
  }
}

/** One `silu_mul` call site. */
export class SiluMulOp {
  constructor(private readonly site: CallSite) {}

  /** Encodes `out = silu(gate) * up` for `tokens` rows of width `inter`. */
  encode(pass: GPUComputePassEncoder, tokens: number, inter: number): void {
    this.site.slot.setU32(0, tokens, inter);
    this.site.dispatch(pass, groupsFor(tokens * inter, 256));
  }
}
