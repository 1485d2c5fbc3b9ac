/**
 * The one generic element-wise op behind `add`, `gelu_new` and `gather_rows`: a
 * kernel file that defines `element_count()` and `element(i)` (see `elementwise.wgsl`, the shared
 * entry point appended to it), compiled once, bound per call site, and dispatched with one
 * invocation per element. A kernel may also run in place: then an operand binding is declared
 * read_write and receives the result (`store_out`) instead of a separate `out` binding.
 *
 * @module
 */

import entryPoint from "./elementwise.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import { CallSite, f32Capacity } from "./call_site.ts";
import { groupsFor } from "./dispatch.ts";

/**
 * An operand that may also be the output. The generated prelude declares it at `binding` (f32,
 * read out of place, read_write in place), the output `out` at `outBinding` (out of place only)
 * and `fn store_out(i: u32, v: f32)`, which writes `out[i]` or the operand's element `i`.
 */
export interface InPlaceOperand<B> {
  /** WGSL name of the operand. */
  readonly name: string;
  /** Its binding index. */
  readonly binding: number;
  /** Binding index of `out` when the call site is out of place. */
  readonly outBinding: number;
  /** Whether a call site with these buffers writes into the operand. */
  readonly inPlace: (buffers: B) => boolean;
}

/** What makes an element-wise op of buffers `B`. */
export interface ElementwiseSpec<B> {
  /**
   * Kernel name: pipeline key and label (`<name>/in_place`, `<name>/out_of_place` for kernels
   * with an in-place operand), error messages.
   */
  readonly name: string;
  /** The kernel file: Params `p`, bindings, `element_count()` and `element(i)`. */
  readonly source: string;
  /**
   * The call site's buffers in `@binding` order (undefined entries are left out); the parameter
   * slot binds after them.
   */
  readonly bindings: (buffers: B) => readonly (GPUBufferBinding | undefined)[];
  /**
   * The operand an in-place call site writes (add's `a`, gelu_new's input); absent: always out
   * of place.
   */
  readonly inPlace?: InPlaceOperand<B>;
  /**
   * Whether {@linkcode ElementwiseOp.encode} checks the element count against the smallest bound
   * buffer (for kernels whose every buffer holds one f32 per element).
   */
  readonly checkCapacity?: boolean;
}

/** The WGSL declaring `operand` and `store_out`, in place or not. */
function inPlacePrelude<B>(operand: InPlaceOperand<B>, inPlace: boolean): string {
  const { name, binding, outBinding } = operand;
  return inPlace
    ? `@group(0) @binding(${binding}) var<storage, read_write> ${name}: array<f32>;\n` +
      `fn store_out(i: u32, v: f32) { ${name}[i] = v; }\n`
    : `@group(0) @binding(${binding}) var<storage, read> ${name}: array<f32>;\n` +
      `@group(0) @binding(${outBinding}) var<storage, read_write> out: array<f32>;\n` +
      "fn store_out(i: u32, v: f32) { out[i] = v; }\n";
}

/**
 * The compiled pipelines of one element-wise kernel (in place and out of place when it has an
 * in-place operand); {@linkcode Elementwise.bind} makes call sites. `Dims` are the sizes
 * {@linkcode ElementwiseOp.encode} takes: written to the parameter slot as u32 words 0, 1, ...,
 * their product being the number of elements.
 */
export class Elementwise<B, Dims extends readonly number[]> {
  readonly #ctx: GpuContext;
  readonly #spec: ElementwiseSpec<B>;
  readonly #pipelines: {
    readonly outOfPlace: GPUComputePipeline;
    readonly inPlace?: GPUComputePipeline;
  };

  constructor(ctx: GpuContext, spec: ElementwiseSpec<B>) {
    this.#ctx = ctx;
    this.#spec = spec;
    const operand = spec.inPlace;
    const compile = (key: string, prelude: string) =>
      ctx.pipeline(key, () => prelude + spec.source + entryPoint);
    this.#pipelines = operand === undefined ? { outOfPlace: compile(spec.name, "") } : {
      outOfPlace: compile(`${spec.name}/out_of_place`, inPlacePrelude(operand, false)),
      inPlace: compile(`${spec.name}/in_place`, inPlacePrelude(operand, true)),
    };
  }

  /** Creates a call site: its bind group and parameter slot are made once, here. */
  bind(arena: ParamArena, buffers: B): ElementwiseOp<Dims> {
    const spec = this.#spec;
    const inPlace = spec.inPlace?.inPlace(buffers) ?? false;
    const pipeline = inPlace ? this.#pipelines.inPlace! : this.#pipelines.outOfPlace;
    const label = spec.inPlace === undefined
      ? spec.name
      : `${spec.name}/${inPlace ? "in_place" : "out_of_place"}`;
    const resources = spec.bindings(buffers);
    const site = new CallSite(this.#ctx, arena, pipeline, label, resources);
    const capacity = spec.checkCapacity
      ? Math.min(...resources.map((r) => r === undefined ? Infinity : f32Capacity(r)))
      : Infinity;
    return new ElementwiseOp<Dims>(site, spec.name, capacity);
  }
}

/** One bound call site of an {@linkcode Elementwise} kernel. */
export class ElementwiseOp<Dims extends readonly number[]> {
  readonly #site: CallSite;
  readonly #name: string;

  constructor(
    site: CallSite,
    name: string,
    /** Largest element count the bound buffers hold (Infinity when the kernel does not check). */
    readonly capacity: number,
  ) {
    this.#site = site;
    this.#name = name;
  }

  /**
   * Encodes the kernel over the elements `dims` describe (e.g. `count` for add and gelu_new,
   * `rows, cols` for gather_rows): one invocation per element of
   * their product.
   *
   * @throws {RangeError} when the kernel checks capacity and a bound buffer holds fewer f32
   *   values than the elements.
   */
  encode(pass: GPUComputePassEncoder, ...dims: Dims): void {
    const count = dims.reduce((a, b) => a * b, 1);
    if (count > this.capacity) {
      throw new RangeError(
        `Cannot encode ${this.#name} of ${count} elements: the bound buffers hold ${this.capacity}`,
      );
    }
    this.#site.slot.setU32(0, ...dims);
    this.#site.dispatch(pass, groupsFor(count, 256));
  }
}
