/**
 * The decode attention's fused variant (kernels/paged_attention_decode.ts, `rope` in its
 * config): its shape, its inputs, the WGSL of its prologue (paged_attention_decode_rope.wgsl with
 * rope_angle.wgsl and the q/k norm bindings) and its extra bindings.
 *
 * @module
 */

import ropeSource from "./paged_attention_decode_rope.wgsl" with { type: "text" };
import ropeAngleSource from "./rope_angle.wgsl" with { type: "text" };
import { qkNormPrelude } from "./rope_and_cache.ts";
import type { DType } from "../gpu/dtype.ts";
import type { GpuMatrix } from "../gpu/tensor.ts";
import type { GpuContext } from "../gpu/context.ts";

/** The fused variant's shape (see {@linkcode PagedAttentionDecodeConfig.rope}). */
export interface DecodeRopeConfig {
  /** dtype of the q/k head-norm weights, or null when the model has none. */
  readonly normDtype: DType | null;
  /** Epsilon of the head norms; default 1e-6. */
  readonly eps?: number;
}

/** Inputs of the fused variant (the same as `rope_and_cache`'s, per sequence). */
export interface PagedAttentionDecodeRopeBuffers {
  /** u32 `[num_seqs]`: position of each sequence's new token. */
  readonly positions: GPUBufferBinding;
  /** f32 `[headDim / 2]`: RoPE inverse frequencies (rope scaling applied). */
  readonly invFreq: GPUBufferBinding;
  /** u32 `[num_seqs]`: cache slot of each sequence's new token, or 0xFFFFFFFF (no write). */
  readonly slotMapping: GPUBufferBinding;
  /** `[1, headDim]` q and k head-norm weights of the kernel's `normDtype` (when not null). */
  readonly qkNorm?: { readonly q: GpuMatrix; readonly k: GpuMatrix };
}

/**
 * How the fused prologue's caches hold 4 elements: `vec4`, one `KVT` written by `kv_pack` (the
 * workgroup kernel's kernels/kv_codec.ts KVT, the unrolled kernel's f32 vec4); `f16x8` and
 * `fp8_e4m3x8`, half of one element of the unrolled kernel's f16 caches (`KVT = vec4<u32>`, 8
 * packed halves) or fp8 caches (`KVT = vec2<u32>`, 8 codes).
 */
export type KvStoreLayout = "vec4" | "f16x8" | "fp8_e4m3x8";

/** WGSL `store_kv4(i, k, v)`: elements 4i .. 4i + 3 of the flat (read_write) caches. */
function storeKv4(layout: KvStoreLayout): string {
  const body = layout === "f16x8"
    ? "  let w = i / 2u;\n  let h = (i % 2u) * 2u;\n" +
      "  k_cache[w][h] = pack2x16float(k.xy);\n  k_cache[w][h + 1u] = pack2x16float(k.zw);\n" +
      "  v_cache[w][h] = pack2x16float(v.xy);\n  v_cache[w][h + 1u] = pack2x16float(v.zw);\n"
    : layout === "fp8_e4m3x8"
    ? "  k_cache[i / 2u][i % 2u] = e4m3_pack4(k);\n  v_cache[i / 2u][i % 2u] = e4m3_pack4(v);\n"
    : "  k_cache[i] = kv_pack(k);\n  v_cache[i] = kv_pack(v);\n";
  return `fn store_kv4(i: u32, k: vec4<f32>, v: vec4<f32>) {\n${body}}\n`;
}

/**
 * The WGSL sources of the prologue, the generated `store_kv4` and norm weights included (for the
 * attention sources' digest: a cached split choice is measured again when any of them changes).
 */
export const ROPE_PROLOGUE_SOURCES: readonly string[] = [
  ropeSource,
  ropeAngleSource,
  storeKv4("vec4"),
  storeKv4("f16x8"),
  storeKv4("fp8_e4m3x8"),
  qkNormPrelude("f16", 12, 13),
  qkNormPrelude("f32", 12, 13),
];

/**
 * WGSL of the fused prologue, prepended to the decode attention kernel after its cache
 * bindings: rope_angle.wgsl, the q/k norm weights at bindings 12 and 13 (`normDtype`; none when
 * null), `store_kv4` (for caches of `layout`) and paged_attention_decode_rope.wgsl
 * (`FUSED = true`, `rope_prologue`).
 */
export function ropePrologueSource(
  normDtype: DType | null,
  layout: KvStoreLayout = "vec4",
): string {
  return ropeAngleSource + qkNormPrelude(normDtype, 12, 13) + storeKv4(layout) + ropeSource;
}

/**
 * Bindings 9-13 of the fused variant, checked against the kernel's head size and norm dtype.
 *
 * @throws {RangeError} when norm weights are missing, unexpected, or not one `[1, headDim]`
 *   part of `normDtype`.
 */
export function ropeEntries(
  rope: PagedAttentionDecodeRopeBuffers,
  normDtype: DType | null,
  headDim: number,
): GPUBindGroupEntry[] {
  const entries: GPUBindGroupEntry[] = [
    { binding: 9, resource: rope.positions },
    { binding: 10, resource: rope.invFreq },
    { binding: 11, resource: rope.slotMapping },
  ];
  if (normDtype === null) {
    if (rope.qkNorm !== undefined) {
      throw new RangeError(
        "Cannot bind fused paged attention: q/k norm weights for a kernel compiled without norms",
      );
    }
    return entries;
  }
  const norm = rope.qkNorm;
  if (norm === undefined) {
    throw new RangeError(`Cannot bind fused paged attention: it needs ${normDtype} q/k norms`);
  }
  for (const [binding, w] of [[12, norm.q], [13, norm.k]] as const) {
    if (w.parts.length !== 1 || w.cols !== headDim || w.dtype !== normDtype || w.quant) {
      throw new RangeError(
        `Cannot bind fused paged attention: norm weight ${w.label} must be one [1, ` +
          `${headDim}] ${normDtype} part`,
      );
    }
    entries.push({ binding, resource: { buffer: w.parts[0]!.buffer } });
  }
  return entries;
}

/** The unrolled kernel's staging of the new token's k head for the fused prologue. */
export const UNROLLED_ROPE_STAGING = "var<workgroup> sh_s: array<f32, HEAD_DIM>;\n";

/**
 * Workgroup memory of the fused `unrolled` kernel, bytes: its (max, sum) pairs and outputs
 * (paged_attention_decode_unrolled.wgsl) and the prologue's k head, norm scales and partial sums
 * of squares (paged_attention_decode_rope.wgsl, 8 lanes per head).
 */
export function unrolledFusedBytes(group: number, headDim: number): number {
  const wg = 8; // the unrolled kernel's WG
  const normLanes = 8; // paged_attention_decode_rope.wgsl's NORM_LANES
  // sh_ml (vec2 per invocation and head), sh_q (vec4s per invocation, head and 4 dims), sh_s (the
  // k head), sh_rms and sh_sq (per head and the k head: a scale, NORM_LANES partial sums).
  return 8 * wg * group + 16 * wg * group * (headDim / 4) + 4 * headDim +
    4 * (group + 1) * (1 + normLanes);
}

/**
 * Whether the `unrolled` kernel's fused variant fits `ctx`'s workgroup memory for `group` query
 * heads per kv head of `headDim` (Qwen3-0.6B, 2 x 128: 8,940 bytes; 4 x 128: 17,332).
 */
export function unrolledFusedFits(ctx: GpuContext, group: number, headDim: number): boolean {
  return unrolledFusedBytes(group, headDim) <= ctx.limits.maxComputeWorkgroupStorageSize;
}
