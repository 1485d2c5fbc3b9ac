/**
 * FP8 weights as pre-quantized checkpoints store them (engine/model/checkpoint_quantization.ts):
 * each 2-D weight `W [rows, cols]` is `float8_e4m3fn` values `q` (one byte each) and a scale
 * tensor `S` with one scale per `bm x bn` block (`[ceil(rows / bm), ceil(cols / bn)]`: blocks of
 * usually 128 x 128 in transformers' fine-grained FP8, Qwen's `-FP8` releases; one row per output
 * channel or one scale per tensor in compressed-tensors), with
 * `W[r][c] = q[r][c] * S[floor(r / bm)][floor(c / bn)]` (transformers' `Fp8Dequantize`: both
 * factors in f32). This engine has no FP8 arithmetic (WebGPU has no FP8 type), so such weights
 * are dequantized while loading, chunk by chunk, into the device dtype (or, with
 * `--quantization int8|int4`, quantized again from those values).
 *
 * `float8_e4m3fn`: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
 * subnormal (`m / 8 * 2^-6`); no infinities; `S.1111.111` is NaN; the largest value is 448.
 *
 * @module
 */

import type { DType } from "../../gpu/dtype.ts";
import type { TensorChunk } from "./safetensors.ts";

/** The value of every `float8_e4m3fn` byte, by its bits (exact in f32). */
export const E4M3_VALUES: Float32Array = (() => {
  const t = new Float32Array(256);
  for (let bits = 0; bits < 256; bits++) {
    const sign = bits & 0x80 ? -1 : 1;
    const exp = (bits >> 3) & 0xf;
    const man = bits & 0x7;
    t[bits] = exp === 0xf && man === 0x7
      ? NaN
      : exp === 0
      ? sign * man * 2 ** -9
      : sign * (8 + man) * 2 ** (exp - 10);
  }
  return t;
})();

/** A weight's FP8 scales, one per `blockRows x blockCols` tile, row-major, as f32. */
export interface Fp8BlockScales {
  /** Rows of the weight per scale row (the block's height; the weight's rows per tensor scale). */
  readonly blockRows: number;
  /** Columns of the weight per scale column (the block's width; all columns per channel scale). */
  readonly blockCols: number;
  /** Scale columns: `ceil(cols / blockCols)`. */
  readonly scaleCols: number;
  /** The scales, `[ceil(rows / blockRows), scaleCols]` row-major. */
  readonly values: Float32Array;
}

/**
 * The shapes a scale tensor of a `[rows, cols]` weight may have, one scale per
 * `blockRows x blockCols` (the first is the canonical `[ceil(rows / blockRows),
 * ceil(cols / blockCols)]`; compressed-tensors writes a per-tensor scale as `[1]` (or a scalar)
 * and a per-channel one as `[rows, 1]`).
 */
export function fp8ScaleShapes(
  rows: number,
  cols: number,
  blockRows: number,
  blockCols: number,
): number[][] {
  const canonical = [Math.ceil(rows / blockRows), Math.ceil(cols / blockCols)];
  if (canonical[0] === 1 && canonical[1] === 1) return [canonical, [1], []];
  return [canonical];
}

/**
 * Dequantizes, in place, `data`: rows `rowStart .. rowStart + data.length / cols` of a weight
 * already decoded from its bytes (values of {@linkcode E4M3_VALUES}), multiplying each element
 * by its block's scale in f32.
 */
export function applyFp8Scales(
  data: Float32Array,
  rowStart: number,
  cols: number,
  scales: Fp8BlockScales,
): void {
  const rows = data.length / cols;
  const { blockRows, blockCols, scaleCols, values } = scales;
  for (let r = 0; r < rows; r++) {
    const srow = Math.floor((rowStart + r) / blockRows) * scaleCols;
    const base = r * cols;
    for (let c0 = 0, b = 0; c0 < cols; c0 += blockCols, b++) {
      const s = values[srow + b]!;
      const end = Math.min(cols, c0 + blockCols);
      for (let c = c0; c < end; c++) data[base + c] = data[base + c]! * s; // f32 product
    }
  }
}

/**
 * An FP8 weight's row chunks `chunks` (its bytes' values, as f32: `SafetensorsFile`
 * `readTensorChunks` with target f32) dequantized with `scales` in f32, then yielded in
 * `targetDtype` (f16 through one reused array, as chunks are).
 */
export async function* dequantizeFp8Chunks(
  chunks: AsyncIterable<TensorChunk>,
  scales: Fp8BlockScales,
  targetDtype: DType,
): AsyncGenerator<TensorChunk, void, undefined> {
  let half: Float16Array | undefined;
  for await (const chunk of chunks) {
    if (!(chunk.data instanceof Float32Array)) {
      throw new TypeError("FP8 chunks must be read as f32");
    }
    applyFp8Scales(chunk.data, chunk.rowStart, chunk.cols, scales);
    if (targetDtype === "f32") {
      yield chunk;
      continue;
    }
    half ??= new Float16Array(chunk.data.length);
    const data = half.subarray(0, chunk.data.length);
    data.set(chunk.data);
    yield { ...chunk, data };
  }
}
