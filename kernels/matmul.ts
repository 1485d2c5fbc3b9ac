/**
 * `matmul`: `Y = X W^T (+ bias)`, the projections of a transformer layer and the LM head.
 *
 * X is f32 `[M, K]`, W a {@linkcode GpuMatrix} `[N, K]` in the Hugging Face `[out, in]` layout
 * (f16 or f32, or int8 / int4 with f16 scales per 32 columns, gpu/quant.ts, dequantized in
 * registers; possibly split by rows across several buffers), Y f32 `[M, ldy]` of which columns
 * `[0, N)` are written. Every product is accumulated in f32.
 *
 * The kernels (`tiled` and `gemv` for the `gpu` kernel profile, `unrolled` / `blocked` for the
 * `cpu` one), their tile sizes and WGSL sources are in `kernels/matmul_kernels.ts`; the compiled
 * configurations in `kernels/matmul_configs.ts`, the tuned choices' lookups in
 * `kernels/matmul_choice.ts`, a call site in `kernels/matmul_op.ts`.
 *
 * The kernel is chosen per call from M and the {@linkcode MatmulPolicy} (fixed per adapter, see
 * {@linkcode defaultMatmulPolicy}): `M <= decodeMaxRows` (default {@linkcode DECODE_MAX_ROWS})
 * is decode, larger M is prefill. Tests and benchmarks may force a kernel per call.
 *
 * X may instead be the f32 `[M, 2K]` output of a fused gate/up projection, read as its SwiGLU
 * activation `silu(gate) * up` ({@linkcode XForm} `"swiglu"`, chosen per call site), which
 * spares the MLP a separate activation dispatch; or, with the `gpu` policy's kernels, the
 * RMSNorm of the residual stream (`"rms"`, `"rms_residual"`: {@linkcode MatmulNorm}), which
 * spares the layer its rms_norm dispatches.
 *
 * Weights must be created with `padColsTo: 4` (row stride a multiple of 4, zero padding), so
 * kernels read whole vec4s of W; f16 weights are read as pairs of packed halves
 * (`unpack2x16float`), which needs no `shader-f16`.
 *
 * @module
 */

import type { GpuContext } from "../gpu/context.ts";
import type { DType } from "../gpu/dtype.ts";
import type { WordLayout } from "../gpu/quant.ts";
import type { ParamArena } from "../gpu/params.ts";
import type { GpuMatrix } from "../gpu/tensor.ts";
import {
  BLOCKED_PREFILL_MB,
  DECODE_MAX_ROWS,
  defaultMatmulPolicy,
  type GemvKind,
  gemvStepMisfit,
  type MatmulPolicy,
  type MatmulVariant,
  ROW_BLOCKS,
  UNROLLED_BLOCKS,
  type WeightFormat,
  type XForm,
  type YForm,
} from "./matmul_kernels.ts";
import { checkTile, TILE, TILE_CANDIDATES, type TileConfig } from "./matmul_tile.ts";
import {
  effectiveXRows,
  type MatmulShape,
  type MatmulTuning,
  type SmallTile,
} from "./matmul_tuning.ts";
import {
  checkTuningTiles,
  gemvKindOf,
  gemvMaxRowsOf,
  gemvXRowsOf,
  tileAt,
  tilesRun,
} from "./matmul_choice.ts";
import { checkCallSite } from "./matmul_call_site_check.ts";
import { type ConfigOptions, MatmulConfigs } from "./matmul_configs.ts";
import { splitFits, splitScratch } from "./matmul_split.ts";
import { uniformXBlocks, uniformXCapacity, xRowVec4s } from "./matmul_uniform_x.ts";
import {
  type KernelConfig,
  type MatmulBuffers,
  type MatmulEncodeOptions,
  type MatmulNorm,
  MatmulOp,
  type MatmulResidualNorm,
  type MatmulRowNorm,
} from "./matmul_op.ts";

export {
  DECODE_MAX_ROWS,
  defaultMatmulPolicy,
  type MatmulBuffers,
  type MatmulEncodeOptions,
  type MatmulNorm,
  MatmulOp,
  type MatmulPolicy,
  type MatmulResidualNorm,
  type MatmulRowNorm,
  type MatmulShape,
  type MatmulTuning,
  type MatmulVariant,
  type SmallTile,
  TILE,
  TILE_CANDIDATES,
  type TileConfig,
  type WeightFormat,
  type XForm,
  type YForm,
};

/** Options of {@linkcode Matmul}. */
export interface MatmulOptions {
  /**
   * Element type of the plain weight matrices this instance multiplies (quantized ones, int8 /
   * int4, are accepted whatever it is).
   */
  readonly dtype: DType;
  /** Whether ops add a bias `[N]` (then `bias` must be given to {@linkcode Matmul.bind}). */
  readonly bias: boolean;
  /** Kernel policy; default {@linkcode defaultMatmulPolicy} for the context's adapter. */
  readonly policy?: MatmulPolicy;
  /** Largest M run by the decode kernel; default {@linkcode DECODE_MAX_ROWS}. */
  readonly decodeMaxRows?: number;
  /**
   * The `tiled` kernel's configuration; default {@linkcode TILE}. Measured choices replace it
   * later ({@linkcode Matmul.setTuning}).
   */
  readonly tile?: TileConfig;
}

/**
 * Whether `gemv` reads X of `cols` elements per row as vec4s (kernels/matmul_bindings.ts
 * `xAccess`): where every row starts 4-aligned.
 */
function gemvXVec4(cols: number): boolean {
  return cols % 4 === 0;
}

/**
 * The compiled matmul kernels for one weight dtype and bias setting; {@linkcode Matmul.bind}
 * makes call sites. Pipelines are compiled once per context (cached by key).
 */
export class Matmul {
  /** Weight dtype of this instance. */
  readonly dtype: DType;
  /** Whether ops add a bias. */
  readonly bias: boolean;
  /** The kernel policy in use. */
  readonly policy: MatmulPolicy;
  /** Largest M run by the decode kernel (of shapes the tuning does not list). */
  readonly decodeMaxRows: number;
  readonly #ctx: GpuContext;
  readonly #configs: MatmulConfigs;
  readonly #ops: MatmulOp[] = [];
  /** The choices followed (kernels/matmul_choice.ts): the constructor's tile until a tuning. */
  #tuning: MatmulTuning;
  #generation = 0;

  constructor(ctx: GpuContext, options: MatmulOptions) {
    const decodeMaxRows = options.decodeMaxRows ?? DECODE_MAX_ROWS;
    if (!Number.isInteger(decodeMaxRows) || decodeMaxRows < 0) {
      throw new RangeError(`decodeMaxRows must be a non-negative integer: got ${decodeMaxRows}`);
    }
    this.#ctx = ctx;
    this.dtype = options.dtype;
    this.bias = options.bias;
    this.#configs = new MatmulConfigs(ctx, options.dtype, options.bias);
    this.policy = options.policy ?? defaultMatmulPolicy(ctx);
    this.decodeMaxRows = decodeMaxRows;
    this.#tuning = { tile: options.tile ?? TILE, gemvMaxRows: {} };
    checkTile(this.#tuning.tile);
    // Compile what the policy uses up front (the gpu policy's `gemv` once a call site gives its
    // K); forced variants (and `blocked`, the CPU fallback for row strides that are not a
    // multiple of 8) compile on first use.
    this.#compilePolicy(this.dtype);
  }

  /** The `tiled` kernel's configuration. */
  get tile(): TileConfig {
    return this.#tuning.tile;
  }

  /**
   * The `tiled` configuration that runs `m` rows of X: `shape`'s own when the tuning lists it,
   * else the common one.
   */
  tileFor(m: number, shape?: MatmulShape): TileConfig {
    return tileAt(this.#tuning, m, shape);
  }

  /** The call sites bound so far ({@linkcode Matmul.bind}). */
  get ops(): readonly MatmulOp[] {
    return this.#ops;
  }

  /**
   * Changes count when {@linkcode Matmul.setTuning} changes the choices (call sites re-choose).
   * @internal
   */
  get generation(): number {
    return this.#generation;
  }

  /**
   * Follows `tuning` from now on: its tiles (per call-site shape where it lists them), and per
   * call-site shape its `gemv` row limit, weight rows per invocation and weights per step (`gpu`
   * policy).
   * Compiles the new tiles' kernels and bind groups for every bound call site, so the next steps
   * encode without compiling.
   *
   * @throws {RangeError} when a tile is not a valid configuration.
   */
  setTuning(tuning: MatmulTuning): void {
    checkTuningTiles(tuning);
    this.#tuning = tuning;
    this.#generation++;
    if (this.policy !== "gpu") return;
    for (const op of this.#ops) {
      const { format, xForm } = op.shape;
      const block = op.buffers.weight.wordLayout;
      this.#compilePolicy(format, xForm, block, op.shape);
      for (const tile of tilesRun(tuning, op.shape)) {
        op.bindGroups(this.config("tiled", 0, { format, xForm, tile, wordLayout: block }));
      }
      const gemv = this.gemvFor(op.shape);
      if (gemv.rows === 1 && gemv.step === 4 && (gemv.tpr ?? 64) === 64) continue;
      const xVec4 = gemvXVec4(op.shape.cols);
      for (const mb of ROW_BLOCKS) {
        op.bindGroups(this.config("gemv", mb, { format, xForm, gemv, wordLayout: block, xVec4 }));
      }
    }
  }

  /**
   * The `gemv` kernel for `shape`: weight rows per invocation and weights per step (the
   * tuning's, or 1 and 4).
   */
  gemvFor(shape: MatmulShape): GemvKind {
    return gemvKindOf(this.#tuning, shape);
  }

  /**
   * The most rows of X one `gemv` workgroup takes for `shape` (the tuning's, or 8): M above it
   * runs several workgroups in grid z, each reading the weights again (from the GPU's caches).
   */
  gemvXRowsFor(shape: MatmulShape): number {
    return gemvXRowsOf(this.#tuning, shape);
  }

  /** The largest M run by `gemv` for `shape` under the `gpu` policy (the tuning's, or the default). */
  gemvMaxRowsFor(shape: MatmulShape): number {
    return gemvMaxRowsOf(this.#tuning, shape, this.decodeMaxRows);
  }

  /**
   * Whether call sites can read X as the RMSNorm of the residual stream (`"rms"`,
   * `"rms_residual"`): the `gpu` policy's kernels do, the `cpu` policy's do not.
   */
  get readsNorm(): boolean {
    return this.policy === "gpu";
  }

  /**
   * Whether a call site on `weight` can read X as `"rms_partials"` (the `cpu` policy's `unrolled`
   * kernel: a row stride that is a multiple of 8).
   */
  readsRowNorm(weight: GpuMatrix): boolean {
    return this.policy === "cpu" && weight.rowStride % 8 === 0;
  }

  /**
   * Whether a call site on `weight` can have the output form `"residual_rms"`: as
   * {@linkcode Matmul.readsRowNorm}, with the weight in one part (its partial sums are indexed by
   * workgroup).
   */
  writesResidualNorm(weight: GpuMatrix): boolean {
    return this.readsRowNorm(weight) && weight.parts.length === 1;
  }

  /**
   * Compiles the policy's kernels for weights of `format` (words in blocks of `block` rows) and X
   * read as `xForm`.
   */
  #compilePolicy(
    format: WeightFormat,
    xForm: XForm = "plain",
    block: WordLayout = 1,
    shape?: MatmulShape,
    yForm: YForm = "plain",
  ): void {
    const options = { format, xForm, wordLayout: block, yForm };
    if (this.policy === "cpu") {
      for (const mb of UNROLLED_BLOCKS) this.config("unrolled", mb, { ...options, xVec4: true });
    } else {
      // X as vec4s where the shape's K allows; without a shape (the constructor) its K is not
      // known yet: each call site's bind compiles its own.
      if (shape !== undefined) {
        const xVec4 = gemvXVec4(shape.cols);
        for (const mb of ROW_BLOCKS) this.config("gemv", mb, { ...options, xVec4 });
      }
      // Split-K tiles with their unsplit twins, so that no M compiles while serving.
      for (const tile of tilesRun(this.#tuning, shape)) {
        this.config("tiled", 0, { ...options, tile });
      }
    }
  }

  /**
   * The kernel configuration for `variant` covering `mb` rows of X per workgroup (`tiled`
   * ignores `mb`; its tile defaults to the instance's), compiled on first use
   * (kernels/matmul_configs.ts).
   * @internal
   */
  config(variant: MatmulVariant, mb: number, options: ConfigOptions = {}): KernelConfig {
    return this.#configs.get(variant, mb, { tile: this.#tuning.tile, ...options });
  }

  /**
   * The kernel configuration the policy (or `variant`) picks for `m` rows of X and a weight
   * `rows` x `cols` whose row stride is `rowStride` elements, X read as `xForm`; `unrolled`
   * reads X through a uniform binding of `xUniform` vec4s (the call site's
   * {@linkcode Matmul.uniformXCapacity}) when the `m` rows fit in it; quantized words in blocks
   * of `wordLayout` rows; the output form `yForm` (`unrolled` only but for `"plain"`). @internal
   */
  choose(
    m: number,
    rows: number,
    cols: number,
    rowStride: number,
    variant?: MatmulVariant,
    format: WeightFormat = this.dtype,
    xForm: XForm = "plain",
    gemv: Partial<GemvKind> & { readonly xRows?: number } = {},
    xUniform = 0,
    wordLayout: WordLayout = 1,
    yForm: YForm = "plain",
  ): KernelConfig {
    const decode = m <= this.decodeMaxRows;
    const shape = { format, rows, cols, xForm, bias: this.bias };
    const v = variant ??
      (this.policy === "cpu"
        ? (rowStride % 8 === 0 ? "unrolled" : "blocked")
        : m <= this.gemvMaxRowsFor(shape)
        ? "gemv"
        : "tiled");
    if (v === "unrolled" && rowStride % 8 !== 0) {
      throw new RangeError(
        `Cannot encode matmul with ${v}: weight row stride ${rowStride} is not a multiple of 8`,
      );
    }
    if ((yForm !== "plain" || xForm === "rms_partials") && v !== "unrolled") {
      const form = yForm !== "plain" ? `Y ${yForm}` : `X ${xForm}`;
      throw new RangeError(`Cannot encode matmul ${v} with ${form}: unrolled only`);
    }
    if (v === "tiled") {
      return this.config("tiled", 0, { format, xForm, tile: this.tileFor(m, shape), wordLayout });
    }
    if (v === "unrolled") {
      const mb = UNROLLED_BLOCKS.find((b) => b >= m) ??
        UNROLLED_BLOCKS[UNROLLED_BLOCKS.length - 1]!;
      const xVec4 = cols % 4 === 0;
      const xu = xVec4 && m * xRowVec4s(cols, xForm) <= xUniform ? xUniform : 0;
      return this.config(v, mb, { xVec4, format, xForm, xUniform: xu, wordLayout, yForm });
    }
    if (v === "blocked" && !decode) {
      return this.config(v, BLOCKED_PREFILL_MB, { format, xForm, wordLayout });
    }
    // Smallest compiled block >= m (up to 8; larger m runs several blocks in grid z).
    const block = effectiveXRows(m);
    if (v !== "gemv") {
      return this.config(v, block, { format, xForm, wordLayout });
    }
    // gemv: at most the shape's X rows per workgroup (the tuning's, or 8).
    const xRows = gemv.xRows ?? this.gemvXRowsFor(shape);
    if (!ROW_BLOCKS.some((b) => b === xRows)) {
      throw new RangeError(
        `Cannot encode matmul gemv with ${xRows} X rows per workgroup: one of ${
          ROW_BLOCKS.join(", ")
        }`,
      );
    }
    const mb = effectiveXRows(m, xRows);
    const tuned = this.gemvFor(shape);
    const kind = {
      rows: gemv.rows ?? tuned.rows,
      step: gemv.step ?? tuned.step,
      tpr: gemv.tpr ?? tuned.tpr,
    };
    const misfit = gemvStepMisfit(kind.step, format, rowStride);
    if (misfit !== null) {
      // A forced step is an error; a tuned one falls back to vec4 steps.
      if (gemv.step !== undefined) {
        throw new RangeError(`Cannot encode matmul with gemv steps of ${kind.step}: ${misfit}`);
      }
      kind.step = 4;
    }
    return this.config(v, mb, { format, xForm, gemv: kind, wordLayout, xVec4: gemvXVec4(cols) });
  }

  /**
   * `config`, or the same tile unsplit where split-K cannot run: a weight of several parts, or
   * partials of `m` rows of a Y of row stride `ldy` larger than the partial buffer
   * (kernels/matmul_split.ts). @internal
   */
  fitSplit(config: KernelConfig, m: number, ldy: number, parts: number): KernelConfig {
    if (config.split === 1 || config.tile === undefined) return config;
    if (parts === 1 && splitFits(this.#ctx, config.split, m, ldy)) return config;
    const { format, xForm, wordLayout } = config;
    return this.config("tiled", 0, { format, xForm, tile: { ...config.tile, sk: 1 }, wordLayout });
  }

  /** The partial buffer of split-K call sites (kernels/matmul_split.ts). @internal */
  splitBuffer(): GPUBuffer {
    return splitScratch(this.#ctx);
  }

  /**
   * How many vec4s of `x` the `unrolled` kernel can read through a uniform binding (0: none):
   * the largest power of two (at least 16) of vec4s that `x` holds and the device binds as
   * uniform (at most 64 KiB), when `x`'s buffer has `UNIFORM` usage and its offset the uniform
   * alignment.
   */
  uniformXCapacity(x: GPUBufferBinding): number {
    return uniformXCapacity(this.#ctx, x);
  }

  /**
   * Creates a call site: validates the shapes (kernels/matmul_call_site_check.ts), allocates one
   * parameter slot per weight part and creates the bind groups of the policy's kernels (once,
   * here).
   *
   * @throws {TypeError} when the weight dtype, the bias presence or the norm does not match this
   *   instance and the X form.
   * @throws {RangeError} when the weight row stride is not a multiple of 4, `ldy < N`, or a
   *   buffer cannot hold one row.
   */
  bind(arena: ParamArena, buffers: MatmulBuffers): MatmulOp {
    const w = buffers.weight;
    const { ldy, maxRows, xForm, yForm } = checkCallSite(buffers, this);
    if (w.wordLayout === "texture" && this.policy !== "cpu") {
      throw new TypeError(
        `Cannot bind ${w.label} to the ${this.policy} policy's matmul: its words are in a texture, which only the cpu policy's kernel reads`,
      );
    }
    // The constructor compiled the policy's kernels for plain X and weights of this dtype.
    const shape = { format: w.format, rows: w.rows, cols: w.cols, xForm, bias: this.bias };
    this.#compilePolicy(w.format, xForm, w.wordLayout, shape, yForm);
    const slots = w.parts.map(() => arena.allocate());
    const xUniform = this.uniformXCapacity(buffers.x);
    const op = new MatmulOp(this, this.#ctx.device, buffers, slots, ldy, maxRows, xUniform);
    this.#ops.push(op);
    if (this.policy === "cpu" && xUniform > 0 && w.cols % 4 === 0 && w.rowStride % 8 === 0) {
      // The uniform-X blocks some decode M will run.
      for (const mb of uniformXBlocks(w.cols, xForm, xUniform)) {
        const wordLayout = w.wordLayout;
        const options = { xVec4: true, format: w.format, xForm, xUniform, wordLayout, yForm };
        this.config("unrolled", mb, options);
      }
    }
    for (const config of this.#configs.compiled()) {
      if (config.format !== w.format || config.xForm !== xForm) continue;
      if (config.wordLayout !== w.wordLayout || config.yForm !== yForm) continue;
      // Uniform-X kernels are bound to call sites of their binding's size only.
      if (config.xUniform !== 0 && config.xUniform !== xUniform) continue;
      // Kernels reading 8-element steps are bound only to weights whose row stride allows it;
      // unrolled's vec4 X loads need K % 4 == 0.
      const xOk = !config.xVec4 || w.cols % 4 === 0;
      if ((!config.steps8 || w.rowStride % 8 === 0) && xOk) op.bindGroups(config);
    }
    return op;
  }
}
