/**
 * `add`: element-wise `out = a + b` over f32 tensors (GPT-2's residual connections), out of place
 * or in place (`a += b`). See `add.wgsl` for bindings and grid.
 *
 * @module
 */

import source from "./add.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import { CallSite, f32Capacity } from "./call_site.ts";
import { groupsFor } from "./dispatch.ts";

/** Buffers of one `add` call site; fixed for the op's lifetime. */
export interface AddBuffers {
  /** f32 `[count]`: first operand; also the output when `out` is omitted (in place). */
  readonly a: GPUBufferBinding;
  /** f32 `[count]`: second operand. Must not overlap `a` or `out`. */
  readonly b: GPUBufferBinding;
  /** f32 `[count]`: the sum. Omit to add in place into `a`. */
  readonly out?: GPUBufferBinding;
}

const PRELUDE = {
  outOfPlace: `@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
fn store_out(i: u32, v: f32) { out[i] = v; }
`,
  inPlace: `@group(0) @binding(0) var<storage, read_write> a: array<f32>;
fn store_out(i: u32, v: f32) { a[i] = v; }
`,
} as const;

/** The compiled `add` pipelines (in place, out of place); {@linkcode Add.bind} makes call sites. */
export class Add {
  readonly #ctx: GpuContext;
  readonly #pipelines: Record<keyof typeof PRELUDE, GPUComputePipeline>;

  constructor(ctx: GpuContext) {
    this.#ctx = ctx;
    this.#pipelines = {
      outOfPlace: ctx.pipeline("add/out_of_place", () => PRELUDE.outOfPlace + source),
      inPlace: ctx.pipeline("add/in_place", () => PRELUDE.inPlace + source),
    };
  }

  /** Creates a call site: its bind group and parameter slot are made once, here. */
  bind(arena: ParamArena, buffers: AddBuffers): AddOp {
    const inPlace = buffers.out === undefined;
    const pipeline = inPlace ? this.#pipelines.inPlace : this.#pipelines.outOfPlace;
    const site = new CallSite(
      this.#ctx,
      arena,
      pipeline,
      inPlace ? "add/in_place" : "add/out_of_place",
      [buffers.a, buffers.b, buffers.out],
    );
    const capacity = Math.min(
      f32Capacity(buffers.a),
      f32Capacity(buffers.b),
      buffers.out === undefined ? Infinity : f32Capacity(buffers.out),
    );
    return new AddOp(site, capacity);
  }
}

/** One `add` call site. */
export class AddOp {
  constructor(
    private readonly site: CallSite,
    /** Largest `count` the bound buffers hold. */
    readonly capacity: number,
  ) {}

  /**
   * Encodes `out[i] = a[i] + b[i]` for the first `count` elements.
   *
   * @throws {RangeError} when a bound buffer holds fewer than `count` f32 values.
   */
  encode(pass: GPUComputePassEncoder, count: number): void {
    if (count > this.capacity) {
      throw new RangeError(
        `Cannot encode add of ${count} elements: the bound buffers hold ${this.capacity}`,
      );
    }
    this.site.slot.setU32(0, count);
    this.site.dispatch(pass, groupsFor(count, 256));
  }
}
