/**
 * One bound call site of {@linkcode Matmul} (kernels/matmul.ts): its buffers, the norm of a norm
 * X form, one parameter slot per weight part, and the bind groups of each kernel it may run.
 *
 * @module
 */

import type { ParamSlot } from "../gpu/params.ts";
import type { WordLayout } from "../gpu/quant.ts";
import { type GpuMatrix, partResource } from "../gpu/tensor.ts";
import { MAX_GROUPS_PER_DIM, noteWork } from "./dispatch.ts";
import type { Matmul } from "./matmul.ts";
import type { MatmulShape } from "./matmul_tuning.ts";
import type { TileConfig } from "./matmul_tile.ts";
import { SPLIT_REDUCE_WG } from "./matmul_split.ts";
import {
  isNormXForm,
  type MatmulVariant,
  type WeightFormat,
  type XForm,
  type YForm,
} from "./matmul_kernels.ts";

/**
 * The RMSNorm a call site with X form `"rms"` / `"rms_residual"` applies to its X binding (the
 * residual stream h): `X = r * gamma / sqrt(mean(r^2) + eps)`, `r = h` or `r = h + delta`.
 */
export interface MatmulNorm {
  /** `[1, K]` norm weight, of the {@linkcode Matmul}'s dtype. */
  readonly weight: GpuMatrix;
  readonly eps: number;
  /** f32 `[M, K]` added to h (`"rms_residual"` only). */
  readonly delta?: GPUBufferBinding;
  /**
   * f32 `[M, K]`, not `x`: receives `h + delta`, the residual stream's next buffer
   * (`"rms_residual"` only).
   */
  readonly out?: GPUBufferBinding;
}

/**
 * The row factor of X form `"rms_partials"`: X holds `h * gamma`, and each row's dot products are
 * scaled by `rsqrt(sum of its partial sums of squares / K + eps)`.
 */
export interface MatmulRowNorm {
  readonly eps: number;
  /**
   * f32 `[M, ceil(K / NORM_PARTIAL_ROWS)]`: the sums of squares of h per row, as a
   * `"residual_rms"` call site wrote them (kernels/matmul_bindings.ts).
   */
  readonly partials: GPUBufferBinding;
}

/**
 * What a `"residual_rms"` call site writes beside the residual stream (its y, `h += X W^T`): the
 * next RMSNorm's input, for a call site with X form `"rms_partials"` to read.
 */
export interface MatmulResidualNorm {
  /** `[1, N]` weight of the next norm, of the {@linkcode Matmul}'s dtype. */
  readonly weight: GpuMatrix;
  /** f32 `[M, ldy]`, not y's buffer: receives `h * gamma`. */
  readonly normed: GPUBufferBinding;
  /** f32 `[M, ceil(N / NORM_PARTIAL_ROWS)]`: receives the sums of squares of h per row. */
  readonly partials: GPUBufferBinding;
}

/** Buffers of one matmul call site; fixed for the op's lifetime. */
export interface MatmulBuffers {
  /**
   * f32 `[M, K]` (row stride K, K = `weight.cols`), for every M the op will be encoded with; with
   * `xForm: "swiglu"`, f32 `[M, 2K]` (per row K gate values then K up values); with a norm X
   * form, the residual stream h `[M, K]`.
   */
  readonly x: GPUBufferBinding;
  /** How X is read (see {@linkcode XForm}); default `"plain"`. */
  readonly xForm?: XForm;
  /** The norm of a `"rms"` / `"rms_residual"` X form (required exactly with those forms). */
  readonly norm?: MatmulNorm;
  /** The row factor of X form `"rms_partials"` (required exactly with it). */
  readonly rowNorm?: MatmulRowNorm;
  /**
   * Makes the call site's output form `"residual_rms"` (`unrolled`, one weight part): y is then
   * the residual stream, added to, and this receives the next norm's input.
   */
  readonly residual?: MatmulResidualNorm;
  /**
   * `[N, K]` weight (`[out, in]`): f16 or f32 created with `padColsTo: 4`, or quantized
   * (`GpuMatrix.createQuantized`).
   */
  readonly weight: GpuMatrix;
  /** f32 `[N]`; required exactly when the {@linkcode Matmul} was created with `bias: true`. */
  readonly bias?: GPUBufferBinding;
  /**
   * f32 `[M, ldy]`; columns `[0, N)` of each row are written (with `residual`: added to), the
   * others are left untouched.
   */
  readonly y: GPUBufferBinding;
  /** Row stride of `y` in elements (>= N), to write into a wider buffer; default N. */
  readonly ldy?: number;
}

/** Per-call options of {@linkcode MatmulOp.encode}. */
export interface MatmulEncodeOptions {
  /** Forces a kernel instead of the policy's choice (tests, benchmarks). */
  readonly variant?: MatmulVariant;
  /** Forces the weight rows per `gemv` invocation (tests, the kernel tuning). */
  readonly gemvRows?: number;
  /** Forces the weights per `gemv` invocation per step, 4 or 8 (tests, the kernel tuning). */
  readonly gemvStep?: number;
  /** Forces the `gemv` invocations per weight row, 64 or 32 (tests, the kernel tuning). */
  readonly gemvTpr?: number;
  /**
   * Forces the most rows of X one `gemv` workgroup takes (one of `ROW_BLOCKS`; more rows run
   * in grid z) (tests, the kernel tuning).
   */
  readonly gemvXRows?: number;
}

/** One compiled kernel configuration and how to size its grid. */
export interface KernelConfig {
  readonly key: string;
  readonly variant: MatmulVariant;
  /** The weight format the kernel reads. */
  readonly format: WeightFormat;
  /** Rows per block of the quantized words it reads (gpu/quant.ts); 1 for f16 / f32. */
  readonly wordLayout: WordLayout;
  /** How the kernel reads X. */
  readonly xForm: XForm;
  /** What the kernel does with its output. */
  readonly yForm: YForm;
  /** Whether the kernel reads X as vec4s (`unrolled` and `gemv`; needs K % 4 == 0). */
  readonly xVec4: boolean;
  /**
   * vec4s of X the kernel reads through a uniform binding (`unrolled` only); 0: X is a storage
   * binding.
   */
  readonly xUniform: number;
  /** Whether it reads weights in 8-element steps (needs a row stride that is a multiple of 8). */
  readonly steps8: boolean;
  readonly pipeline: GPUComputePipeline;
  /** Weight rows covered by one workgroup. */
  readonly rowsPerGroup: number;
  /** X rows covered by one workgroup (grid z). */
  readonly mPerGroup: number;
  /** K slices per tile of Y (`tiled` split-K; grid z holds `split` per `mPerGroup` rows), or 1. */
  readonly split: number;
  /** With `split > 1`: the second dispatch, adding the slices up (kernels/matmul_split.ts). */
  readonly reduce: GPUComputePipeline | null;
  /** The tile (`tiled` only). */
  readonly tile?: TileConfig;
}

/** Bytes a binding exposes. */
export function bindingBytes(b: GPUBufferBinding): number {
  return b.size ?? b.buffer.size - (b.offset ?? 0);
}

/** One matmul call site: a weight, its input and output buffers, one parameter slot per part. */
export class MatmulOp {
  /** Largest M the bound `x` and `y` buffers can hold. */
  readonly maxRows: number;
  readonly #matmul: Matmul;
  readonly #device: GPUDevice;
  readonly #buffers: MatmulBuffers;
  readonly #slots: readonly ParamSlot[];
  readonly #ldy: number;
  /** The weight's bytes on the device (what one encode reads of it). */
  readonly #weightBytes: number;
  /** vec4s of X a uniform binding holds ({@linkcode Matmul.uniformXCapacity}); 0: none. */
  readonly #xUniform: number;
  readonly #groups = new Map<string, GPUBindGroup[]>();
  /**
   * The last encode's choice: re-used while m, the forced variant and the matmul's tuning
   * (generation) repeat (decode).
   */
  #last: {
    m: number;
    variant?: MatmulVariant;
    gemvRows?: number;
    gemvStep?: number;
    gemvTpr?: number;
    gemvXRows?: number;
    generation: number;
    config: KernelConfig;
    groups: GPUBindGroup[];
  } | null = null;

  /** @internal Use {@linkcode Matmul.bind}. */
  constructor(
    matmul: Matmul,
    device: GPUDevice,
    buffers: MatmulBuffers,
    slots: readonly ParamSlot[],
    ldy: number,
    maxRows: number,
    xUniform: number,
  ) {
    this.#matmul = matmul;
    this.#xUniform = xUniform;
    this.#device = device;
    this.#buffers = buffers;
    this.#slots = slots;
    this.#ldy = ldy;
    this.#weightBytes = buffers.weight.byteSize;
    this.maxRows = maxRows;
  }

  /** The buffers this call site was bound to. */
  get buffers(): MatmulBuffers {
    return this.#buffers;
  }

  /** What identifies this call site's kernel choice (its key in a matmul tuning). */
  get shape(): MatmulShape {
    const w = this.#buffers.weight;
    return {
      format: w.format,
      rows: w.rows,
      cols: w.cols,
      xForm: this.#buffers.xForm ?? "plain",
      bias: this.#buffers.bias !== undefined,
    };
  }

  /** The kernel the policy (or `variant`) runs for `m` rows. */
  variantFor(m: number, variant?: MatmulVariant): MatmulVariant {
    return this.#choose(m, { variant }).config.variant;
  }

  /** The kernel configuration an encode of `m` rows runs. @internal */
  configFor(m: number, options: MatmulEncodeOptions = {}): KernelConfig {
    return this.#choose(m, options).config;
  }

  /**
   * The bind groups (one per weight part, then split-K's reduce) of `config`, created on first
   * use. @internal
   */
  bindGroups(config: KernelConfig): GPUBindGroup[] {
    let groups = this.#groups.get(config.key);
    if (groups !== undefined) return groups;
    const b = this.#buffers;
    const layout = config.pipeline.getBindGroupLayout(0);
    // Split-K writes its partial sums to the shared partial buffer instead of y; the reduce reads
    // them there and writes y, with part 0's parameters (one part only: Matmul.fitSplit).
    const partials = config.reduce === null ? null : { buffer: this.#matmul.splitBuffer() };
    groups = b.weight.parts.map((part, i) => {
      // A uniform X binds exactly the vec4s the kernel declares.
      const x = config.xUniform === 0
        ? b.x
        : { buffer: b.x.buffer, offset: b.x.offset ?? 0, size: 16 * config.xUniform };
      const entries: GPUBindGroupEntry[] = [
        { binding: 0, resource: x },
        { binding: 1, resource: partResource(part) },
        { binding: 3, resource: partials ?? b.y },
        { binding: 4, resource: this.#slots[i]!.binding },
      ];
      if (b.bias !== undefined) entries.push({ binding: 2, resource: b.bias });
      if (part.scales !== null) entries.push({ binding: 5, resource: { buffer: part.scales } });
      if (b.norm !== undefined && isNormXForm(config.xForm)) {
        entries.push({ binding: 7, resource: { buffer: b.norm.weight.parts[0]!.buffer } });
        if (b.norm.delta !== undefined) entries.push({ binding: 6, resource: b.norm.delta });
        if (b.norm.out !== undefined) entries.push({ binding: 8, resource: b.norm.out });
      }
      if (b.rowNorm !== undefined && config.xForm === "rms_partials") {
        entries.push({ binding: 9, resource: b.rowNorm.partials });
      }
      if (b.residual !== undefined && config.yForm === "residual_rms") {
        const gamma = { buffer: b.residual.weight.parts[0]!.buffer };
        entries.push({ binding: 10, resource: gamma });
        entries.push({ binding: 11, resource: b.residual.normed });
        entries.push({ binding: 12, resource: b.residual.partials });
      }
      return this.#device.createBindGroup({ label: config.key, layout, entries });
    });
    if (config.reduce !== null && partials !== null) {
      const entries: GPUBindGroupEntry[] = [
        { binding: 0, resource: partials },
        { binding: 3, resource: b.y },
        { binding: 4, resource: this.#slots[0]!.binding },
      ];
      if (b.bias !== undefined) entries.push({ binding: 2, resource: b.bias });
      const label = `${config.key}/reduce`;
      const layout = config.reduce.getBindGroupLayout(0);
      groups.push(this.#device.createBindGroup({ label, layout, entries }));
    }
    this.#groups.set(config.key, groups);
    return groups;
  }

  /** The kernel and bind groups for `m` rows (the policy's, or `variant`). */
  #choose(m: number, options: MatmulEncodeOptions) {
    const { variant, gemvRows, gemvStep, gemvTpr, gemvXRows } = options;
    const last = this.#last;
    const generation = this.#matmul.generation;
    if (
      last !== null && last.m === m && last.variant === variant &&
      last.gemvRows === gemvRows && last.gemvStep === gemvStep && last.gemvTpr === gemvTpr &&
      last.gemvXRows === gemvXRows &&
      last.generation === generation
    ) return last;
    const w = this.#buffers.weight;
    const xForm = this.#buffers.xForm ?? "plain";
    const chosen = this.#matmul.choose(
      m,
      w.rows,
      w.cols,
      w.rowStride,
      variant,
      w.format,
      xForm,
      { rows: gemvRows, step: gemvStep, tpr: gemvTpr, xRows: gemvXRows },
      this.#xUniform,
      w.wordLayout,
      this.#buffers.residual === undefined ? "plain" : "residual_rms",
    );
    const config = this.#matmul.fitSplit(chosen, m, this.#ldy, w.parts.length);
    const groups = this.bindGroups(config);
    const picked = {
      m,
      variant,
      gemvRows,
      gemvStep,
      gemvTpr,
      gemvXRows,
      generation,
      config,
      groups,
    };
    this.#last = picked;
    return picked;
  }

  /**
   * Encodes `y[0..m) = x[0..m) W^T (+ bias)`: one dispatch per weight part, each writing its
   * columns `[part.rowStart, part.rowStart + part.rows)` (a split-K tile: its partial sums, then
   * a second dispatch adding them up into y, kernels/matmul_split.ts). Writes the parts' parameter
   * slots, so flush the arena before submitting, and do not encode the same op twice in one
   * submission with different `m`.
   *
   * @throws {RangeError} when `m` is not an integer in `[1, maxRows]`.
   */
  encode(pass: GPUComputePassEncoder, m: number, options: MatmulEncodeOptions = {}): void {
    if (!Number.isInteger(m) || m < 1 || m > this.maxRows) {
      throw new RangeError(
        `Cannot encode matmul: m = ${m}, the bound buffers hold between 1 and ${this.maxRows} rows`,
      );
    }
    const w = this.#buffers.weight;
    const { config, groups } = this.#choose(m, options);
    const gz = Math.ceil(m / config.mPerGroup) * config.split;
    if (gz > MAX_GROUPS_PER_DIM) {
      throw new RangeError(`Cannot encode matmul: m = ${m} needs ${gz} workgroups in z`);
    }
    const norm = this.#buffers.norm;
    pass.setPipeline(config.pipeline);
    for (let i = 0; i < w.parts.length; i++) {
      const part = w.parts[i]!;
      const n = Math.ceil(part.rows / config.rowsPerGroup);
      const slot = this.#slots[i]!;
      slot.setU32(0, m, part.rows, w.cols, w.rowStride / 4, this.#ldy, part.rowStart, n);
      // Part 0 writes the residual stream's next buffer (rms_residual).
      const eps = norm?.eps ?? this.#buffers.rowNorm?.eps ?? 0;
      slot.setF32(7, eps).setU32(8, i === 0 && norm?.out !== undefined ? 1 : 0);
      pass.setBindGroup(0, groups[i]!);
      const gy = Math.ceil(n / MAX_GROUPS_PER_DIM);
      pass.dispatchWorkgroups(Math.ceil(n / gy), gy, gz);
    }
    if (config.reduce !== null) {
      // Split-K: add the slices up (one part, so part 0's slot holds N and ldy).
      pass.setPipeline(config.reduce);
      pass.setBindGroup(0, groups[w.parts.length]!);
      pass.dispatchWorkgroups(Math.ceil(w.rows / SPLIT_REDUCE_WG), m);
    }
    noteWork(pass, 2 * m * w.rows * w.cols, this.#weightBytes);
  }
}
