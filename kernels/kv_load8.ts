/**
 * The KV cache element type of the attention kernels' bindings (`KVT` in
 * `paged_attention_{decode,prefill}_io.wgsl`): the workgroup kernels read `WT4` (a vec4 of the
 * KV dtype); the unrolled CPU kernels read rows 8 elements per load through
 * `kv_load8_f16.wgsl` (vec4<u32> of packed halves) or `kv_load8_f32.wgsl`.
 *
 * @module
 */

import load8F16 from "./kv_load8_f16.wgsl" with { type: "text" };
import load8F32 from "./kv_load8_f32.wgsl" with { type: "text" };
import type { DType } from "../gpu/dtype.ts";

/** `KVT` for the workgroup kernels: the weight prelude's WT4. */
export const WORKGROUP_KVT = "alias KVT = WT4;\n";

/** `KVT`, `KV8`, `load_k8` and `load_v8` for an unrolled kernel with a `dtype` KV cache. */
export function kvLoad8Prelude(dtype: DType): string {
  return (dtype === "f16" ? load8F16 : load8F32) + "\n";
}
