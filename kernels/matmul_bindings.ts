/**
 * The WGSL bindings and helper functions the matmul kernels (kernels/matmul_kernels.ts) are
 * assembled from: how X is read (plain, SwiGLU of a gate|up buffer, the RMSNorm of the residual
 * stream, or its input scaled by the factor of partial sums), the bias and the residual
 * epilogue's outputs, each as a WGSL string prepended to a kernel file. How weights are read (f32,
 * f16 pairs, int8 / int4 words with f16 group scales) is in kernels/matmul_weight_bindings.ts.
 *
 * @module
 */

import xSource from "./matmul_x.wgsl" with { type: "text" };
import xSwigluSource from "./matmul_x_swiglu.wgsl" with { type: "text" };
import xRmsSource from "./matmul_x_rms.wgsl" with { type: "text" };
import xNoStatSource from "./matmul_x_nostat.wgsl" with { type: "text" };
import type { DType } from "../gpu/dtype.ts";

/**
 * What a matmul reads as X: `"plain"`, f32 `[M, K]`; or `"swiglu"`, the f32 `[M, 2K]` output of
 * a fused gate/up projection (per row K gate values then K up values) read as its SwiGLU
 * activation `X[m, k] = silu(gate[m, k]) * up[m, k]`, `silu(g) = g / (1 + exp(-g))` (no
 * separate activation dispatch); or the RMSNorm of the f32 `[M, K]` residual stream h (no
 * rms_norm dispatch; `gemv` and `tiled` only, see matmul_x_rms.wgsl): `"rms"`,
 * `X = rms(h) * gamma`; `"rms_residual"`, `r = h + delta` written to the stream's next buffer
 * and `X = rms(r) * gamma`; or `"rms_partials"` (`unrolled` only): the f32 `[M, K]` buffer holds
 * `h * gamma` and each row's sums of squares of h come in blocks of {@linkcode NORM_PARTIAL_ROWS}
 * columns, as the residual epilogue ({@linkcode YForm}) of the projection before wrote them;
 * the row's dot products are scaled by `rsqrt(sum / K + eps)`.
 */
export type XForm = "plain" | "swiglu" | "rms" | "rms_residual" | "rms_partials";

/**
 * What a matmul does with its output: `"plain"`, `y = X W^T (+ bias)`; or `"residual_rms"`
 * (`unrolled` only, one weight part; matmul_unrolled_residual.wgsl): y is the residual stream h,
 * `h += X W^T (+ bias)`, and the next RMSNorm's input is written beside it, `normed = h * gamma`
 * with the sums of squares of h per row in blocks of {@linkcode NORM_PARTIAL_ROWS} columns (the
 * X form `"rms_partials"` of the projection after).
 */
export type YForm = "plain" | "residual_rms";

/**
 * Columns of the residual stream per partial sum of squares (`"residual_rms"` /
 * `"rms_partials"`): the weight rows of one `unrolled` workgroup (kernels/matmul_kernels.ts).
 */
export const NORM_PARTIAL_ROWS = 128;

/** Partial sums of squares per row of a residual stream of `cols` columns. */
export function normPartialsPerRow(cols: number): number {
  return Math.ceil(cols / NORM_PARTIAL_ROWS);
}

/** Whether `xForm` normalises the residual stream (matmul_x_rms.wgsl). */
export function isNormXForm(xForm: XForm): xForm is "rms" | "rms_residual" {
  return xForm === "rms" || xForm === "rms_residual";
}

/** WGSL: SwiGLU of gate `g` and up `u`, as matmul_x_swiglu.wgsl computes it. */
const SILU_MUL4 = "fn silu_mul4(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {\n" +
  "  return g / (1.0 + exp(-g)) * u;\n}\n";

/** Throws unless `uniformVec4s` is 0, or a positive integer with vec4 loads. */
function checkUniformX(vec4: boolean, uniformVec4s: number): void {
  if (uniformVec4s === 0) return;
  if (!vec4 || !Number.isInteger(uniformVec4s) || uniformVec4s < 1) {
    throw new RangeError(
      `Cannot read X through a uniform binding of ${uniformVec4s} vec4s` +
        (vec4 ? "" : ": only with vec4 loads (K % 4 == 0)"),
    );
  }
}

/**
 * The declaration of `unrolled`'s vec4 X binding: a storage array, or with `uniformVec4s > 0` a
 * uniform one of that many vec4s. Measured on lavapipe (Mesa 22.3, 2 cores, M = 1, 2026-11-26):
 * lavapipe issues a storage load as a per-lane loop even when every invocation reads the same X,
 * while a uniform load is one; X loads were ~20% of the int4 kernel's time (6144 x 1024: 0.83 ms,
 * 0.65 ms with X made constant, 0.71 ms through a uniform binding).
 */
function xVec4Declaration(uniformVec4s: number): string {
  return uniformVec4s > 0
    ? `@group(0) @binding(0) var<uniform> x: array<vec4<f32>, ${uniformVec4s}>;\n`
    : "@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;\n";
}

/**
 * X binding of `unrolled` on a SwiGLU gate|up buffer (`[M, 2K]`, see {@linkcode XForm}): the
 * interface of {@linkcode xBinding8}, each X value `silu_mul4(gate, up)`; `uniformVec4s` as
 * there.
 */
export function xBinding8Swiglu(vec4: boolean, uniformVec4s = 0): string {
  checkUniformX(vec4, uniformVec4s);
  return SILU_MUL4 + (vec4
    ? xVec4Declaration(uniformVec4s) +
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
 * vec4 (K % 4 == 0), else over scalars. With `uniformVec4s > 0` (vec4 loads only) X is a
 * uniform binding of that many vec4s: the caller binds exactly that many bytes and runs M
 * rows only when they fit (kernels/matmul_op.ts).
 *
 * @throws {RangeError} for a uniform X without vec4 loads, or a vec4 count that is not a
 *   positive integer.
 */
export function xBinding8(vec4: boolean, uniformVec4s = 0): string {
  checkUniformX(vec4, uniformVec4s);
  return vec4
    ? xVec4Declaration(uniformVec4s) +
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
 * WGSL: a norm weight of `dtype` at binding `binding` as `name` and `fn name_at(k: u32) -> f32`
 * (f16 read as packed pairs: no `shader-f16` needed).
 */
function normWeightBinding(binding: number, name: string, dtype: DType): string {
  return dtype === "f16"
    ? `@group(0) @binding(${binding}) var<storage, read> ${name}: array<u32>;\n` +
      `fn ${name}_at(k: u32) -> f32 {\n` +
      `  let pair = unpack2x16float(${name}[k >> 1u]);\n` +
      "  return select(pair.x, pair.y, (k & 1u) == 1u);\n}\n"
    : `@group(0) @binding(${binding}) var<storage, read> ${name}: array<f32>;\n` +
      `fn ${name}_at(k: u32) -> f32 {\n  return ${name}[k];\n}\n`;
}

/**
 * `unrolled`'s `fn x_rscale(row: u32) -> f32`, the factor of X row `row`'s dot products: 1, or
 * for `"rms_partials"` the RMSNorm's rsqrt from the row's partial sums of squares (binding 9,
 * f32 `[M, ceil(K / NORM_PARTIAL_ROWS)]`, added up in order).
 */
export function xRowScale(xForm: XForm): string {
  if (xForm !== "rms_partials") return "fn x_rscale(row: u32) -> f32 {\n  return 1.0;\n}\n";
  return "@group(0) @binding(9) var<storage, read> x_partials: array<f32>;\n" +
    "fn x_rscale(row: u32) -> f32 {\n" +
    `  let blocks = (p.k + ${NORM_PARTIAL_ROWS - 1}u) / ${NORM_PARTIAL_ROWS}u;\n` +
    "  var sum = 0.0;\n" +
    "  for (var j = 0u; j < blocks; j++) {\n" +
    "    sum += x_partials[row * blocks + j];\n  }\n" +
    "  return inverseSqrt(sum / f32(p.k) + p.eps);\n}\n";
}

/**
 * The prelude of matmul_unrolled_residual.wgsl (the `"residual_rms"` epilogue, MB rows of X per
 * invocation, WG invocations): the next norm's weight of `dtype` (binding 10), `normed` (11),
 * `y_partials` (12), `store_residual` and the workgroup's `sh_sq`.
 */
export function residualOutBinding(dtype: DType): string {
  return normWeightBinding(10, "out_gamma", dtype) +
    "@group(0) @binding(11) var<storage, read_write> normed: array<f32>;\n" +
    "@group(0) @binding(12) var<storage, read_write> y_partials: array<f32>;\n" +
    "var<workgroup> sh_sq: array<f32, WG * MB>;\n" +
    "fn store_residual(m: u32, n: u32, v: f32) -> f32 {\n" +
    "  let i = m * p.ldy + p.n0 + n;\n" +
    "  let h = y[i] + v + bias_at(p.n0 + n);\n" +
    "  y[i] = h;\n" +
    "  normed[i] = h * out_gamma_at(p.n0 + n);\n" +
    "  return h * h;\n}\n";
}

/**
 * A read-only f32 binding `name` at `binding` and `fn <name>1(i: u32) -> f32` (element i): as
 * scalars, or (`vec4`) as vec4s, whose element i is component i % 4 of vec4 i / 4.
 */
function f32Access(binding: number, name: string, vec4: boolean): string {
  return vec4
    ? `@group(0) @binding(${binding}) var<storage, read> ${name}: array<vec4<f32>>;\n` +
      `fn ${name}1(i: u32) -> f32 {\n  return ${name}[i >> 2u][i & 3u];\n}\n`
    : `@group(0) @binding(${binding}) var<storage, read> ${name}: array<f32>;\n` +
      `fn ${name}1(i: u32) -> f32 {\n  return ${name}[i];\n}\n`;
}

/** `fn <name>4(base: u32) -> vec4<f32>`: elements base .. base + 3 of an {@linkcode f32Access}. */
function f32Access4(name: string, vec4: boolean): string {
  return `fn ${name}4(base: u32) -> vec4<f32> {\n` +
    (vec4
      ? `  return ${name}[base >> 2u];\n}\n`
      : `  return vec4<f32>(${name}[base], ${name}[base + 1u], ${name}[base + 2u], ` +
        `${name}[base + 3u]);\n}\n`);
}

/**
 * Binding 0 `x` with `fn x1(i: u32) -> f32` and `fn x4(base: u32) -> vec4<f32>` for
 * matmul_x.wgsl and matmul_x_swiglu.wgsl: f32 scalars, or (`vec4`, K % 4 == 0, so that every
 * `x4` base is a multiple of 4) vec4s, one 16-byte load each.
 */
export function xAccess(vec4: boolean): string {
  return f32Access(0, "x", vec4) + f32Access4("x", vec4);
}

/**
 * The prelude of matmul_x_rms.wgsl: its bindings, `raw1` / `raw4`, `keep1` / `keep4` and
 * `gamma_at` / `gamma4` for a norm weight of `dtype` (f16 read as packed pairs: no `shader-f16`
 * needed; `gamma4`'s k is a multiple of 4, as every `load_x4_stat` caller's is), x, delta and
 * h_out as f32 scalars or (`vec4`, K % 4 == 0) vec4s.
 */
function xRmsPrelude(residual: boolean, dtype: DType, vec4: boolean): string {
  const gamma = normWeightBinding(7, "gamma", dtype) + "fn gamma4(k: u32) -> vec4<f32> {\n" +
    (dtype === "f16"
      ? "  return vec4<f32>(unpack2x16float(gamma[k >> 1u]), unpack2x16float(gamma[(k >> 1u) + 1u]));\n}\n"
      : "  return vec4<f32>(gamma[k], gamma[k + 1u], gamma[k + 2u], gamma[k + 3u]);\n}\n");
  const x = xAccess(vec4);
  const stream = residual
    ? f32Access(6, "delta", vec4) + f32Access4("delta", vec4) +
      `@group(0) @binding(8) var<storage, read_write> h_out: array<${
        vec4 ? "vec4<f32>" : "f32"
      }>;\n` +
      "fn raw1(i: u32) -> f32 {\n  return x1(i) + delta1(i);\n}\n" +
      "fn raw4(base: u32) -> vec4<f32> {\n  return x4(base) + delta4(base);\n}\n" +
      (vec4
        ? "fn keep1(i: u32, v: f32) {\n  h_out[i >> 2u][i & 3u] = v;\n}\n" +
          "fn keep4(base: u32, v: vec4<f32>) {\n  h_out[base >> 2u] = v;\n}\n"
        : "fn keep1(i: u32, v: f32) {\n  h_out[i] = v;\n}\n" +
          "fn keep4(base: u32, v: vec4<f32>) {\n" +
          "  h_out[base] = v.x;\n  h_out[base + 1u] = v.y;\n" +
          "  h_out[base + 2u] = v.z;\n  h_out[base + 3u] = v.w;\n}\n")
    : "fn raw1(i: u32) -> f32 {\n  return x1(i);\n}\n" +
      "fn raw4(base: u32) -> vec4<f32> {\n  return x4(base);\n}\n" +
      "fn keep1(i: u32, v: f32) {}\nfn keep4(base: u32, v: vec4<f32>) {}\n";
  return x + gamma + stream;
}

/**
 * The X form of `gemv` and `tiled`, with the `_stat` interface (matmul_x_nostat.wgsl); `vec4`
 * (`gemv` with K % 4 == 0) reads X (and the norm forms' delta, h_out) as vec4s.
 */
export function xStatBinding(xForm: XForm, normDtype: DType, vec4 = false): string {
  if (isNormXForm(xForm)) {
    return xRmsPrelude(xForm === "rms_residual", normDtype, vec4) + xRmsSource;
  }
  return xAccess(vec4) + (xForm === "swiglu" ? xSwigluSource : xSource) + xNoStatSource;
}

/** `bias_at(n)`: the bias binding's element n, or 0 without a bias. */
export function biasBinding(bias: boolean): string {
  return bias
    ? "@group(0) @binding(2) var<storage, read> bias: array<f32>;\n" +
      "fn bias_at(n: u32) -> f32 {\n  return bias[n];\n}\n"
    : "fn bias_at(n: u32) -> f32 {\n  return 0.0;\n}\n";
}
