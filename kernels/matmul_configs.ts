/**
 * The compiled kernel configurations of one `Matmul` (kernels/matmul.ts): each variant, X rows per
 * workgroup, weight format, X form, tile and `gemv` kind under a key that names every field, its
 * pipeline (cached per context by that key, kernels/matmul_kernels.ts `kernelSource`) and, for a
 * split-K tile, its reduce pipeline (kernels/matmul_split.ts).
 *
 * @module
 */

import type { GpuContext } from "../gpu/context.ts";
import type { DType } from "../gpu/dtype.ts";
import { type WordLayout, wordLayoutTag } from "../gpu/quant.ts";
import {
  DEFAULT_GEMV,
  type GemvKind,
  isNormXForm,
  kernelSource,
  type MatmulVariant,
  type WeightFormat,
  type XForm,
  type YForm,
} from "./matmul_kernels.ts";
import { type TileConfig, tileKey } from "./matmul_tile.ts";
import { splitReduceCode } from "./matmul_split.ts";
import type { KernelConfig } from "./matmul_op.ts";

/** How a kernel configuration is built; each field has a default. */
export interface ConfigOptions {
  /** `unrolled` and `gemv`: X read as vec4s (K % 4 == 0); default false. */
  readonly xVec4?: boolean;
  /** The weight format; default the instance's dtype. */
  readonly format?: WeightFormat;
  /** How X is read; default `"plain"`. */
  readonly xForm?: XForm;
  /** `gemv`: weight rows per invocation and weights per step; default {@linkcode DEFAULT_GEMV}. */
  readonly gemv?: GemvKind;
  /** `tiled`: the tile; default the instance's (`Matmul.config`). */
  readonly tile?: TileConfig;
  /** `unrolled`: vec4s of X in a uniform binding, 0 for a storage one; default 0. */
  readonly xUniform?: number;
  /** Rows per block of quantized words (gpu/quant.ts); default 1. */
  readonly wordLayout?: WordLayout;
  /** What the kernel does with its output (`unrolled` only but for `"plain"`); default plain. */
  readonly yForm?: YForm;
}

/** The configurations compiled for one weight dtype (of the norm weights) and bias setting. */
export class MatmulConfigs {
  readonly #ctx: GpuContext;
  readonly #dtype: DType;
  readonly #bias: boolean;
  readonly #configs = new Map<string, KernelConfig>();

  constructor(ctx: GpuContext, dtype: DType, bias: boolean) {
    this.#ctx = ctx;
    this.#dtype = dtype;
    this.#bias = bias;
  }

  /** The configurations compiled so far. */
  compiled(): IterableIterator<KernelConfig> {
    return this.#configs.values();
  }

  /**
   * The configuration for `variant` covering `mb` rows of X per workgroup (`tiled` ignores `mb`,
   * the others the tile), as `options` specify it, compiled on first use.
   */
  get(
    variant: MatmulVariant,
    mb: number,
    options: ConfigOptions & { readonly tile: TileConfig },
  ): KernelConfig {
    const {
      xVec4 = false,
      format = this.#dtype,
      xForm = "plain",
      gemv = DEFAULT_GEMV,
      tile,
      xUniform = 0,
      wordLayout = 1,
      yForm = "plain",
    } = options;
    const bias = this.#bias;
    // A norm form's weight has the instance's dtype, whatever the matmul weight's format.
    const x =
      (xForm === "plain" ? "" : `/${xForm}${isNormXForm(xForm) ? `/g${this.#dtype}` : ""}`) +
      (yForm === "plain" ? "" : `/y${yForm}/g${this.#dtype}`);
    const f = `${format}${wordLayoutTag(wordLayout)}`;
    const tag = `matmul/${variant}/${f}/${bias ? "bias" : "nobias"}${x}`;
    // Steps of 32 run their own invocations per row (matmul_kernels.ts GEMV_Q32_TPR).
    const gemvTpr = variant === "gemv" && gemv.step !== 32 ? gemv.tpr ?? 64 : 64;
    // The tile's key names every field of the configuration (tileKey): two tiles that differ in
    // any field are two pipelines.
    const key = variant === "tiled"
      ? `${tag}/${tileKey(tile)}`
      : variant === "unrolled"
      ? `${tag}/mb${mb}/x${xVec4 ? 4 : 1}${xUniform > 0 ? `/xu${xUniform}` : ""}`
      : variant === "gemv"
      ? `${tag}/mb${mb}${gemv.rows > 1 ? `/rb${gemv.rows}` : ""}${
        gemv.step > 4 ? `/ks${gemv.step}` : ""
      }${gemvTpr !== 64 ? `/tp${gemvTpr}` : ""}${xVec4 ? "/x4" : ""}`
      : `${tag}/mb${mb}`;
    let config = this.#configs.get(key);
    if (config !== undefined) return config;
    const source = kernelSource(
      variant,
      mb,
      format,
      bias,
      xVec4,
      xForm,
      this.#dtype,
      tile,
      variant === "gemv" ? gemv.rows : 1,
      variant === "gemv" ? gemv.step : 4,
      xUniform,
      wordLayout,
      gemvTpr,
      yForm,
    );
    const { code, rowsPerGroup, mPerGroup, split } = source;
    const pipeline = this.#ctx.pipeline(key, () => code);
    // Split-K's second dispatch: one per split, bias and row statistic (kernels/matmul_split.ts).
    const stat = isNormXForm(xForm);
    const reduce = split === 1 ? null : this.#ctx.pipeline(
      `matmul/split_reduce/s${split}/${bias ? "bias" : "nobias"}${stat ? "/stat" : ""}`,
      () => splitReduceCode(split, bias, stat),
    );
    // unrolled and 8- or 32-element gemv steps read whole 8-element steps of each weight row.
    const steps8 = variant === "unrolled" || (variant === "gemv" && gemv.step >= 8);
    config = {
      key,
      variant,
      format,
      wordLayout,
      xForm,
      yForm,
      xVec4,
      xUniform,
      steps8,
      pipeline,
      rowsPerGroup,
      mPerGroup,
      split,
      reduce,
      tile: variant === "tiled" ? tile : undefined,
    };
    this.#configs.set(key, config);
    return config;
  }
}
