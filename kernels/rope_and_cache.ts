/**
 * `rope_and_cache`: the per-head work between the qkv projection and attention, fused into one
 * dispatch: Qwen3's q/k head RMSNorm (when the model has it), rotary position embedding of q and
 * k (rotate-half convention of GPT-NeoX and Hugging Face Llama / Qwen), the rotated q written
 * back in place, and the rotated k and the v of each token written to its paged KV cache slot
 * (the layout of `reshape_and_cache`). See `rope_and_cache.wgsl` for the formulas, precision,
 * bindings and grid.
 *
 * The frequencies are computed on the host (`ropeInvFreq` in engine/model/config.ts, with any
 * `rope_scaling` variant such as llama3's) and uploaded once; the kernel only forms
 * `position * inv_freq`. `head_dim` need not equal `hidden / heads` (Qwen3-0.6B: head_dim 128,
 * hidden 1024, 16 heads).
 *
 * @module
 */

import source from "./rope_and_cache.wgsl" with { type: "text" };
import ropeAngleSource from "./rope_angle.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import { type DType, type KvDtype, weightPrelude } from "../gpu/dtype.ts";
import { kvStageDtype, kvVec4Prelude } from "./kv_codec.ts";
import type { ParamArena } from "../gpu/params.ts";
import type { GpuMatrix } from "../gpu/tensor.ts";
import { CallSite, f32Capacity } from "./call_site.ts";
import { groupsFor } from "./dispatch.ts";
import { type NormShape, normShapePrelude } from "./rms_norm.ts";

/** Buffers of one `rope_and_cache` call site (one layer); fixed for the op's lifetime. */
export interface RopeAndCacheBuffers {
  /** f32 `[tokens, (Hq + 2 Hkv) * headDim]` fused `[q | k | v]`; the q heads are rewritten. */
  readonly qkv: GPUBufferBinding;
  /** u32 `[tokens]`: the position of each token. */
  readonly positions: GPUBufferBinding;
  /** f32 `[headDim / 2]`: RoPE inverse frequencies (rope scaling applied). */
  readonly invFreq: GPUBufferBinding;
  /** u32 `[tokens]`: cache slot `block * blockSize + offset` of each token, or SKIP_SLOT. */
  readonly slotMapping: GPUBufferBinding;
  /** `cacheDtype` `[num_blocks, Hkv, blockSize, headDim]`. */
  readonly kCache: GPUBufferBinding;
  /** `cacheDtype`, same shape as `kCache`. */
  readonly vCache: GPUBufferBinding;
  /**
   * f16/f32 `[1, headDim]` q and k head-norm weights (Qwen3's `q_norm`, `k_norm`), both or
   * neither; without them q and k are only rotated.
   */
  readonly qkNorm?: { readonly q: GpuMatrix; readonly k: GpuMatrix };
}

/** Fixed shape of one `rope_and_cache` call site. */
export interface RopeAndCacheShape {
  readonly numHeads: number;
  readonly numKvHeads: number;
  /** Elements per head; even. */
  readonly headDim: number;
  /** Tokens per cache block. */
  readonly blockSize: number;
  /** Element type of the KV cache (fp8 needs `headDim` a multiple of 8). */
  readonly cacheDtype: KvDtype;
  /** Epsilon of the q/k head norms. Default 1e-6. */
  readonly eps?: number;
}

/** The `rope_and_cache` kernel; {@linkcode RopeAndCache.bind} makes call sites. */
export class RopeAndCache {
  readonly #ctx: GpuContext;
  readonly #shape: { prelude: string; key: string; rowsPerWorkgroup: number };

  /**
   * Pipelines are compiled through `ctx.pipeline` on the first bind of each variant (norm or
   * not, weight and cache dtypes), once per context, never per step.
   *
   * @param shape workgroup shape; default the norm kernels' shape for the adapter
   *   (rms_norm.ts `defaultNormShape`).
   */
  constructor(ctx: GpuContext, shape: NormShape = {}) {
    this.#ctx = ctx;
    this.#shape = normShapePrelude(ctx, "rope_and_cache", shape);
  }

  /**
   * Creates a call site: its bind group and parameter slot are made once, here.
   *
   * @throws {RangeError} on an invalid shape, an `invFreq` shorter than `headDim / 2` or norm
   *   weights that are not `[1, headDim]`.
   */
  bind(arena: ParamArena, buffers: RopeAndCacheBuffers, shape: RopeAndCacheShape): RopeAndCacheOp {
    const { numHeads, numKvHeads, headDim, blockSize, cacheDtype } = shape;
    const eps = shape.eps ?? 1e-6;
    const positive = (n: number) => Number.isInteger(n) && n >= 1;
    if (
      !positive(numHeads) || !positive(numKvHeads) || !positive(blockSize) ||
      !positive(headDim) || headDim % 2 !== 0
    ) {
      throw new RangeError(
        `Cannot bind rope_and_cache: invalid shape (Hq ${numHeads}, Hkv ${numKvHeads}, head dim ${headDim}, block ${blockSize})`,
      );
    }
    if (f32Capacity(buffers.invFreq) < headDim / 2) {
      throw new RangeError(
        `Cannot bind rope_and_cache: invFreq holds ${
          f32Capacity(buffers.invFreq)
        } values, head dim ${headDim} needs ${headDim / 2}`,
      );
    }
    const norm = buffers.qkNorm;
    for (const w of norm === undefined ? [] : [norm.q, norm.k]) {
      if (w.rows !== 1 || w.cols !== headDim || w.parts.length !== 1) {
        throw new RangeError(
          `Cannot bind rope_and_cache: norm weight ${w.label} must be one [1, ${headDim}] part`,
        );
      }
    }
    const normDtype = norm === undefined ? null : norm.q.dtype;
    if (norm !== undefined && norm.k.dtype !== normDtype) {
      throw new RangeError(`Cannot bind rope_and_cache: q and k norm weights differ in dtype`);
    }
    const width = headDim % 8 === 0 ? 4 : 1;
    if (width === 1 && cacheDtype === "fp8_e4m3") {
      throw new RangeError(
        `Cannot bind rope_and_cache: an fp8 KV cache needs a head dim that is a multiple of 8, got ${headDim}`,
      );
    }
    const ctx = this.#ctx;
    const pipeline = this.#ctx.pipeline(
      `rope_and_cache/${normDtype ?? "no_norm"}/${cacheDtype}/${this.#shape.key}/w${width}`,
      () =>
        prelude(ctx, cacheDtype, normDtype, width) + this.#shape.prelude + ropeAngleSource +
        source,
    );
    const site = new CallSite(this.#ctx, arena, pipeline, "rope_and_cache", [
      buffers.qkv,
      buffers.positions,
      buffers.invFreq,
      buffers.slotMapping,
      buffers.kCache,
      buffers.vCache,
      norm === undefined ? undefined : { buffer: norm.q.parts[0]!.buffer },
      norm === undefined ? undefined : { buffer: norm.k.parts[0]!.buffer },
    ]);
    const stride = (numHeads + 2 * numKvHeads) * headDim;
    site.slot.setU32(1, numHeads, numKvHeads, headDim, stride, blockSize).setF32(6, eps);
    return new RopeAndCacheOp(site, {
      heads: numHeads + 2 * numKvHeads,
      stride,
      rowsPerWorkgroup: this.#shape.rowsPerWorkgroup,
      qkvCapacity: f32Capacity(buffers.qkv),
      tokenCapacity: Math.min(f32Capacity(buffers.positions), f32Capacity(buffers.slotMapping)),
    });
  }
}

/**
 * The access width of rope_and_cache.wgsl (VW, XV, sq, angles): 4 elements per access where
 * each half of a head is whole vec4s (head_dim a multiple of 8), else 1.
 */
const WIDTH_PRELUDE = {
  1: "const VW: u32 = 1u;\nalias XV = f32;\n" +
    "fn sq(v: f32) -> f32 { return v * v; }\n" +
    "fn angles(pos: u32, f: f32) -> f32 { return rope_angle(pos, f); }\n",
  4: "const VW: u32 = 4u;\nalias XV = vec4<f32>;\n" +
    "fn sq(v: vec4<f32>) -> f32 { return dot(v, v); }\n" +
    "fn angles(pos: u32, f: vec4<f32>) -> vec4<f32> {\n" +
    "  return vec4<f32>(rope_angle(pos, f.x), rope_angle(pos, f.y), rope_angle(pos, f.z),\n" +
    "    rope_angle(pos, f.w));\n}\n",
} as const;

/**
 * The variant prelude: the cache's `CV` and `to_cv` (kernels/kv_codec.ts: its KVT and kv_pack
 * at width 4; an f16 / f32 scalar at width 1), the access width and {@linkcode qkNormPrelude}
 * with the norm weights at bindings 6 and 7.
 */
function prelude(
  ctx: GpuContext,
  cacheDtype: KvDtype,
  normDtype: DType | null,
  width: 1 | 4,
): string {
  const cache = width === 4
    ? kvVec4Prelude(ctx, cacheDtype) + "alias CV = KVT;\n" +
      "fn to_cv(v: XV) -> CV { return kv_pack(v); }\n"
    : weightPrelude(cacheDtype as DType) + "alias CV = WT;\n" +
      "fn to_cv(v: XV) -> CV { return CV(v); }\n";
  // `enable f16` comes with an f16 stage dtype; an f16 norm beside another adds it.
  const f16 = normDtype === "f16" && kvStageDtype(ctx, cacheDtype) !== "f16" ? "enable f16;\n" : "";
  return f16 + cache + WIDTH_PRELUDE[width] + qkNormPrelude(normDtype, 6, 7, width);
}

/**
 * WGSL of the q/k head norms of a kernel that applies them (rope_and_cache.wgsl, the fused decode
 * attention): `HAS_NORM` and `norm_weight(is_q, i)`, unit i of q_norm or k_norm as f32 (`width`
 * 1) or vec4<f32> (4: elements 4i .. 4i + 3), with those weights (type `NT`, `normDtype`) at
 * bindings `qBinding` and `kBinding`; without norm (`normDtype` null) a weight of 1 and no
 * bindings. `enable f16` is the caller's.
 */
export function qkNormPrelude(
  normDtype: DType | null,
  qBinding: number,
  kBinding: number,
  width: 1 | 4 = 1,
): string {
  const out = width === 1 ? "f32" : "vec4<f32>";
  if (normDtype === null) {
    return `const HAS_NORM = false;\nfn norm_weight(is_q: bool, i: u32) -> ${out} { return ${out}(1.0); }\n`;
  }
  const unit = width === 1 ? "NT" : "vec4<NT>";
  return `alias NT = ${normDtype};
const HAS_NORM = true;
@group(0) @binding(${qBinding}) var<storage, read> q_norm: array<${unit}>;
@group(0) @binding(${kBinding}) var<storage, read> k_norm: array<${unit}>;
fn norm_weight(is_q: bool, i: u32) -> ${out} {
  if (is_q) {
    return ${out}(q_norm[i]);
  }
  return ${out}(k_norm[i]);
}
`;
}

interface BoundShape {
  /** Rows per token: Hq + 2 Hkv. */
  readonly heads: number;
  /** f32 elements per token row of qkv. */
  readonly stride: number;
  readonly rowsPerWorkgroup: number;
  readonly qkvCapacity: number;
  /** Entries `positions` and `slotMapping` both hold. */
  readonly tokenCapacity: number;
}

/** One `rope_and_cache` call site. */
export class RopeAndCacheOp {
  constructor(private readonly site: CallSite, private readonly shape: BoundShape) {}

  /**
   * Encodes the norm, rotation and cache write of `tokens` tokens (0 encodes nothing).
   *
   * @throws {RangeError} when `tokens` rows exceed `qkv`, `positions` or `slotMapping`.
   */
  encode(pass: GPUComputePassEncoder, tokens: number): void {
    const { heads, stride, rowsPerWorkgroup, qkvCapacity, tokenCapacity } = this.shape;
    if (tokens <= 0) return;
    if (tokens * stride > qkvCapacity || tokens > tokenCapacity) {
      throw new RangeError(
        `Cannot encode rope_and_cache for ${tokens} tokens: qkv holds ${
          qkvCapacity / stride
        } rows, positions / slots ${tokenCapacity}`,
      );
    }
    this.site.slot.setU32(0, tokens);
    this.site.dispatch(pass, groupsFor(tokens * heads, rowsPerWorkgroup));
  }
}
