/**
 * `silu_mul`: SwiGLU activation, `out = silu(gate) * up` over a fused `[tokens, 2 * inter]`
 * gate/up projection. See `silu_mul.wgsl` for bindings and grid.
 *
 * @module
 */

import source from "./silu_mul.wgsl" with { type: "text" };
import type { GpuContext } from "../engine/gpu/context.ts";
import type { ParamArena, ParamSlot } from "../engine/gpu/params.ts";
import { dispatch1d, groupsFor } from "./dispatch.ts";

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
    const slot = arena.allocate();
    const bindGroup = this.#ctx.device.createBindGroup({
      label: "silu_mul",
      layout: this.#pipeline.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: buffers.gateUp },
        { binding: 1, resource: buffers.out },
        { binding: 2, resource: slot.binding },
      ],
    });
    return new SiluMulOp(this.#pipeline, bindGroup, slot);
  }
}

/** One `silu_mul` call site. */
export class SiluMulOp {
  constructor(
    private readonly pipeline: GPUComputePipeline,
    private readonly bindGroup: GPUBindGroup,
    private readonly slot: ParamSlot,
  ) {}

  /** Encodes `out = silu(gate) * up` for `tokens` rows of width `inter`. */
  encode(pass: GPUComputePassEncoder, tokens: number, inter: number): void {
    this.slot.setU32(0, tokens, inter);
    pass.setPipeline(this.pipeline);
    pass.setBindGroup(0, this.bindGroup);
    dispatch1d(pass, groupsFor(tokens * inter, 256));
  }
}
