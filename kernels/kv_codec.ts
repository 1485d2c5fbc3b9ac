/**
 * The element type of the paged KV cache in the kernels that write and read it, for every
 * {@linkcode KvDtype}: the WGSL that names a cache binding's element `KVT` and converts it.
 *
 * - Kernels that move four elements at a time (`reshape_and_cache`, `rope_and_cache`, the
 *   workgroup attention kernels) take {@linkcode kvVec4Prelude}: `KVT` is a vec4 of the cache's
 *   f16 / f32, or a u32 of four fp8 codes (kv_fp8_e4m3.wgsl); `kv4(w)` is its values as
 *   vec4<f32>, `kv_pack(v)` the reverse (rounding to the cache dtype), and `kv_stage(w)` its
 *   values as `WT4`, the type the kernels stage K and V in workgroup memory.
 * - The unrolled CPU kernels read rows 8 elements per load through {@linkcode kvLoad8Prelude}:
 *   kv_load8_f16.wgsl (vec4<u32> of packed halves), kv_load8_f32.wgsl, kv_load8_fp8.wgsl
 *   (vec2<u32> of codes).
 *
 * Both define `WT` / `WT4` as the stage dtype ({@linkcode kvStageDtype}) with `enable f16`
 * when it is f16.
 *
 * @module
 */

import load8F16 from "./kv_load8_f16.wgsl" with { type: "text" };
import load8F32 from "./kv_load8_f32.wgsl" with { type: "text" };
import load8Fp8 from "./kv_load8_fp8.wgsl" with { type: "text" };
import fp8Source from "./kv_fp8_e4m3.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import { type DType, type KvDtype, weightPrelude } from "../gpu/dtype.ts";

/** The WGSL sources of the KV element conversions (for the kernels' source digests). */
export const KV_CODEC_SOURCES: readonly string[] = [fp8Source, load8F16, load8F32, load8Fp8];

/**
 * The dtype K and V values are staged in between the cache and f32 arithmetic (`WT4` of the
 * attention kernels' workgroup memory): the cache's own f16 / f32, or for an fp8 cache f16
 * where the adapter has `shader-f16` (every e4m3 value is exact in f16), else f32.
 */
export function kvStageDtype(ctx: GpuContext, kv: KvDtype): DType {
  if (kv !== "fp8_e4m3") return kv;
  return ctx.hasF16 ? "f16" : "f32";
}

/**
 * WGSL of a kernel that reads or writes the cache four elements at a time: the stage dtype's
 * `WT` / `WT4`, `alias KVT` and `kv4`, `kv_stage`, `kv_pack` (see the module doc).
 *
 * @throws {TypeError} for an f16 cache on an adapter without `shader-f16`.
 */
export function kvVec4Prelude(ctx: GpuContext, kv: KvDtype): string {
  checkKvDtype(ctx, kv);
  if (kv === "fp8_e4m3") {
    return weightPrelude(kvStageDtype(ctx, kv)) + fp8Source + "alias KVT = u32;\n" +
      "fn kv4(w: KVT) -> vec4<f32> { return e4m3_unpack4(w); }\n" +
      "fn kv_stage(w: KVT) -> WT4 { return WT4(e4m3_unpack4(w)); }\n" +
      "fn kv_pack(v: vec4<f32>) -> KVT { return e4m3_pack4(v); }\n";
  }
  return weightPrelude(kv) + "alias KVT = WT4;\n" +
    "fn kv4(w: KVT) -> vec4<f32> { return vec4<f32>(w); }\n" +
    "fn kv_stage(w: KVT) -> WT4 { return w; }\n" +
    "fn kv_pack(v: vec4<f32>) -> KVT { return KVT(v); }\n";
}

/**
 * WGSL of an unrolled kernel reading the cache 8 elements per load: the stage dtype's `WT` /
 * `WT4`, `KVT`, `KV8`, `load_k8` and `load_v8` (kv_load8_*.wgsl).
 *
 * @throws {TypeError} for an f16 cache on an adapter without `shader-f16`.
 */
export function kvLoad8Prelude(ctx: GpuContext, kv: KvDtype): string {
  checkKvDtype(ctx, kv);
  const load8 = kv === "fp8_e4m3" ? fp8Source + load8Fp8 : kv === "f16" ? load8F16 : load8F32;
  return weightPrelude(kvStageDtype(ctx, kv)) + load8 + "\n";
}

function checkKvDtype(ctx: GpuContext, kv: KvDtype): void {
  if (kv === "f16" && !ctx.hasF16) {
    throw new TypeError("Cannot compile an f16 KV cache kernel: the adapter lacks shader-f16");
  }
}
