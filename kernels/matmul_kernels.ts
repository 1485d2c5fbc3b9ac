/**
 * The WGSL kernels behind `Matmul` (`kernels/matmul.ts`), their tile sizes, the kernel
 * policy per adapter, and the source of each compiled configuration (bindings prepended to the
 * `.wgsl` file).
 *
 * The kernels:
 * - `tiled` (`matmul_tiled.wgsl`): workgroup tiles of X and W in `var<workgroup>`, a 4 x 4
 *   register block per invocation, K walked in tiles. The prefill kernel of a real GPU.
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
import gemvSource from "./matmul_gemv.wgsl" with { type: "text" };
import ioSource from "./matmul_io.wgsl" with { type: "text" };
import xSource from "./matmul_x.wgsl" with { type: "text" };
import xSwigluSource from "./matmul_x_swiglu.wgsl" with { type: "text" };
import xRmsSource from "./matmul_x_rms.wgsl" with { type: "text" };
import xNoStatSource from "./matmul_x_nostat.wgsl" with { type: "text" };
import tiledSource from "./matmul_tiled.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { DType } from "../gpu/dtype.ts";
import type { QuantFormat } from "../gpu/quant.ts";
import { checkTile, TILE, type TileConfig } from "./matmul_tile.ts";
import { unrollTemplate } from "./unroll.ts";
import { sourceDigest } from "./source_digest.ts";

/**
 * A digest of every matmul WGSL source: a measured tuning (kernels/matmul_tuner.ts)
 * cached under it is measured again once the kernels change.
 */
export const MATMUL_SOURCES_DIGEST: string = sourceDigest(
  blockedSource,
  unrolledSource,
  unrolledQuantSource,
  gemvSource,
  ioSource,
  xSource,
  xSwigluSource,
  xRmsSource,
  xNoStatSource,
  tiledSource,
);

/** What a matmul's weights are: plain f16 / f32, or a low-bit format (gpu/quant.ts). */
export type WeightFormat = DType | QuantFormat;

/**
 * What a matmul reads as X: `"plain"`, f32 `[M, K]`; or `"swiglu"`, the f32 `[M, 2K]` output of
 * a fused gate/up projection (per row K gate values then K up values) read as its SwiGLU
 * activation `X[m, k] = silu(gate[m, k]) * up[m, k]`, `silu(g) = g / (1 + exp(-g))` (no
 * separate activation dispatch); or the RMSNorm of the f32 `[M, K]` residual stream h (no
 * rms_norm dispatch; `gemv` and `tiled` only, see matmul_x_rms.wgsl): `"rms"`,
 * `X = rms(h) * gamma`; `"rms_residual"`, `r = h + delta` written to the stream's next buffer
 * and `X = rms(r) * gamma`.
 */
export type XForm = "plain" | "swiglu" | "rms" | "rms_residual";

/** Whether `xForm` normalises the residual stream (matmul_x_rms.wgsl). */
export function isNormXForm(xForm: XForm): xForm is "rms" | "rms_residual" {
  return xForm === "rms" || xForm === "rms_residual";
}

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
 * `unrolled` on int8 / int4 weights: weight rows per invocation. Tried 8, 16, 32 on lavapipe
 * (Qwen3-0.6B shapes, M = 1, 2026-11-25): no difference beyond the machine's noise, the kernel
 * being bound by its arithmetic (unpacking, scaling, dots: ~8 G weights/s on 2 cores).
 */
const QUANT_RN = 16;
const UNROLLED_WG = 8;
/** `gemv`: invocations per weight row and invocation sets (of RB weight rows) per workgroup. */
const GEMV_TPR = 64;
const GEMV_RPW = 4;
/**
 * `gemv`: weight rows per invocation compiled (each X vec4 loaded once for them). 1 is the
 * default; the kernel tuning (kernels/matmul_tuner.ts) measures 4 per call-site shape.
 */
export const GEMV_ROW_BLOCKS = [1, 4] as const;
/**
 * matmul_unrolled.wgsl with its k loop (between the "K LOOP BEGIN" and "K LOOP END" lines)
 * replaced by matmul_unrolled_q.wgsl's, for int8 / int4 weights.
 */
function withQuantLoop(source: string): string {
  const loop = /^ *\/\/ K LOOP BEGIN.*\n[\s\S]*?^ *\/\/ K LOOP END\n/m;
  if (!loop.test(source)) throw new Error("matmul_unrolled.wgsl has lost its K LOOP markers");
  return source.replace(loop, () => unrolledQuantSource.replace(/^(\/\/.*\n)*\n*/, ""));
}

/** A kernel configuration's WGSL source and how to size its grid. */
export interface KernelSource {
  readonly code: string;
  /** Weight rows covered by one workgroup. */
  readonly rowsPerGroup: number;
  /** X rows covered by one workgroup (grid z). */
  readonly mPerGroup: number;
}

/**
 * Bindings 1 (words) and 5 (f16 scales, u32 pairs) of a quantized weight, and `scale_at(g)`,
 * the scale of group `g` counted from the start of the part (gpu/quant.ts).
 */
function quantBindings(wordType: string): string {
  return `@group(0) @binding(1) var<storage, read> w: array<${wordType}>;\n` +
    "@group(0) @binding(5) var<storage, read> w_scales: array<u32>;\n" +
    "fn scale_at(g: u32) -> f32 {\n" +
    "  let pair = unpack2x16float(w_scales[g >> 1u]);\n" +
    "  return select(pair.x, pair.y, (g & 1u) == 1u);\n}\n";
}

/** WGSL: the 4 signed values of `word`'s low 16 bits (int4) or of `word` (int8), as f32. */
const UNPACK4 = {
  int4: "fn unpack4(word: u32) -> vec4<f32> {\n" +
    "  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) << vec4<u32>(28u, 24u, 20u, 16u)) >> vec4<u32>(28u));\n}\n",
  int8: "fn unpack4(word: u32) -> vec4<f32> {\n" +
    "  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));\n}\n",
} as const;

/** `load_w4(i)`: elements 4i..4i+3 of the part (a group is 8 such steps). */
function weightBinding(format: WeightFormat): string {
  switch (format) {
    case "f16":
      return "@group(0) @binding(1) var<storage, read> w: array<vec2<u32>>;\n" +
        "fn load_w4(i: u32) -> vec4<f32> {\n" +
        "  let v = w[i];\n" +
        "  return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));\n}\n";
    case "f32":
      return "@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;\n" +
        "fn load_w4(i: u32) -> vec4<f32> {\n  return w[i];\n}\n";
    case "int4":
      return quantBindings("u32") + UNPACK4.int4 +
        "fn load_w4(i: u32) -> vec4<f32> {\n" +
        "  return unpack4(w[i >> 1u] >> ((i & 1u) * 16u)) * scale_at(i >> 3u);\n}\n";
    case "int8":
      return quantBindings("u32") + UNPACK4.int8 +
        "fn load_w4(i: u32) -> vec4<f32> {\n" +
        "  return unpack4(w[i]) * scale_at(i >> 3u);\n}\n";
  }
}

/** Weight binding of `unrolled`: `load_w8(i)`, 8 weights per step (row stride a multiple of 8). */
function weightBinding8(format: WeightFormat): string {
  switch (format) {
    case "f16":
      return "@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;\n" +
        "fn load_w8(i: u32) -> mat2x4<f32> {\n" +
        "  let v = w[i];\n" +
        "  return mat2x4<f32>(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)),\n" +
        "    vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));\n}\n";
    case "f32":
      return "@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;\n" +
        "fn load_w8(i: u32) -> mat2x4<f32> {\n  return mat2x4<f32>(w[2u * i], w[2u * i + 1u]);\n}\n";
    case "int4":
      return quantBindings("u32") + UNPACK4.int4 +
        "fn load_w8(i: u32) -> mat2x4<f32> {\n" +
        "  let v = w[i];\n" +
        "  return mat2x4<f32>(unpack4(v), unpack4(v >> 16u)) * scale_at(i >> 2u);\n}\n";
    case "int8":
      return quantBindings("vec2<u32>") + UNPACK4.int8 +
        "fn load_w8(i: u32) -> mat2x4<f32> {\n" +
        "  let v = w[i];\n" +
        "  return mat2x4<f32>(unpack4(v.x), unpack4(v.y)) * scale_at(i >> 2u);\n}\n";
  }
}

/**
 * Weight bindings of `unrolled` on quantized weights (`matmul_unrolled_q.wgsl`): `load_q8(i)`,
 * the 8 unscaled values of step i, and `scale_at(g)`.
 */
function quantWeightBinding8(format: QuantFormat): string {
  return format === "int4"
    ? quantBindings("u32") + UNPACK4.int4 +
      "fn load_q8(i: u32) -> mat2x4<f32> {\n" +
      "  let v = w[i];\n" +
      "  return mat2x4<f32>(unpack4(v), unpack4(v >> 16u));\n}\n"
    : quantBindings("vec2<u32>") + UNPACK4.int8 +
      "fn load_q8(i: u32) -> mat2x4<f32> {\n" +
      "  let v = w[i];\n" +
      "  return mat2x4<f32>(unpack4(v.x), unpack4(v.y));\n}\n";
}

/** WGSL: SwiGLU of gate `g` and up `u`, as matmul_x_swiglu.wgsl computes it. */
const SILU_MUL4 = "fn silu_mul4(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {\n" +
  "  return g / (1.0 + exp(-g)) * u;\n}\n";

/**
 * X binding of `unrolled` on a SwiGLU gate|up buffer (`[M, 2K]`, see {@linkcode XForm}): the
 * interface of {@linkcode xBinding8}, each X value `silu_mul4(gate, up)`.
 */
function xBinding8Swiglu(vec4: boolean): string {
  return SILU_MUL4 + (vec4
    ? "@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;\n" +
      "fn load_x8(row: u32, q: u32) -> mat2x4<f32> {\n" +
      "  let b = row * (p.k / 2u) + 2u * q;\n" +
      "  let u = b + p.k / 4u;\n" +
      "  return mat2x4<f32>(silu_mul4(x[b], x[u]), silu_mul4(x[b + 1u], x[u + 1u]));\n}\n" +
      "fn load_x8_tail(row: u32, q: u32, rem: u32) -> mat2x4<f32> {\n" +
      "  let b = row * (p.k / 2u) + 2u * q;\n" +
      "  let u = b + p.k / 4u;\n" +
      "  let hi = select(vec4<f32>(0.0), silu_mul4(x[b + 1u], x[u + 1u]), rem > 4u);\n" +
      "  return mat2x4<f32>(silu_mul4(x[b], x[u]), hi);\n}\n"
    : "@group(0) @binding(0) var<storage, read> x: array<f32>;\n" +
      "fn load_x8(row: u32, q: u32) -> mat2x4<f32> {\n" +
      "  let b = row * 2u * p.k + 8u * q;\n" +
      "  let u = b + p.k;\n" +
      "  return mat2x4<f32>(\n" +
      "    silu_mul4(vec4<f32>(x[b], x[b + 1u], x[b + 2u], x[b + 3u]),\n" +
      "      vec4<f32>(x[u], x[u + 1u], x[u + 2u], x[u + 3u])),\n" +
      "    silu_mul4(vec4<f32>(x[b + 4u], x[b + 5u], x[b + 6u], x[b + 7u]),\n" +
      "      vec4<f32>(x[u + 4u], x[u + 5u], x[u + 6u], x[u + 7u])));\n}\n" +
      "fn load_x8_tail(row: u32, q: u32, rem: u32) -> mat2x4<f32> {\n" +
      "  let v = load_x8(row, q);\n" +
      "  let r = vec4<u32>(rem);\n" +
      "  return mat2x4<f32>(select(vec4<f32>(0.0), v[0], vec4<u32>(0u, 1u, 2u, 3u) < r),\n" +
      "    select(vec4<f32>(0.0), v[1], vec4<u32>(4u, 5u, 6u, 7u) < r));\n}\n");
}

/**
 * X binding of `unrolled`: `load_x8` / `load_x8_tail` over vec4s when every row starts on a
 * vec4 (K % 4 == 0), else over scalars.
 */
function xBinding8(vec4: boolean): string {
  return vec4
    ? "@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;\n" +
      "fn load_x8(row: u32, q: u32) -> mat2x4<f32> {\n" +
      "  let b = row * (p.k / 4u) + 2u * q;\n" +
      "  return mat2x4<f32>(x[b], x[b + 1u]);\n}\n" +
      "fn load_x8_tail(row: u32, q: u32, rem: u32) -> mat2x4<f32> {\n" +
      "  let b = row * (p.k / 4u) + 2u * q;\n" +
      "  return mat2x4<f32>(x[b], select(vec4<f32>(0.0), x[b + 1u], rem > 4u));\n}\n"
    : "@group(0) @binding(0) var<storage, read> x: array<f32>;\n" +
      "fn load_x8(row: u32, q: u32) -> mat2x4<f32> {\n" +
      "  let b = row * p.k + 8u * q;\n" +
      "  return mat2x4<f32>(vec4<f32>(x[b], x[b + 1u], x[b + 2u], x[b + 3u]),\n" +
      "    vec4<f32>(x[b + 4u], x[b + 5u], x[b + 6u], x[b + 7u]));\n}\n" +
      "fn load_x8_tail(row: u32, q: u32, rem: u32) -> mat2x4<f32> {\n" +
      "  let b = row * p.k + 8u * q;\n" +
      "  var v: array<f32, 8>;\n" +
      "  for (var j = 0u; j < 8u; j++) {\n" +
      "    v[j] = select(0.0, x[b + min(j, rem - 1u)], j < rem);\n  }\n" +
      "  return mat2x4<f32>(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));\n}\n";
}

/**
 * The prelude of matmul_x_rms.wgsl: its bindings, `raw1`, `keep1` and `gamma_at` for a norm
 * weight of `dtype` (f16 read as packed pairs: no `shader-f16` needed).
 */
function xRmsPrelude(residual: boolean, dtype: DType): string {
  const gamma = dtype === "f16"
    ? "@group(0) @binding(7) var<storage, read> gamma: array<u32>;\n" +
      "fn gamma_at(k: u32) -> f32 {\n" +
      "  let pair = unpack2x16float(gamma[k >> 1u]);\n" +
      "  return select(pair.x, pair.y, (k & 1u) == 1u);\n}\n"
    : "@group(0) @binding(7) var<storage, read> gamma: array<f32>;\n" +
      "fn gamma_at(k: u32) -> f32 {\n  return gamma[k];\n}\n";
  const stream = residual
    ? "@group(0) @binding(6) var<storage, read> delta: array<f32>;\n" +
      "@group(0) @binding(8) var<storage, read_write> h_out: array<f32>;\n" +
      "fn raw1(i: u32) -> f32 {\n  return x[i] + delta[i];\n}\n" +
      "fn keep1(i: u32, v: f32) {\n  h_out[i] = v;\n}\n"
    : "fn raw1(i: u32) -> f32 {\n  return x[i];\n}\n" +
      "fn keep1(i: u32, v: f32) {}\n";
  return "@group(0) @binding(0) var<storage, read> x: array<f32>;\n" + gamma + stream;
}

/** The X form of `gemv` and `tiled`, with the `_stat` interface (matmul_x_nostat.wgsl). */
function xStatBinding(xForm: XForm, normDtype: DType): string {
  if (isNormXForm(xForm)) return xRmsPrelude(xForm === "rms_residual", normDtype) + xRmsSource;
  return (xForm === "swiglu" ? xSwigluSource : xSource) + xNoStatSource;
}

function biasBinding(bias: boolean): string {
  return bias
    ? "@group(0) @binding(2) var<storage, read> bias: array<f32>;\n" +
      "fn bias_at(n: u32) -> f32 {\n  return bias[n];\n}\n"
    : "fn bias_at(n: u32) -> f32 {\n  return 0.0;\n}\n";
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
 * `gemvRows` is the weight rows per `gemv` invocation (one of {@linkcode GEMV_ROW_BLOCKS}).
 *
 * @throws {RangeError} for a norm X form with a kernel other than `gemv` or `tiled`, or a
 *   `gemvRows` that is not one of {@linkcode GEMV_ROW_BLOCKS}.
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
): KernelSource {
  const quant = format === "int8" || format === "int4" ? format : null;
  const w = variant !== "unrolled"
    ? weightBinding(format)
    : quant === null
    ? weightBinding8(format)
    : quantWeightBinding8(quant);
  const swiglu = xForm === "swiglu";
  const stat = variant === "gemv" || variant === "tiled";
  if (isNormXForm(xForm) && !stat) {
    throw new RangeError(`Cannot build matmul ${variant} with X ${xForm}: only gemv and tiled`);
  }
  const x = stat
    ? xStatBinding(xForm, normDtype)
    : variant === "unrolled"
    ? (swiglu ? xBinding8Swiglu(xVec4) : xBinding8(xVec4))
    : (swiglu ? xSwigluSource : xSource);
  const prelude = x + w + biasBinding(bias);
  const kernel = (consts: Record<string, number>, source: string, rowsPerGroup: number) => ({
    code: prelude + Object.entries(consts).map(([k, v]) => `const ${k} = ${v}u;\n`).join("") +
      ioSource + source,
    rowsPerGroup,
    mPerGroup: consts.MB ?? consts.WY! * consts.TM!,
  });
  switch (variant) {
    case "unrolled": {
      const template = quant === null ? unrolledSource : withQuantLoop(unrolledSource);
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
      const xs = isNormXForm(xForm) ? 2 : 1;
      const source = unrollTemplate(gemvSource, { i: mb, r: gemvRows });
      const consts = { MB: mb, TPR: GEMV_TPR, RPW: GEMV_RPW, RB: gemvRows, XS: xs };
      return kernel(consts, source, GEMV_RPW * gemvRows);
    }
    case "tiled": {
      checkTile(tile);
      const { wx, wy, bk } = tile;
      const source = unrollTemplate(tiledSource, { i: (4 * bk) / wx, r: 1 });
      return { ...kernel({ WX: wx, WY: wy, BK: bk }, source, 4 * wx), mPerGroup: 4 * wy };
    }
  }
}
