/**
 * The shell every single-pipeline kernel call site shares: a bind group and a parameter slot,
 * both made once when the call site is bound, and a dispatch that sets them on a pass.
 *
 * @module
 */

import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena, ParamSlot } from "../gpu/params.ts";
import { dispatch1d } from "./dispatch.ts";

/** One bound call site of a kernel with one pipeline and a uniform parameter block. */
export class CallSite {
  /** The call site's 256-byte parameter slot (written before each dispatch). */
  readonly slot: ParamSlot;
  readonly #pipeline: GPUComputePipeline;
  readonly #bindGroup: GPUBindGroup;

  /**
   * Binds `resources[i]` to `@binding(i)` (undefined entries are left out, for variants that
   * declare fewer bindings) and the parameter slot to `@binding(resources.length)`.
   */
  constructor(
    ctx: GpuContext,
    arena: ParamArena,
    pipeline: GPUComputePipeline,
    label: string,
    resources: readonly (GPUBufferBinding | undefined)[],
  ) {
    this.slot = arena.allocate();
    const entries: GPUBindGroupEntry[] = [];
    resources.forEach((resource, binding) => {
      if (resource !== undefined) entries.push({ binding, resource });
    });
    entries.push({ binding: resources.length, resource: this.slot.binding });
    this.#pipeline = pipeline;
    this.#bindGroup = ctx.device.createBindGroup({
      label,
      layout: pipeline.getBindGroupLayout(0),
      entries,
    });
  }

  /** Sets the pipeline and bind group, then dispatches `groups` workgroups (1-D, folded). */
  dispatch(pass: GPUComputePassEncoder, groups: number): void {
    pass.setPipeline(this.#pipeline);
    pass.setBindGroup(0, this.#bindGroup);
    dispatch1d(pass, groups);
  }
}

/** f32 elements a buffer binding holds. */
export function f32Capacity(b: GPUBufferBinding): number {
  return Math.floor((b.size ?? b.buffer.size - (b.offset ?? 0)) / 4);
}
