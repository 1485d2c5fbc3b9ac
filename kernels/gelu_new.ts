/**
 * `gelu_new`: GPT-2's tanh-approximated GELU, element-wise over f32, out of place or in place.
 * See `gelu_new.wgsl` for the formula, bindings and grid.
 *
 * @module
 */

import source from "./gelu_new.wgsl" with { type: "text" };
import type { GpuContext } from "../engine/gpu/context.ts";
import type { ParamArena, ParamSlot } from "../engine/gpu/params.ts";
import { dispatch1d, groupsFor } from "./dispatch.ts";

/** Buffers of one `gelu_new` call site; fixed for the op's lifetime. */
export interface GeluNewBuffers {
  /** f32 `[count]`: the input; also the output when `out` is omitted (in place). */
  readonly input: GPUBufferBinding;
  /** f32 `[count]`: the activations. Omit to overwrite `input` (in place). */
  readonly out?: GPUBufferBinding;
}

const PRELUDE = {
  outOfPlace: `@group(0) @binding(0) var<storage, read> inp: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
fn store_out(i: u32, v: f32) { out[i] = v; }
`,
  inPlace: `@group(0) @binding(0) var<storage, read_write> inp: array<f32>;
fn store_out(i: u32, v: f32) { inp[i] = v; }
`,
} as const;

/** The compiled `gelu_new` pipelines; {@linkcode GeluNew.bind} makes call sites. */
export class GeluNew {
  readonly #ctx: GpuContext;
  readonly #pipelines: Record<keyof typeof PRELUDE, GPUComputePipeline>;

  constructor(ctx: GpuContext) {
    this.#ctx = ctx;
    this.#pipelines = {
      outOfPlace: ctx.pipeline("gelu_new/out_of_place", () => PRELUDE.outOfPlace + source),
      inPlace: ctx.pipeline("gelu_new/in_place", () => PRELUDE.inPlace + source),
    };
  }

  /** Creates a call site: its bind group and parameter slot are made once, here. */
  bind(arena: ParamArena, buffers: GeluNewBuffers): GeluNewOp {
    const inPlace = buffers.out === undefined;
    const pipeline = inPlace ? this.#pipelines.inPlace : this.#pipelines.outOfPlace;
    const slot = arena.allocate();
    const entries: GPUBindGroupEntry[] = [{ binding: 0, resource: buffers.input }];
    if (buffers.out !== undefined) entries.push({ binding: 1, resource: buffers.out });
    entries.push({ binding: 2, resource: slot.binding });
    const bindGroup = this.#ctx.device.createBindGroup({
      label: inPlace ? "gelu_new/in_place" : "gelu_new/out_of_place",
      layout: pipeline.getBindGroupLayout(0),
      entries,
    });
    const capacity = Math.min(
      f32Capacity(buffers.input),
      buffers.out === undefined ? Infinity : f32Capacity(buffers.out),
    );
    return new GeluNewOp(pipeline, bindGroup, slot, capacity);
  }
}

/** One `gelu_new` call site. */
export class GeluNewOp {
  constructor(
    private readonly pipeline: GPUComputePipeline,
    private readonly bindGroup: GPUBindGroup,
    private readonly slot: ParamSlot,
    /** Largest `count` the bound buffers hold. */
    readonly capacity: number,
  ) {}

  /**
   * Encodes `out = gelu_new(input)` for the first `count` elements (e.g. `tokens * 4 * hidden`).
   *
   * @throws {RangeError} when a bound buffer holds fewer than `count` f32 values.
   */
  encode(pass: GPUComputePassEncoder, count: number): void {
    if (count > this.capacity) {
      throw new RangeError(
        `Cannot encode gelu_new of ${count} elements: the bound buffers hold ${this.capacity}`,
      );
    }
    this.slot.setU32(0, count);
    pass.setPipeline(this.pipeline);
    pass.setBindGroup(0, this.bindGroup);
    dispatch1d(pass, groupsFor(count, 256));
  }
}

function f32Capacity(b: GPUBufferBinding): number {
  return Math.floor((b.size ?? b.buffer.size - (b.offset ?? 0)) / 4);
}
