/**
 * `gelu_new`: GPT-2's tanh-approximated GELU, element-wise over f32, out of place or in place.
 * See `gelu_new.wgsl` for the formula, bindings and grid.
 *
 * @module
 */

import source from "./gelu_new.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import { CallSite, f32Capacity } from "./call_site.ts";
import { groupsFor } from "./dispatch.ts";

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
    const site = new CallSite(
      this.#ctx,
      arena,
      pipeline,
      inPlace ? "gelu_new/in_place" : "gelu_new/out_of_place",
      [buffers.input, buffers.out],
    );
    const capacity = Math.min(
      f32Capacity(buffers.input),
      buffers.out === undefined ? Infinity : f32Capacity(buffers.out),
    );
    return new GeluNewOp(site, capacity);
  }
}

/** One `gelu_new` call site. */
export class GeluNewOp {
  constructor(
    private readonly site: CallSite,
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
    this.site.slot.setU32(0, count);
    this.site.dispatch(pass, groupsFor(count, 256));
  }
}
