/**
 * Element types of GPU tensors and host-side conversions between them.
 *
 * Activations are always f32. Weights and the KV cache are `f16` when the device has
 * `shader-f16`, else `f32` (chosen once at load, see {@linkcode GpuContext.weightDtype}).
 *
 * @module
 */

/** Element type of a tensor stored on the GPU. */
export type DType = "f32" | "f16";

/** Bytes per element of `dtype`. */
export function bytesPerElement(dtype: DType): number {
  return dtype === "f16" ? 2 : 4;
}

/**
 * Element type of the paged KV cache: the weights' `f16` or `f32` (`--kv-cache-dtype auto`), or
 * `fp8_e4m3`, one byte per element (float8_e4m3fn, vLLM's `--kv-cache-dtype fp8`; encoded and
 * decoded in WGSL by kernels/kv_codec.ts).
 */
export type KvDtype = DType | "fp8_e4m3";

/**
 * The KV cache dtype a model runner is asked for: `auto`, the weights' dtype, or an 8-bit one.
 */
export type KvCacheDtypeChoice = "auto" | "fp8_e4m3";

/** The KV dtype `choice` means beside weights of `weights`: theirs for `auto`. */
export function kvDtypeOf(choice: KvCacheDtypeChoice, weights: DType): KvDtype {
  return choice === "auto" ? weights : choice;
}

/** Bytes per element of a KV cache of `dtype`. */
export function kvBytesPerElement(dtype: KvDtype): number {
  return dtype === "fp8_e4m3" ? 1 : bytesPerElement(dtype);
}

/**
 * Converts host values to the typed array a GPU buffer of `dtype` holds.
 * f16 rounds to nearest even (Float16Array semantics).
 */
export function toDType(values: ArrayLike<number>, dtype: DType): Float32Array | Float16Array {
  return dtype === "f16" ? Float16Array.from(values) : Float32Array.from(values);
}

/** Rounds every value through `dtype` (what the GPU sees after upload), as float64. */
export function roundTo(values: ArrayLike<number>, dtype: DType): Float64Array {
  return Float64Array.from(toDType(values, dtype));
}

/**
 * WGSL prelude for a kernel whose weights have type `dtype`: enables f16 when needed and
 * defines the aliases `WT` (scalar weight type) and `WT4` (vec4 of it). Kernels convert weight
 * values to f32 before arithmetic.
 */
export function weightPrelude(dtype: DType): string {
  return dtype === "f16"
    ? "enable f16;\nalias WT = f16;\nalias WT4 = vec4<f16>;\n"
    : "alias WT = f32;\nalias WT4 = vec4<f32>;\n";
}
