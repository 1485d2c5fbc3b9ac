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
import gemvSource from "./matmul_gemv.wgsl" with { type: "text" };
import tiledSource from "./matmul_tiled.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { DType } from "../gpu/dtype.ts";
import { unrollTemplate } from "./unroll.ts";

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
const UNROLLED_WG = 8;
/** `gemv`: invocations per weight row and weight rows per workgroup. */
const GEMV_TPR = 64;
const GEMV_RPW = 4;
/** `tiled`: invocations (WX, WY), register block TM x TN, K tile BK. */
const TILE = { wx: 16, wy: 16, tm: 4, tn: 4, bk: 16 } as const;

/** A kernel configuration's WGSL source and how to size its grid. */
export interface KernelSource {
  readonly code: string;
  /** Weight rows covered by one workgroup. */
  readonly rowsPerGroup: number;
  /** X rows covered by one workgroup (grid z). */
  readonly mPerGroup: number;
}

function weightBinding(dtype: DType): string {
  return dtype === "f16"
    ? "@group(0) @binding(1) var<storage, read> w: array<vec2<u32>>;\n" +
      "fn load_w4(i: u32) -> vec4<f32> {\n" +
      "  let v = w[i];\n" +
      "  return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));\n}\n"
    : "@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;\n" +
      "fn load_w4(i: u32) -> vec4<f32> {\n  return w[i];\n}\n";
}

/** Weight binding of `unrolled`: 8 weights per element of `w` (row stride a multiple of 8). */
function weightBinding8(dtype: DType): string {
  return dtype === "f16"
    ? "@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;\n" +
      "fn load_w8(i: u32) -> mat2x4<f32> {\n" +
      "  let v = w[i];\n" +
      "  return mat2x4<f32>(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)),\n" +
      "    vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));\n}\n"
    : "@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;\n" +
      "fn load_w8(i: u32) -> mat2x4<f32> {\n  return mat2x4<f32>(w[2u * i], w[2u * i + 1u]);\n}\n";
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

function biasBinding(bias: boolean): string {
  return bias
    ? "@group(0) @binding(2) var<storage, read> bias: array<f32>;\n" +
      "fn bias_at(n: u32) -> f32 {\n  return bias[n];\n}\n"
    : "fn bias_at(n: u32) -> f32 {\n  return 0.0;\n}\n";
}

/**
 * The WGSL source of `variant` for `mb` rows of X per invocation (`tiled` ignores `mb`), `dtype`
 * weights, with or without bias, X read as vec4s (`unrolled`, when K % 4 == 0); the bindings
 * are prepended to the kernel file.
 */
export function kernelSource(
  variant: MatmulVariant,
  mb: number,
  dtype: DType,
  bias: boolean,
  xVec4: boolean,
): KernelSource {
  const w = variant === "unrolled" ? weightBinding8(dtype) : weightBinding(dtype);
  const prelude = (variant === "unrolled" ? xBinding8(xVec4) : "") + w + biasBinding(bias);
  const kernel = (consts: Record<string, number>, source: string, rowsPerGroup: number) => ({
    code: prelude + Object.entries(consts).map(([k, v]) => `const ${k} = ${v}u;\n`).join("") +
      source,
    rowsPerGroup,
    mPerGroup: consts.MB ?? consts.WY! * consts.TM!,
  });
  switch (variant) {
    case "unrolled": {
      const source = unrollTemplate(unrolledSource, { i: mb, r: UNROLLED_RN });
      return kernel(
        { MB: mb, RN: UNROLLED_RN, WG: UNROLLED_WG },
        source,
        UNROLLED_RN * UNROLLED_WG,
      );
    }
    case "blocked":
      return kernel(
        { MB: mb, RN: BLOCKED_RN, WG: BLOCKED_WG },
        blockedSource,
        BLOCKED_RN * BLOCKED_WG,
      );
    case "gemv":
      return kernel({ MB: mb, TPR: GEMV_TPR, RPW: GEMV_RPW }, gemvSource, GEMV_RPW);
    case "tiled": {
      const t = TILE;
      const consts = { WX: t.wx, WY: t.wy, TM: t.tm, TN: t.tn, BK: t.bk };
      return kernel(consts, tiledSource, t.wx * t.tn);
    }
  }
}
