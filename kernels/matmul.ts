/**
 * `matmul`: `Y = X W^T (+ bias)`, the projections of a transformer layer and the LM head.
 *
 * X is f32 `[M, K]`, W a {@linkcode GpuMatrix} `[N, K]` in the Hugging Face `[out, in]` layout
 * (f16 or f32, possibly split by rows across several buffers), Y f32 `[M, ldy]` of which columns
 * `[0, N)` are written. Every product is accumulated in f32.
 *
 * Three kernels sit behind the one {@linkcode Matmul} class:
 * - `tiled` (`matmul_tiled.wgsl`): workgroup tiles of X and W in `var<workgroup>`, a 4 x 4
 *   register block per invocation, K walked in tiles. The prefill kernel of a real GPU.
 * - `gemv` (`matmul_gemv.wgsl`): 64 invocations share a weight row (coalesced reads) and reduce
 *   in workgroup memory; every weight row is read once for up to 8 rows of X. The decode kernel
 *   of a real GPU.
 * - `blocked` (`matmul_blocked.wgsl`): no workgroup memory, no barriers; one invocation owns 4
 *   weight rows x MB rows of X and streams them from storage. On lavapipe (Vulkan on the CPU)
 *   each lane issues its own loads and a barrier is a coroutine switch per lane group, so this is
 *   several times faster there than either kernel above, for decode and prefill alike.
 * - `blocked8` (`matmul_blocked8.wgsl`): the same idea with 8 weight rows per invocation, one
 *   16-byte load per row for 8 weights and each X value loaded once for all 8 rows. Inside a
 *   loop lavapipe runs every storage load as a per-lane loop over its 32-bit components, so the
 *   number of loads, not bytes, sets the speed: measured on lavapipe (2 cores, Qwen3-0.6B
 *   gate_up, f16) about 1.7x faster than `blocked` at M = 1 and 2x at M = 8. Needs a weight row
 *   stride that is a multiple of 8.
 * - `unrolled` (`matmul_unrolled.wgsl`): `blocked8`'s loads with the register tile (MB x RN =
 *   up to 16 x 16) written out line by line (`kernels/unroll.ts`) instead of kept in arrays, and
 *   X read as vec4s when K % 4 == 0. Measured on lavapipe (2 cores, gate_up 6144 x 1024 f16,
 *   2026-11-22, `bench/matmul_bench.ts`): see docs/benchmarks.md. The CPU policy uses it
 *   whenever the weight row stride is a multiple of 8 and falls back to `blocked` otherwise.
 *
 * The kernel is chosen per call from M and the {@linkcode MatmulPolicy} (fixed per adapter, see
 * {@linkcode defaultMatmulPolicy}): `M <= decodeMaxRows` (default {@linkcode DECODE_MAX_ROWS})
 * is decode, larger M is prefill. Tests and benchmarks may force a kernel per call.
 *
 * Weights must be created with `padColsTo: 4` (row stride a multiple of 4, zero padding), so
 * kernels read whole vec4s of W; f16 weights are read as pairs of packed halves
 * (`unpack2x16float`), which needs no `shader-f16`.
 *
 * @module
 */

import blockedSource from "./matmul_blocked.wgsl" with { type: "text" };
import blocked8Source from "./matmul_blocked8.wgsl" with { type: "text" };
import unrolledSource from "./matmul_unrolled.wgsl" with { type: "text" };
import gemvSource from "./matmul_gemv.wgsl" with { type: "text" };
import tiledSource from "./matmul_tiled.wgsl" with { type: "text" };
import type { GpuContext } from "../engine/gpu/context.ts";
import type { DType } from "../engine/gpu/dtype.ts";
import type { ParamArena, ParamSlot } from "../engine/gpu/params.ts";
import type { GpuMatrix } from "../engine/gpu/tensor.ts";
import { MAX_GROUPS_PER_DIM } from "./dispatch.ts";
import { unrollTemplate } from "./unroll.ts";

/** The kernels behind {@linkcode Matmul} (see the module documentation). */
export type MatmulVariant = "tiled" | "gemv" | "blocked" | "blocked8" | "unrolled";

/**
 * Which kernels an adapter uses: `"gpu"` (tiled prefill, workgroup-reduction GEMV decode) or
 * `"cpu"` (the barrier-free `unrolled` / `blocked` kernels for both; for software adapters like
 * lavapipe).
 */
export type MatmulPolicy = "gpu" | "cpu";

/** Default largest M treated as decode (GEMV-style kernels); larger M is prefill. */
export const DECODE_MAX_ROWS = 16;

/** Options of {@linkcode Matmul}. */
export interface MatmulOptions {
  /** Element type of the weight matrices this instance multiplies. */
  readonly dtype: DType;
  /** Whether ops add a bias `[N]` (then `bias` must be given to {@linkcode Matmul.bind}). */
  readonly bias: boolean;
  /** Kernel policy; default {@linkcode defaultMatmulPolicy} for the context's adapter. */
  readonly policy?: MatmulPolicy;
  /** Largest M run by the decode kernel; default {@linkcode DECODE_MAX_ROWS}. */
  readonly decodeMaxRows?: number;
}

/** Buffers of one matmul call site; fixed for the op's lifetime. */
export interface MatmulBuffers {
  /** f32 `[M, K]` (row stride K, K = `weight.cols`), for every M the op will be encoded with. */
  readonly x: GPUBufferBinding;
  /** `[N, K]` f16 or f32 weight (`[out, in]`), created with `padColsTo: 4`. */
  readonly weight: GpuMatrix;
  /** f32 `[N]`; required exactly when the {@linkcode Matmul} was created with `bias: true`. */
  readonly bias?: GPUBufferBinding;
  /** f32 `[M, ldy]`; columns `[0, N)` of each row are written, the others are left untouched. */
  readonly y: GPUBufferBinding;
  /** Row stride of `y` in elements (>= N), to write into a wider buffer; default N. */
  readonly ldy?: number;
}

/** Per-call options of {@linkcode MatmulOp.encode}. */
export interface MatmulEncodeOptions {
  /** Forces a kernel instead of the policy's choice (tests, benchmarks). */
  readonly variant?: MatmulVariant;
}

/**
 * The kernel policy for `ctx`'s adapter: `"cpu"` for a fallback / software adapter (lavapipe,
 * llvmpipe, SwiftShader), where barriers and per-lane loads dominate (measured: the
 * workgroup-reduction GEMV and the shared-memory tiled kernel are several times slower there
 * than the `blocked` kernel), else `"gpu"`.
 */
export function defaultMatmulPolicy(ctx: GpuContext): MatmulPolicy {
  const a = ctx.adapter;
  return a.isFallback || /llvmpipe|lavapipe|swiftshader/i.test(a.description) ? "cpu" : "gpu";
}

/** Register-block sizes (X rows per invocation) compiled for the `blocked` / `gemv` kernels. */
const ROW_BLOCKS = [1, 2, 4, 8] as const;
/** X rows per invocation of the `blocked` kernel when it runs a prefill (M > decodeMaxRows). */
const BLOCKED_PREFILL_MB = 8;
/** `blocked`: weight rows per invocation and workgroup size. */
const BLOCKED_RN = 4;
const BLOCKED_WG = 64;
/**
 * `blocked8`: weight rows per invocation and workgroup size (measured on lavapipe: RN 16 was
 * slower, WG 16 and 64 equal; 16 gives the 1024-row projections 8 workgroups for the threads).
 */
const BLOCKED8_RN = 8;
const BLOCKED8_WG = 16;
/**
 * `unrolled`: X-row blocks compiled (the smallest >= M is used; M above the last runs several
 * blocks in grid z), weight rows per invocation and workgroup size. Measured on lavapipe
 * (gate_up 16384 x 1024 f16): RN 16 beat 8 and 32 at M = 1 and 16; MB 16 x RN 16 reached 40
 * GFLOP/s against 28-30 for 8 x 16 and 8 x 32; one 8-lane SIMD group per workgroup.
 */
const UNROLLED_BLOCKS = [1, 2, 4, 8, 16] as const;
const UNROLLED_RN = 16;
const UNROLLED_WG = 8;
/** `gemv`: invocations per weight row and weight rows per workgroup. */
const GEMV_TPR = 64;
const GEMV_RPW = 4;
/** `tiled`: invocations (WX, WY), register block TM x TN, K tile BK. */
const TILE = { wx: 16, wy: 16, tm: 4, tn: 4, bk: 16 } as const;

/** One compiled kernel configuration and how to size its grid. */
interface KernelConfig {
  readonly key: string;
  readonly variant: MatmulVariant;
  readonly pipeline: GPUComputePipeline;
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

/** Weight binding of `blocked8`: 8 weights per element of `w` (row stride a multiple of 8). */
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

/** Bytes a binding exposes. */
function bindingBytes(b: GPUBufferBinding): number {
  return b.size ?? b.buffer.size - (b.offset ?? 0);
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
  /** Largest M run by the decode kernel. */
  readonly decodeMaxRows: number;
  readonly #ctx: GpuContext;
  readonly #prelude: string;
  readonly #prelude8: string;
  readonly #configs = new Map<string, KernelConfig>();

  constructor(ctx: GpuContext, options: MatmulOptions) {
    const decodeMaxRows = options.decodeMaxRows ?? DECODE_MAX_ROWS;
    if (!Number.isInteger(decodeMaxRows) || decodeMaxRows < 0) {
      throw new RangeError(`decodeMaxRows must be a non-negative integer: got ${decodeMaxRows}`);
    }
    this.#ctx = ctx;
    this.dtype = options.dtype;
    this.bias = options.bias;
    this.policy = options.policy ?? defaultMatmulPolicy(ctx);
    this.decodeMaxRows = decodeMaxRows;
    this.#prelude = weightBinding(this.dtype) + biasBinding(this.bias);
    this.#prelude8 = weightBinding8(this.dtype) + biasBinding(this.bias);
    // Compile what the policy uses up front; forced variants (and `blocked`, the CPU fallback
    // for row strides that are not a multiple of 8) compile on first use.
    if (this.policy === "cpu") {
      for (const mb of UNROLLED_BLOCKS) this.config("unrolled", mb, true);
    } else {
      for (const mb of ROW_BLOCKS) this.config("gemv", mb);
      this.config("tiled", TILE.wy * TILE.tm);
    }
  }

  /**
   * The kernel configuration for `variant` covering `mb` rows of X per workgroup (`tiled`
   * ignores `mb`), compiled on first use.
   * @internal
   */
  config(variant: MatmulVariant, mb: number, xVec4 = false): KernelConfig {
    const tag = `matmul/${variant}/${this.dtype}/${this.bias ? "bias" : "nobias"}`;
    const key = variant === "tiled"
      ? tag
      : variant === "unrolled"
      ? `${tag}/mb${mb}/x${xVec4 ? 4 : 1}`
      : `${tag}/mb${mb}`;
    let config = this.#configs.get(key);
    if (config !== undefined) return config;
    let code: string;
    let rowsPerGroup: number;
    let mPerGroup = mb;
    let prelude = this.#prelude;
    if (variant === "unrolled") {
      code = `const MB = ${mb}u;\nconst RN = ${UNROLLED_RN}u;\nconst WG = ${UNROLLED_WG}u;\n` +
        unrollTemplate(unrolledSource, { i: mb, r: UNROLLED_RN });
      rowsPerGroup = UNROLLED_RN * UNROLLED_WG;
      prelude = xBinding8(xVec4) + this.#prelude8;
    } else if (variant === "blocked8") {
      code = `const MB = ${mb}u;\nconst RN = ${BLOCKED8_RN}u;\nconst WG = ${BLOCKED8_WG}u;\n` +
        blocked8Source;
      rowsPerGroup = BLOCKED8_RN * BLOCKED8_WG;
      prelude = this.#prelude8;
    } else if (variant === "blocked") {
      code = `const MB = ${mb}u;\nconst RN = ${BLOCKED_RN}u;\nconst WG = ${BLOCKED_WG}u;\n` +
        blockedSource;
      rowsPerGroup = BLOCKED_RN * BLOCKED_WG;
    } else if (variant === "gemv") {
      code = `const MB = ${mb}u;\nconst TPR = ${GEMV_TPR}u;\nconst RPW = ${GEMV_RPW}u;\n` +
        gemvSource;
      rowsPerGroup = GEMV_RPW;
    } else {
      const t = TILE;
      code = `const WX = ${t.wx}u;\nconst WY = ${t.wy}u;\nconst TM = ${t.tm}u;\n` +
        `const TN = ${t.tn}u;\nconst BK = ${t.bk}u;\n` + tiledSource;
      rowsPerGroup = t.wx * t.tn;
      mPerGroup = t.wy * t.tm;
    }
    const pipeline = this.#ctx.pipeline(key, () => prelude + code);
    config = { key, variant, pipeline, rowsPerGroup, mPerGroup };
    this.#configs.set(key, config);
    return config;
  }

  /**
   * The kernel configuration the policy (or `variant`) picks for `m` rows of X and a weight
   * of `cols` columns whose row stride is `rowStride` elements. @internal
   */
  choose(m: number, cols: number, rowStride: number, variant?: MatmulVariant): KernelConfig {
    const decode = m <= this.decodeMaxRows;
    const v = variant ??
      (this.policy === "cpu"
        ? (rowStride % 8 === 0 ? "unrolled" : "blocked")
        : decode
        ? "gemv"
        : "tiled");
    if ((v === "blocked8" || v === "unrolled") && rowStride % 8 !== 0) {
      throw new RangeError(
        `Cannot encode matmul with ${v}: weight row stride ${rowStride} is not a multiple of 8`,
      );
    }
    if (v === "tiled") return this.config("tiled", 0);
    if (v === "unrolled") {
      const mb = UNROLLED_BLOCKS.find((b) => b >= m) ??
        UNROLLED_BLOCKS[UNROLLED_BLOCKS.length - 1]!;
      return this.config(v, mb, cols % 4 === 0);
    }
    if ((v === "blocked" || v === "blocked8") && !decode) {
      return this.config(v, BLOCKED_PREFILL_MB);
    }
    // Smallest compiled block >= m (up to 8; larger m runs several blocks in grid z).
    const mb = ROW_BLOCKS.find((b) => b >= m) ?? ROW_BLOCKS[ROW_BLOCKS.length - 1]!;
    return this.config(v, mb);
  }

  /**
   * Creates a call site: validates the shapes, allocates one parameter slot per weight part and
   * creates the bind groups of the policy's kernels (once, here).
   *
   * @throws {TypeError} when the weight dtype or the bias presence does not match this instance.
   * @throws {RangeError} when the weight row stride is not a multiple of 4, `ldy < N`, or a
   *   buffer cannot hold one row.
   */
  bind(arena: ParamArena, buffers: MatmulBuffers): MatmulOp {
    const w = buffers.weight;
    if (w.dtype !== this.dtype) {
      throw new TypeError(
        `Cannot bind matmul: weight ${w.label} is ${w.dtype}, kernel is ${this.dtype}`,
      );
    }
    if (w.rowStride % 4 !== 0) {
      throw new RangeError(
        `Cannot bind matmul: weight ${w.label} has row stride ${w.rowStride}, not a multiple of 4 ` +
          `(create it with padColsTo: 4)`,
      );
    }
    if (this.bias !== (buffers.bias !== undefined)) {
      throw new TypeError(
        `Cannot bind matmul: kernel was created ${this.bias ? "with" : "without"} bias, ` +
          `bias buffer ${buffers.bias === undefined ? "missing" : "given"}`,
      );
    }
    const ldy = buffers.ldy ?? w.rows;
    if (!Number.isInteger(ldy) || ldy < w.rows) {
      throw new RangeError(`Cannot bind matmul: ldy ${ldy} is less than N = ${w.rows}`);
    }
    const xRows = Math.floor(bindingBytes(buffers.x) / (4 * w.cols));
    const yRows = Math.floor((bindingBytes(buffers.y) / 4 - w.rows) / ldy) + 1;
    if (xRows < 1) {
      throw new RangeError(
        `Cannot bind matmul: x holds ${
          bindingBytes(buffers.x)
        } bytes, less than one row of K = ${w.cols}`,
      );
    }
    if (bindingBytes(buffers.y) < 4 * w.rows) {
      throw new RangeError(
        `Cannot bind matmul: y holds ${
          bindingBytes(buffers.y)
        } bytes, less than one row of N = ${w.rows}`,
      );
    }
    if (buffers.bias !== undefined && bindingBytes(buffers.bias) < 4 * w.rows) {
      throw new RangeError(
        `Cannot bind matmul: bias holds ${bindingBytes(buffers.bias)} bytes, N = ${w.rows} needs ${
          4 * w.rows
        }`,
      );
    }
    const slots = w.parts.map(() => arena.allocate());
    const op = new MatmulOp(this, this.#ctx.device, buffers, slots, ldy, Math.min(xRows, yRows));
    for (const config of this.#configs.values()) {
      // blocked8 and unrolled read 8-element steps: only weights whose row stride allows it are
      // bound; unrolled's vec4 X loads need K % 4 == 0.
      const steps8 = config.variant === "blocked8" || config.variant === "unrolled";
      const xOk = config.variant !== "unrolled" || config.key.endsWith("/x1") || w.cols % 4 === 0;
      if ((!steps8 || w.rowStride % 8 === 0) && xOk) op.bindGroups(config);
    }
    return op;
  }
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
  readonly #groups = new Map<string, GPUBindGroup[]>();

  /** @internal Use {@linkcode Matmul.bind}. */
  constructor(
    matmul: Matmul,
    device: GPUDevice,
    buffers: MatmulBuffers,
    slots: readonly ParamSlot[],
    ldy: number,
    maxRows: number,
  ) {
    this.#matmul = matmul;
    this.#device = device;
    this.#buffers = buffers;
    this.#slots = slots;
    this.#ldy = ldy;
    this.maxRows = maxRows;
  }

  /** The bind groups (one per weight part) of `config`, created on first use. @internal */
  bindGroups(config: KernelConfig): GPUBindGroup[] {
    let groups = this.#groups.get(config.key);
    if (groups !== undefined) return groups;
    const b = this.#buffers;
    const layout = config.pipeline.getBindGroupLayout(0);
    groups = b.weight.parts.map((part, i) => {
      const entries: GPUBindGroupEntry[] = [
        { binding: 0, resource: b.x },
        { binding: 1, resource: { buffer: part.buffer } },
        { binding: 3, resource: b.y },
        { binding: 4, resource: this.#slots[i]!.binding },
      ];
      if (b.bias !== undefined) entries.push({ binding: 2, resource: b.bias });
      return this.#device.createBindGroup({ label: config.key, layout, entries });
    });
    this.#groups.set(config.key, groups);
    return groups;
  }

  /**
   * Encodes `y[0..m) = x[0..m) W^T (+ bias)`: one dispatch per weight part, each writing its
   * columns `[part.rowStart, part.rowStart + part.rows)`. Writes the parts' parameter slots, so
   * flush the arena before submitting, and do not encode the same op twice in one submission
   * with different `m`.
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
    const config = this.#matmul.choose(m, w.cols, w.rowStride, options.variant);
    const groups = this.bindGroups(config);
    const gz = Math.ceil(m / config.mPerGroup);
    if (gz > MAX_GROUPS_PER_DIM) {
      throw new RangeError(`Cannot encode matmul: m = ${m} needs ${gz} workgroups in z`);
    }
    pass.setPipeline(config.pipeline);
    for (let i = 0; i < w.parts.length; i++) {
      const part = w.parts[i]!;
      const n = Math.ceil(part.rows / config.rowsPerGroup);
      this.#slots[i]!.setU32(0, m, part.rows, w.cols, w.rowStride / 4, this.#ldy, part.rowStart, n);
      pass.setBindGroup(0, groups[i]!);
      const gy = Math.ceil(n / MAX_GROUPS_PER_DIM);
      pass.dispatchWorkgroups(Math.ceil(n / gy), gy, gz);
    }
  }
}
