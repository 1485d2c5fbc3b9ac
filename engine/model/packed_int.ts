/**
 * GPTQ, AWQ and compressed-tensors `pack-quantized` weights as pre-quantized checkpoints store them
 * (engine/model/checkpoint_quantization.ts). A linear layer's weight `W [out, in]` (`rows = out`,
 * `cols = in`) is stored as int32 tensors of `bits`-bit unsigned codes, `P = 32 / bits` per word,
 * value `j` of a word in bits `bits * j .. bits * j + bits - 1`, beside scales, with
 *
 *     W[o][i] = (code(i, o) - zero(g(i), o)) * scale(g(i), o)
 *
 * where `g(i)` is input `i`'s group: the stored group index (`g_idx`) when there is one, else
 * `floor(i / group_size)` (0 with one group per row). The layouts (each part named by its role:
 * codes, zeros, scales, groups, shape):
 *
 * | role | GPTQ | AWQ (GEMM) | `pack-quantized` |
 * | --- | --- | --- | --- |
 * | codes | `qweight [in / P, out]`: input `P r + j`, output `o` is value `j` of word `[r][o]` | `qweight [in, out / P]`: output `P c + k` is value `AWQ_POSITION[k]` of word `[i][c]` | `weight_packed [out, in / P]`: input `P c + j` is value `j` of word `[o][c]` |
 * | zeros | `qzeros [groups, out / P]`, value `j` of word `[g][c]` is output `P c + j`; plus 1 in the `gptq` format (it stores `zero - 1`) | `qzeros [groups, out / P]` in AWQ's order | `weight_zero_point [out / P, groups]`, value `j` of word `[r][g]` is output `P r + j`; none when symmetric: the zero is `2^(bits - 1)` |
 * | scales | `scales [groups, out]` | `scales [groups, out]` | `weight_scale [out, groups]` |
 * | groups | `g_idx [in]`, optional | none | `weight_g_idx [in]`, with `actorder: "group"` |
 * | shape | none | none | `weight_shape [2]`: `[out, in]` |
 *
 * AWQ packs the 8 outputs of a word interleaved: output `8 c + k` is value
 * {@linkcode AWQ_POSITION}`[k]` = `[0, 4, 1, 5, 2, 6, 3, 7][k]` (AutoAWQ's pack order `[0, 2, 4,
 * 6, 1, 3, 5, 7]` inverted). compressed-tensors stores a code `q` (signed) as `q + 2^(bits - 1)`.
 *
 * The values are computed in f32, exactly for f16 and bf16 scales (`|code - zero| <= 255` times
 * at most 11 significant bits; an F32 scale's product is rounded once, as an f32 multiply is).
 * They are either dequantized rows ({@linkcode dequantizePackedChunks}) or, where this engine's
 * int8 / int4 format (gpu/quant.ts) holds the codes as they are, the format's words and scales
 * ({@linkcode exactQuantizedRows}): groups of 32 inputs within one source group, scales exact in
 * f16, `code - zero` within the format's range.
 *
 * @module
 */

import type { DType } from "../../gpu/dtype.ts";
import { GROUP, quantBits, type QuantFormat, wordsPerGroup } from "../../gpu/quant.ts";
import type { PackedIntLayout, PackedIntQuantization } from "./checkpoint_quantization.ts";
import type { TensorChunk } from "./safetensors.ts";

/** Where AWQ keeps output `k` of 8 in a word (see the module doc). */
export const AWQ_POSITION: readonly number[] = [0, 4, 1, 5, 2, 6, 3, 7];

/** The roles of a packed weight's tensors (module doc). */
export const PACKED_PARTS = ["codes", "zeros", "scales", "groups", "shape"] as const;

/** A role of a packed weight's tensor. */
export type PackedPart = (typeof PACKED_PARTS)[number];

/** The suffix that replaces a packed weight's final `weight` in each role's tensor name. */
export function packedPartSuffixes(
  layout: PackedIntLayout,
): Readonly<Partial<Record<PackedPart, string>>> {
  return layout === "pack-quantized"
    ? {
      codes: "weight_packed",
      zeros: "weight_zero_point",
      scales: "weight_scale",
      groups: "weight_g_idx",
      shape: "weight_shape",
    }
    : layout === "gptq"
    ? { codes: "qweight", zeros: "qzeros", scales: "scales", groups: "g_idx" }
    : { codes: "qweight", zeros: "qzeros", scales: "scales" };
}

/** The `[out, in]` shape of the weight whose codes tensor has `shape`, or null if not 2-D. */
export function packedWeightShape(
  q: PackedIntQuantization,
  codes: readonly number[],
): [number, number] | null {
  if (codes.length !== 2) return null;
  const per = 32 / q.bits;
  const [a, b] = codes as [number, number];
  return q.layout === "gptq" ? [b, a * per] : q.layout === "awq" ? [b * per, a] : [a, b * per];
}

/** Groups of inputs of a `cols`-input weight under `q`. */
export function packedGroups(q: PackedIntQuantization, cols: number): number {
  return q.groupSize === null ? 1 : Math.ceil(cols / q.groupSize);
}

/** The shape each part of a packed `[rows, cols]` weight must have (module doc). */
export function packedPartShapes(
  q: PackedIntQuantization,
  rows: number,
  cols: number,
): Record<PackedPart, number[]> {
  const per = 32 / q.bits;
  const groups = packedGroups(q, cols);
  const ct = q.layout === "pack-quantized";
  return {
    codes: q.layout === "gptq"
      ? [cols / per, rows]
      : q.layout === "awq"
      ? [cols, rows / per]
      : [rows, cols / per],
    zeros: ct ? [rows / per, groups] : [groups, rows / per],
    scales: ct ? [rows, groups] : [groups, rows],
    groups: [cols],
    shape: [2],
  };
}

/**
 * A packed weight read whole: its words and its scales in f32 (the codes are a quarter or half
 * of the weight's f16 bytes).
 */
export interface PackedWeight {
  readonly quantization: PackedIntQuantization;
  /** Output features (the weight's rows). */
  readonly rows: number;
  /** Input features (the weight's columns). */
  readonly cols: number;
  /** The codes tensor's words. */
  readonly qweight: Uint32Array;
  /** The zeros tensor's words; null for a symmetric `pack-quantized` weight. */
  readonly qzeros: Uint32Array | null;
  /** `[groups, rows]`, row-major (a `pack-quantized` weight's `[rows, groups]` transposed). */
  readonly scales: Float32Array;
  /** The group of each input: `g_idx`, or `floor(i / group_size)`. */
  readonly groupOf: Int32Array;
}

/** The group of each of `cols` inputs when a checkpoint has no `g_idx`. */
export function sequentialGroups(q: PackedIntQuantization, cols: number): Int32Array {
  const out = new Int32Array(cols);
  const size = q.groupSize;
  if (size === null) return out;
  for (let i = 0; i < cols; i++) out[i] = Math.floor(i / size);
  return out;
}

/**
 * The unsigned codes of output row `o`, all inputs, into `codes` (`cols` values), and the
 * zero points of its groups into `zeros` (`groups` values, the format's offset added).
 */
function rowCodes(w: PackedWeight, o: number, codes: Int32Array, zeros: Int32Array): void {
  const { rows, cols, qweight, qzeros, quantization: q } = w;
  const bits = q.bits;
  const per = 32 / bits;
  const mask = (1 << bits) - 1;
  const wordsPerRow = rows / per;
  // Where output o sits in a word packed along the outputs (zeros; AWQ's codes).
  const column = Math.floor(o / per);
  const shift = bits * (q.layout === "awq" ? AWQ_POSITION[o % per]! : o % per);
  const groups = zeros.length;
  for (let g = 0; g < groups; g++) {
    zeros[g] = qzeros === null
      ? 1 << (bits - 1)
      : q.layout === "pack-quantized"
      ? (qzeros[column * groups + g]! >>> shift) & mask
      : ((qzeros[g * wordsPerRow + column]! >>> shift) & mask) + q.zeroOffset;
  }
  if (q.layout === "gptq") {
    for (let i = 0; i < cols; i++) {
      codes[i] = (qweight[Math.floor(i / per) * rows + o]! >>> (bits * (i % per))) & mask;
    }
  } else if (q.layout === "awq") {
    for (let i = 0; i < cols; i++) codes[i] = (qweight[i * wordsPerRow + column]! >>> shift) & mask;
  } else {
    const base = o * (cols / per);
    for (let i = 0; i < cols; i++) {
      codes[i] = (qweight[base + Math.floor(i / per)]! >>> (bits * (i % per))) & mask;
    }
  }
}

/**
 * Rows `rowStart .. rowStart + out.length / cols` of the weight's values, into `out` (row-major,
 * f32, exact).
 */
export function dequantizePackedRows(w: PackedWeight, rowStart: number, out: Float32Array): void {
  const { rows, cols, scales, groupOf } = w;
  const codes = new Int32Array(cols);
  const zeros = new Int32Array(scales.length / rows);
  const count = out.length / cols;
  for (let r = 0; r < count; r++) {
    const o = rowStart + r;
    rowCodes(w, o, codes, zeros);
    const base = r * cols;
    for (let i = 0; i < cols; i++) {
      const g = groupOf[i]!;
      out[base + i] = (codes[i]! - zeros[g]!) * scales[g * rows + o]!;
    }
  }
}

/**
 * The weight's rows as chunks of at most `chunkBytes` (at least one row), dequantized in f32
 * and yielded in `targetDtype` (the array reused from chunk to chunk, as
 * `SafetensorsFile.readTensorChunks` does).
 */
export function* dequantizePackedChunks(
  w: PackedWeight,
  targetDtype: DType,
  chunkBytes: number,
): Generator<TensorChunk, void, undefined> {
  const { rows, cols } = w;
  const perChunk = Math.max(1, Math.min(rows, Math.floor(chunkBytes / (cols * 4))));
  const values = new Float32Array(perChunk * cols);
  const half = targetDtype === "f16" ? new Float16Array(perChunk * cols) : undefined;
  for (let rowStart = 0; rowStart < rows; rowStart += perChunk) {
    const n = Math.min(perChunk, rows - rowStart);
    const f32 = values.subarray(0, n * cols);
    dequantizePackedRows(w, rowStart, f32);
    let data: Float32Array | Float16Array = f32;
    if (half !== undefined) {
      data = half.subarray(0, n * cols);
      data.set(f32);
    }
    yield { rowStart, rows: n, cols, data };
  }
}

/**
 * The codes each format's words hold: `code - zero` must lie within them to be kept as it is
 * (int8's -128, which the format's own quantizer never writes, decodes like any other code:
 * gpu/quant.ts).
 */
const RANGE: Record<QuantFormat, readonly [number, number]> = {
  int4: [-8, 7],
  int8: [-128, 127],
};

/**
 * The whole weight in this engine's `format` (gpu/quant.ts: words of `code - zero`, one f16
 * scale per 32 inputs), bit for bit the checkpoint's values; or, when the format cannot hold
 * them as they are, a string saying why (a group of 32 inputs spanning two of the checkpoint's
 * groups, a scale that is not an f16, a `code - zero` outside the format's range).
 */
export function exactQuantizedRows(
  w: PackedWeight,
  format: QuantFormat,
): { words: Uint32Array; scales: Float16Array } | string {
  const { rows, cols, scales, groupOf } = w;
  if (cols % GROUP !== 0) return `${cols} inputs are not a multiple of ${GROUP}`;
  const groups32 = cols / GROUP;
  for (let k = 0; k < groups32; k++) {
    const g = groupOf[k * GROUP]!;
    for (let i = k * GROUP + 1; i < (k + 1) * GROUP; i++) {
      if (groupOf[i] !== g) {
        return `inputs ${k * GROUP}..${
          k * GROUP + GROUP - 1
        } span the checkpoint's groups ${g} and ${groupOf[i]}`;
      }
    }
  }
  for (const s of scales) {
    if (Math.f16round(s) !== s) return `scale ${s} is not exactly an f16`;
  }
  const bits = quantBits(format);
  const per = 32 / bits;
  const mask = (1 << bits) - 1;
  const [lo, hi] = RANGE[format];
  const unit = wordsPerGroup(format);
  const words = new Uint32Array(rows * groups32 * unit);
  const out = new Float16Array(rows * groups32);
  const codes = new Int32Array(cols);
  const zeros = new Int32Array(scales.length / rows);
  for (let o = 0; o < rows; o++) {
    rowCodes(w, o, codes, zeros);
    for (let k = 0; k < groups32; k++) {
      const g = groupOf[k * GROUP]!;
      out[o * groups32 + k] = scales[g * rows + o]!;
      const z = zeros[g]!;
      for (let i = 0; i < GROUP; i++) {
        const v = codes[k * GROUP + i]! - z;
        if (v < lo || v > hi) {
          return `code - zero ${v} at row ${o}, input ${
            k * GROUP + i
          } is outside ${format}'s ${lo}..${hi}`;
        }
        const at = (o * groups32 + k) * unit + Math.floor(i / per);
        words[at] = (words[at]! | ((v & mask) << (bits * (i % per)))) >>> 0;
      }
    }
  }
  return { words, scales: out };
}
