/**
 * `layer_norm`: LayerNorm with weight and bias over dense f32 rows (GPT-2). See
 * `layer_norm.wgsl` for bindings and grid.
 *
 * @module
 */

import source from "./layer_norm.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import { weightPrelude } from "../gpu/dtype.ts";
import type { ParamArena, ParamSlot } from "../gpu/params.ts";
import type { GpuMatrix } from "../gpu/tensor.ts";
import { f32Capacity } from "./call_site.ts";
import { dispatch1d, groupsFor } from "./dispatch.ts";
import { type NormShape, normShapePrelude } from "./rms_norm.ts";

/** Buffers of one `layer_norm` call site; fixed for the op's lifetime. */
export interface LayerNormBuffers {
  /** WT (f16 or f32) `[1, cols]`, one part: the scale (gamma). */
  readonly weight: GpuMatrix;
  /** WT `[1, cols]`, one part, same dtype as `weight`: the shift (beta). */
  readonly bias: GpuMatrix;
  /** f32 `[rows, cols]`: the input. */
  readonly x: GPUBufferBinding;
  /** f32 `[rows, cols]`: the output. Must not overlap `x`. */
  readonly out: GPUBufferBinding;
}

/** The `layer_norm` kernel; {@linkcode LayerNorm.bind} makes call sites. */
export class LayerNorm {
  readonly #ctx: GpuContext;
  readonly #shape: { prelude: string; key: string; rowsPerWorkgroup: number };

  /**
   * Pipelines are compiled through `ctx.pipeline` on the first bind of each weight dtype (once
   * per context), never per step.
   *
   * @param shape workgroup shape; default `defaultNormShape` (kernels/rms_norm.ts) for the adapter.
   */
  constructor(ctx: GpuContext, shape: NormShape = {}) {
    this.#ctx = ctx;
    this.#shape = normShapePrelude(ctx, "layer_norm", shape);
  }

  /**
   * Creates a call site: its bind group and parameter slot are made once, here.
   *
   * @param eps added to the variance; default 1e-5 (GPT-2).
   * @throws {TypeError} when weight or bias is not a single-part `[1, cols]` matrix, or they
   *   differ in width or dtype.
   */
  bind(arena: ParamArena, buffers: LayerNormBuffers, eps = 1e-5): LayerNormOp {
    const { weight, bias } = buffers;
    for (const m of [weight, bias]) {
      if (m.rows !== 1 || m.parts.length !== 1) {
        throw new TypeError(
          `Cannot bind layer_norm: ${m.label} must be one [1, cols] part, got [${m.rows}, ${m.cols}] in ${m.parts.length} parts`,
        );
      }
    }
    if (bias.cols !== weight.cols || bias.dtype !== weight.dtype) {
      throw new TypeError(
        `Cannot bind layer_norm: bias is ${bias.dtype} [${bias.cols}], weight is ${weight.dtype} [${weight.cols}]`,
      );
    }
    const shape = this.#shape;
    const pipeline = this.#ctx.pipeline(
      `layer_norm/${weight.dtype}/${shape.key}`,
      () => weightPrelude(weight.dtype) + shape.prelude + source,
    );
    const slot = arena.allocate();
    const bindGroup = this.#ctx.device.createBindGroup({
      label: "layer_norm",
      layout: pipeline.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: slot.binding },
        { binding: 1, resource: { buffer: weight.parts[0]!.buffer } },
        { binding: 2, resource: { buffer: bias.parts[0]!.buffer } },
        { binding: 3, resource: buffers.x },
        { binding: 4, resource: buffers.out },
      ],
    });
    const capacity = Math.min(f32Capacity(buffers.x), f32Capacity(buffers.out));
    return new LayerNormOp(pipeline, bindGroup, slot, {
      cols: weight.cols,
      eps,
      capacity,
      rowsPerWorkgroup: shape.rowsPerWorkgroup,
    });
  }
}

/** One `layer_norm` call site. */
export class LayerNormOp {
  constructor(
    private readonly pipeline: GPUComputePipeline,
    private readonly bindGroup: GPUBindGroup,
    private readonly slot: ParamSlot,
    private readonly bound: {
      readonly cols: number;
      readonly eps: number;
      readonly capacity: number;
      readonly rowsPerWorkgroup: number;
    },
  ) {}

  /** Row width (the weight's). */
  get cols(): number {
    return this.bound.cols;
  }

  /**
   * Encodes the norm of `rows` rows of width {@linkcode LayerNormOp.cols}.
   *
   * @throws {RangeError} when `rows * cols` exceeds a bound buffer.
   */
  encode(pass: GPUComputePassEncoder, rows: number): void {
    const { cols, eps, capacity, rowsPerWorkgroup } = this.bound;
    if (rows * cols > capacity) {
      throw new RangeError(
        `Cannot encode layer_norm of ${rows} rows of ${cols}: the bound buffers hold ${capacity} elements`,
      );
    }
    this.slot.setU32(0, rows, cols).setF32(2, eps);
    pass.setPipeline(this.pipeline);
    pass.setBindGroup(0, this.bindGroup);
    dispatch1d(pass, groupsFor(rows, rowsPerWorkgroup));
  }
}
