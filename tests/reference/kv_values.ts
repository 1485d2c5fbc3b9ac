/**
 * KV cache values on the host, for every KV dtype: rounded as the cache holds them, as the
 * bytes a cache buffer holds (to upload), and read back from those bytes. fp8 through the
 * format's definition (tests/reference/fp8.ts), not through the engine's WGSL codec.
 *
 * @module
 */

import { type KvDtype, roundTo, toDType } from "../../gpu/dtype.ts";
import { E4M3_VALUES, e4m3Code, e4m3Round } from "./fp8.ts";

/** `values` rounded to `dtype` (what the cache holds), as float64; NaN stays NaN. */
export function roundToKv(values: ArrayLike<number>, dtype: KvDtype): Float64Array {
  if (dtype !== "fp8_e4m3") return roundTo(values, dtype);
  return Float64Array.from({ length: values.length }, (_, i) => e4m3Round(values[i]!));
}

/** The bytes of a cache of `dtype` holding `values` (rounded), to upload. */
export function toKvData(
  values: ArrayLike<number>,
  dtype: KvDtype,
): Float32Array | Float16Array | Uint8Array {
  if (dtype !== "fp8_e4m3") return toDType(values, dtype);
  return Uint8Array.from({ length: values.length }, (_, i) => e4m3Code(values[i]!));
}

/** The values a cache of `dtype` holds in `bytes` (as read back), as float64. */
export function fromKvData(bytes: ArrayBuffer, dtype: KvDtype): Float64Array {
  if (dtype === "fp8_e4m3") return Float64Array.from(new Uint8Array(bytes), (c) => E4M3_VALUES[c]!);
  return Float64Array.from(dtype === "f16" ? new Float16Array(bytes) : new Float32Array(bytes));
}
