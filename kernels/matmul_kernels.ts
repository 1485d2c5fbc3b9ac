/**
 * The WGSL kernels behind `Matmul` (`kernels/matmul.ts`), their tile sizes, the kernel
 * policy per adapter, and the source of each compiled configuration (bindings prepended to the
 * `.wgsl` file).
 *
 * The kernels:
 * - `tiled` (`matmul_tiled.wgsl`): workgroup tiles of X and W in `var<workgroup>`, a 4 x 4
 *   (or 8 x 4) register block per invocation, K walked in tiles. The prefill kernel of a real GPU.
 * - `gemv` (`matmul_gemv.wgsl`): 64 invocations share a weight row (coalesced reads) and reduce
 *   in workgroup memory; every weight row is read once for up to 8 rows of X. The decode kernel
 *   of a real GPU.
 * - `blocked` (`matmul_blocked.wgsl`): no workgroup memory, no barriers; one invocation owns 4
 *   weight rows x MB rows of X and streams them from storage. On lavapipe (Vulkan on the CPU)
 *   each lane issues its own loads and a barrier is a coroutine switch per lane group, so this is
 *   several times faster there than either kernel above, for decode and prefill alike.
 * - `unrolled` (`matmul_unrolled.wgsl`): one 16-byte load per weight row for 8 weights and each
 *   X value loaded once for all the invocation's rows (inside a loop lavapipe runs every storage
 *   load as a per-lane loop over its 32-bit components, so the number of loads, not bytes, sets
 *   the speed), with the register tile (MB x RN = up to 16 x 16) written out line by line
 *   (`kernels/unroll.ts`) instead of kept in arrays, and X read as vec4s when K % 4 == 0. Needs
 *   a weight row stride that is a multiple of 8. (Its predecessor `blocked8`, the same loads
 *   without the unrolling, was removed 2026-11-25: no profile picked it.) Measured on lavapipe (2 cores, gate_up 6144 x 1024 f16,
 *   2026-11-22, `bench/matmul_bench.ts`): see docs/benchmarks.md. The CPU policy uses it
 *   whenever the weight row stride is a multiple of 8 and falls back to `blocked` otherwise.
 *
 * @module
 */

import blockedSource from "./matmul_blocked.wgsl" with { type: "text" };
import unrolledSource from "./matmul_unrolled.wgsl" with { type: "text" };
import unrolledQuantSource from "./matmul_unrolled_q.wgsl" with { type: "text" };
import unrolledResidualSource from "./matmul_unrolled_residual.wgsl" with { type: "text" };
import gemvSource from "./matmul_gemv.wgsl" with { type: "text" };
import gemvStep8Source from "./matmul_gemv_step8.wgsl" with { type: "text" };
import gemvQ32Source from "./matmul_gemv_q32.wgsl" with { type: "text" };
import tiledW8Source from "./matmul_tiled_w8.wgsl" with { type: "text" };
import ioSource from "./matmul_io.wgsl" with { type: "text" };
import xSource from "./matmul_x.wgsl" with { type: "text" };
import xSwigluSource from "./matmul_x_swiglu.wgsl" with { type: "text" };
import xRmsSource from "./matmul_x_rms.wgsl" with { type: "text" };
import xNoStatSource from "./matmul_x_nostat.wgsl" with { type: "text" };
import {
  quantWeightBinding8,
  weightBinding,
  weightBinding8,
  type WeightFormat,
} from "./matmul_weight_bindings.ts";
import {
  biasBinding,
  isNormXForm,
  NORM_PARTIAL_ROWS,
  residualOutBinding,
  xAccess,
  xBinding8,
  xBinding8Swiglu,
  type XForm,
  xRowScale,
  xStatBinding,
  type YForm,
} from "./matmul_bindings.ts";
import tiledSource from "./matmul_tiled.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { DType } from "../gpu/dtype.ts";
import { WORD_BLOCK_ROWS, type WordLayout } from "../gpu/quant.ts";
import {
  checkTile,
  TILE,
  tileBuffers,
  tileCols,
  type TileConfig,
  tileName,
  tileRows,
  tileSplit,
} from "./matmul_tile.ts";
import { unrollTemplate } from "./unroll.ts";
import { SPLIT_REDUCE_SOURCE } from "./matmul_split.ts";
import { sourceDigest } from "./source_digest.ts";

export { isNormXForm, type WeightFormat, type XForm, type YForm };

/**
 * A digest of every matmul WGSL source: a measured tuning (kernels/matmul_tuner.ts)
 * cached under it is measured again once the kernels change.
 */
export const MATMUL_SOURCES_DIGEST: string = sourceDigest(
  blockedSource,
  unrolledSource,
  unrolledQuantSource,
  unrolledResidualSource,
  gemvSource,
  gemvStep8Source,
  gemvQ32Source,
  ioSource,
  xSource,
  xSwigluSource,
  xRmsSource,
  xNoStatSource,
  tiledSource,
  tiledW8Source,
  SPLIT_REDUCE_SOURCE,
);

/** The kernels behind `Matmul` (see the module documentation). */
export type MatmulVariant = "tiled" | "gemv" | "blocked" | "unrolled";

/**
 * Which kernels an adapter uses: `"gpu"` (tiled prefill, workgroup-reduction GEMV decode) or
 * `"cpu"` (the barrier-free `unrolled` / `blocked` kernels for both; for software adapters like
 * lavapipe).
 */
export type MatmulPolicy = "gpu" | "cpu";

/** Default largest M treated as decode (GEMV-style kernels); larger M is prefill. */
export const DECODE_MAX_ROWS = 16;

/**
 * The kernel policy for `ctx`: its kernel profile (gpu/kernel_profile.ts). `"cpu"` on a
 * fallback / software adapter (lavapipe, llvmpipe, SwiftShader) unless forced, where barriers and
 * per-lane loads dominate (measured: the workgroup-reduction GEMV and the shared-memory tiled
 * kernel are several times slower there than the `blocked` kernel), else `"gpu"`.
 */
export function defaultMatmulPolicy(ctx: GpuContext): MatmulPolicy {
  return ctx.profile;
}

/** Register-block sizes (X rows per invocation) compiled for the `blocked` / `gemv` kernels. */
export const ROW_BLOCKS = [1, 2, 4, 8] as const;
/** X rows per invocation of the `blocked` kernel when it runs a prefill (M > decodeMaxRows). */
export const BLOCKED_PREFILL_MB = 8;
/** `blocked`: weight rows per invocation and workgroup size. */
const BLOCKED_RN = 4;
const BLOCKED_WG = 64;
/**
 * `unrolled`: X-row blocks compiled (the smallest >= M is used; M above the last runs several
 * blocks in grid z), weight rows per invocation and workgroup size. Measured on lavapipe
 * (gate_up 16384 x 1024 f16): RN 16 beat 8 and 32 at M = 1 and 16; MB 16 x RN 16 reached 40
 * GFLOP/s against 28-30 for 8 x 16 and 8 x 32; one 8-lane SIMD group per workgroup.
 */
export const UNROLLED_BLOCKS = [1, 2, 4, 8, 16] as const;
const UNROLLED_RN = 16;
/**
 * `unrolled` on int8 / int4 weights: weight rows per invocation. With a whole group per load
 * (matmul_unrolled_q.wgsl), 12, 16, 20 and 24 measured the same on lavapipe (6144 x 1024 int4,
 * M = 1, 2026-11-26: 0.82-0.87 ms). Where its 0.83 ms went (scratch variants, same day, best of
 * 7): 0.35 ms weight loads, 0.14 ms scale loads, 0.18 ms X loads, 0.21 ms the rest; X read
 * through a uniform binding (matmul_bindings.ts xBinding8) took 0.71 ms.
 */
// 16: matmul_unrolled_q.wgsl reads these rows' scales as two blocks of 8, and their words (cpu
// profile) as one word block.
const QUANT_RN = WORD_BLOCK_ROWS;
const UNROLLED_WG = 8;
// The residual epilogue's partial sums cover one workgroup's weight rows, whatever the format.
if (
  UNROLLED_WG * UNROLLED_RN !== NORM_PARTIAL_ROWS || UNROLLED_WG * QUANT_RN !== NORM_PARTIAL_ROWS
) {
  throw new Error(
    "matmul_kernels.ts: unrolled workgroups must cover NORM_PARTIAL_ROWS weight rows",
  );
}
/** `gemv`: invocations per weight row (default) and invocation sets (of RB weight rows) per workgroup. */
const GEMV_TPR = 64;
const GEMV_RPW = 4;
/**
 * `gemv` with steps of 4 or 8: invocations per weight row compiled (a power of two each). 64 is
 * the default; the kernel tuning measures 32 per call-site shape (each invocation twice the
 * loads, one level less of the reduction tree: at batch 1 on the H200 every projection took 9-12
 * us whatever its bytes, a latency, not a bandwidth).
 */
export const GEMV_TPRS = [64, 32] as const;
/**
 * `gemv`: weight rows per invocation compiled (each X vec4 loaded once for them). 1 is the
 * default; the kernel tuning (kernels/matmul_tuner.ts) measures 4 per call-site shape.
 */
export const GEMV_ROW_BLOCKS = [1, 4] as const;
/**
 * `gemv`: weights per invocation per step compiled: 4 (a vec4 of weights, matmul_gemv.wgsl's
 * loop), 8 (matmul_gemv_step8.wgsl: one 16-byte load of f16, a whole int4 word; needs a weight
 * row stride that is a multiple of 8) or 32 (matmul_gemv_q32.wgsl: a whole group of int8 / int4
 * weights, {@linkcode GEMV_Q32_TPR} invocations per row; quantized weights only). 4 is the
 * default; the kernel tuning measures the others per call-site shape.
 */
export const GEMV_STEPS = [4, 8, 32] as const;
/** `gemv` with steps of 32: invocations per weight row (a 1,024-wide row is 32 groups). */
const GEMV_Q32_TPR = 32;

/**
 * Why `gemv` with steps of `step` weights cannot read a weight of `format` and row stride
 * `rowStride` (steps of 8 or 32 read whole 8-element steps; 32 reads int8 / int4 groups only), or
 * null when it can.
 */
export function gemvStepMisfit(
  step: number,
  format: WeightFormat,
  rowStride: number,
): string | null {
  if (step >= 8 && rowStride % 8 !== 0) {
    return `weight row stride ${rowStride} is not a multiple of 8`;
  }
  if (step === 32 && format !== "int8" && format !== "int4") return `${format} weights`;
  return null;
}

/**
 * A `gemv` kernel: weight rows per invocation, weights per invocation per step and invocations
 * per weight row.
 */
export interface GemvKind {
  /** One of {@linkcode GEMV_ROW_BLOCKS}. */
  readonly rows: number;
  /** One of {@linkcode GEMV_STEPS}. */
  readonly step: number;
  /**
   * One of {@linkcode GEMV_TPRS} (steps of 4 or 8); default 64. Steps of 32 always run
   * {@linkcode GEMV_Q32_TPR}.
   */
  readonly tpr?: number;
}

/** The `gemv` kernel without tuning: one weight row per invocation, vec4 steps. */
export const DEFAULT_GEMV: GemvKind = { rows: 1, step: 4 };
/**
 * `source` (`name`) with the lines between its "`part` BEGIN" and "`part` END" comment lines (e.g.
 * the k loop, "K LOOP") replaced by the fragment `fragment` (its leading comment lines dropped).
 */
function withFragment(source: string, name: string, part: string, fragment: string): string {
  const marked = new RegExp(`^ *// ${part} BEGIN.*\\n[\\s\\S]*?^ *// ${part} END\\n`, "m");
  if (!marked.test(source)) throw new Error(`${name} has lost its ${part} markers`);
  return source.replace(marked, () => fragment.replace(/^(\/\/.*\n)*\n*/, ""));
}

/** A kernel configuration's WGSL source and how to size its grid. */
export interface KernelSource {
  readonly code: string;
  /** Weight rows covered by one workgroup. */
  readonly rowsPerGroup: number;
  /** X rows covered by one workgroup (grid z). */
  readonly mPerGroup: number;
  /**
   * Workgroups per tile of Y along K (grid z holds `split` per `mPerGroup` rows; `tiled`
   * split-K writes partial sums, kernels/matmul_split.ts); 1 for every other kernel.
   */
  readonly split: number;
}

/**
 * The WGSL source of `variant` for `mb` rows of X per invocation (`tiled` ignores `mb`), weights
 * of `format` (f16 / f32, or int8 / int4 dequantized in registers: `w' = q * scale`), with or
 * without bias, X read as vec4s (`unrolled`, when K % 4 == 0), X plain, the SwiGLU of a
 * gate|up buffer or the RMSNorm of the residual stream with a `normDtype` weight
 * ({@linkcode XForm}; the norm forms in `gemv` and `tiled` only). Prepended to the kernel file:
 * the X binding (`matmul_x.wgsl` / `matmul_x_swiglu.wgsl`, `gemv` and `tiled` with
 * `matmul_x_nostat.wgsl`, or `matmul_x_rms.wgsl`; `unrolled` has its own), the weight and bias
 * bindings, the constants, and `matmul_io.wgsl` (Params, the Y and parameter bindings,
 * `store_y`), shared by every kernel. `tile` replaces the `tiled` configuration (tuning benches);
 * `gemvRows` is the weight rows per `gemv` invocation (one of {@linkcode GEMV_ROW_BLOCKS}),
 * `gemvStep` its weights per invocation per step (one of {@linkcode GEMV_STEPS}), `gemvTpr` its
 * invocations per weight row (one of {@linkcode GEMV_TPRS}; steps of 32 run their own); `xUniform`,
 * when not 0, makes `unrolled` read its vec4 X through a uniform binding of that many vec4s
 * (matmul_bindings.ts `xBinding8`); `wordLayout` is how int8 / int4 words are laid out (rows per
 * block, or a texture: `unrolled` only; gpu/quant.ts); `yForm` is what the kernel does with its
 * output ({@linkcode YForm}; `"residual_rms"` with `unrolled` only, its norm weight of
 * `normDtype`).
 *
 * @throws {RangeError} for a norm X form with a kernel other than `gemv` or `tiled`, the X form
 *   `"rms_partials"` or the Y form `"residual_rms"` with a kernel other than `unrolled`, or a
 *   `gemvRows` / `gemvStep` / `gemvTpr` that is not one of {@linkcode GEMV_ROW_BLOCKS} /
 *   {@linkcode GEMV_STEPS} / {@linkcode GEMV_TPRS}, or a uniform X with a kernel other than `unrolled` or without vec4
 *   loads, or a word layout other than 1 for f16 / f32 weights, or words in a texture for a
 *   kernel other than `unrolled`.
 */
export function kernelSource(
  variant: MatmulVariant,
  mb: number,
  format: WeightFormat,
  bias: boolean,
  xVec4: boolean,
  xForm: XForm = "plain",
  normDtype: DType = "f32",
  tile: TileConfig = TILE,
  gemvRows = 1,
  gemvStep = 4,
  xUniform = 0,
  wordLayout: WordLayout = 1,
  gemvTpr: number = GEMV_TPR,
  yForm: YForm = "plain",
): KernelSource {
  if (xUniform !== 0 && variant !== "unrolled") {
    throw new RangeError(`Cannot build matmul ${variant} with a uniform X: unrolled only`);
  }
  if ((xForm === "rms_partials" || yForm !== "plain") && variant !== "unrolled") {
    const form = yForm !== "plain" ? `Y ${yForm}` : `X ${xForm}`;
    throw new RangeError(`Cannot build matmul ${variant} with ${form}: unrolled only`);
  }
  const quant = format === "int8" || format === "int4" ? format : null;
  const step8 = variant === "gemv" && gemvStep === 8;
  const q32 = variant === "gemv" && gemvStep === 32;
  if (q32 && quant === null) {
    throw new RangeError(`Cannot build matmul gemv with steps of 32 for ${format} weights`);
  }
  // `tiled` stages quantized weights 8 at a time (matmul_tiled_w8.wgsl).
  const tiledW8 = variant === "tiled" && quant !== null;
  if (wordLayout !== 1 && quant === null) {
    throw new RangeError(`Cannot build matmul for ${format} weights in word layout ${wordLayout}`);
  }
  if (wordLayout === "texture" && variant !== "unrolled") {
    throw new RangeError(`Cannot build matmul ${variant} for ${format} words in a texture`);
  }
  const block = wordLayout === "texture" ? 1 : wordLayout;
  const w = step8 || tiledW8
    ? weightBinding8(format, block)
    : quant !== null && (q32 || variant === "unrolled")
    ? quantWeightBinding8(quant, wordLayout)
    : variant !== "unrolled"
    ? weightBinding(format, block)
    : weightBinding8(format, block);
  const swiglu = xForm === "swiglu";
  const stat = variant === "gemv" || variant === "tiled";
  if (isNormXForm(xForm) && !stat) {
    throw new RangeError(`Cannot build matmul ${variant} with X ${xForm}: only gemv and tiled`);
  }
  // `gemv` reads X as vec4s where K % 4 == 0 (xVec4), `tiled` stages it element by element.
  const x = stat
    ? xStatBinding(xForm, normDtype, xVec4 && variant === "gemv")
    : variant === "unrolled"
    ? (swiglu ? xBinding8Swiglu(xVec4, xUniform) : xBinding8(xVec4, xUniform)) + xRowScale(xForm)
    : xAccess(false) + (swiglu ? xSwigluSource : xSource);
  const out = yForm === "residual_rms" ? residualOutBinding(normDtype) : "";
  const prelude = x + w + biasBinding(bias) + out;
  const kernel = (consts: Record<string, number>, source: string, rowsPerGroup: number) => ({
    code: prelude + Object.entries(consts).map(([k, v]) => `const ${k} = ${v}u;\n`).join("") +
      ioSource + source,
    rowsPerGroup,
    mPerGroup: consts.MB ?? consts.WY! * consts.TM!,
    split: 1,
  });
  switch (variant) {
    case "unrolled": {
      const name = "matmul_unrolled.wgsl";
      let template = quant === null
        ? unrolledSource
        : withFragment(unrolledSource, name, "K LOOP", unrolledQuantSource);
      if (yForm === "residual_rms") {
        template = withFragment(template, name, "ROW GUARD", "");
        template = withFragment(template, name, "EPILOGUE", unrolledResidualSource);
      }
      const rn = quant === null ? UNROLLED_RN : QUANT_RN;
      const source = unrollTemplate(template, { i: mb, r: rn });
      return kernel({ MB: mb, RN: rn, WG: UNROLLED_WG }, source, rn * UNROLLED_WG);
    }
    case "blocked":
      return kernel(
        { MB: mb, RN: BLOCKED_RN, WG: BLOCKED_WG },
        blockedSource,
        BLOCKED_RN * BLOCKED_WG,
      );
    case "gemv": {
      if (!GEMV_ROW_BLOCKS.some((rb) => rb === gemvRows)) {
        throw new RangeError(
          `Cannot build matmul gemv with ${gemvRows} weight rows per invocation`,
        );
      }
      if (!GEMV_STEPS.some((s) => s === gemvStep)) {
        throw new RangeError(`Cannot build matmul gemv with steps of ${gemvStep} weights`);
      }
      if (!GEMV_TPRS.some((t) => t === gemvTpr)) {
        throw new RangeError(`Cannot build matmul gemv with ${gemvTpr} invocations per row`);
      }
      const xs = isNormXForm(xForm) ? 2 : 1;
      const template = step8
        ? withFragment(gemvSource, "matmul_gemv.wgsl", "K LOOP", gemvStep8Source)
        : q32
        ? withFragment(gemvSource, "matmul_gemv.wgsl", "K LOOP", gemvQ32Source)
        : gemvSource;
      const source = unrollTemplate(template, { i: mb, r: gemvRows });
      const tpr = q32 ? GEMV_Q32_TPR : gemvTpr;
      const consts = { MB: mb, TPR: tpr, RPW: GEMV_RPW, RB: gemvRows, XS: xs };
      return kernel(consts, source, GEMV_RPW * gemvRows);
    }
    case "tiled": {
      checkTile(tile);
      const { wx, wy, bk } = tile;
      if (tiledW8 && bk % 8 !== 0) {
        throw new RangeError(
          `Cannot use matmul tile ${tileName(tile)} with ${format} weights: needs bk % 8 == 0`,
        );
      }
      const tm = tileRows(tile);
      const tn = tileCols(tile);
      const template = tiledW8
        ? withFragment(tiledSource, "matmul_tiled.wgsl", "W STAGING", tiledW8Source)
        : tiledSource;
      // W items an invocation stages per K step (4 or 8 weights each; the last may be partial).
      const wper = Math.ceil((tn * wx * bk) / (tiledW8 ? 8 : 4) / (wx * wy));
      const source = unrollTemplate(template, { i: (tm * bk) / wx, r: tm / 4, c: tn / 4, w: wper });
      const nb = tileBuffers(tile);
      const split = tileSplit(tile);
      return {
        ...kernel(
          { WX: wx, WY: wy, BK: bk, TM: tm, TN: tn, NB: nb, WPER: wper, SPLIT: split },
          source,
          tn * wx,
        ),
        split,
      };
    }
  }
}
