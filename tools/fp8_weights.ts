/**
 * Writes weights the way Hugging Face's fine-grained FP8 quantizer does (transformers'
 * `Fp8Quantize`, the format of Qwen's `-FP8` checkpoints): per block of `block x block` elements
 * of a `[rows, cols]` weight (edge blocks smaller), `scale = max|w| / 448` rounded to a
 * bfloat16 (Qwen's checkpoints store `weight_scale_inv` in BF16; 1 for an all-zero block),
 * `q = float8_e4m3fn(w / scale)` rounded to nearest even and saturated at +-448, and
 * `weight_scale_inv = scale`, so that `w ~ q * weight_scale_inv`. For test and
 * benchmark checkpoints (tools/make_model.ts `--fp8`); the engine's reading side is
 * engine/model/fp8.ts.
 *
 * @module
 */

import { E4M3_VALUES } from "../engine/model/fp8.ts";

/** The largest finite `float8_e4m3fn` value. */
const E4M3_MAX = 448;
/** Code of +448 (S.1111.110); codes 0 .. 0x7e are the non-negative values in increasing order. */
const MAX_CODE = 0x7e;

/** The `float8_e4m3fn` byte nearest to `x` (ties to the even code), saturated at +-448. */
export function encodeE4m3(x: number): number {
  if (Number.isNaN(x)) return 0x7f;
  const sign = x < 0 || Object.is(x, -0) ? 0x80 : 0;
  const a = Math.abs(x);
  if (a >= E4M3_MAX) return sign | MAX_CODE;
  // The largest code whose value is <= a (values increase with the code).
  let lo = 0;
  let hi = MAX_CODE;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (E4M3_VALUES[mid]! <= a) lo = mid;
    else hi = mid - 1;
  }
  if (lo === MAX_CODE) return sign | lo;
  const below = a - E4M3_VALUES[lo]!;
  const above = E4M3_VALUES[lo + 1]! - a;
  const code = below < above ? lo : above < below ? lo + 1 : (lo % 2 === 0 ? lo : lo + 1);
  return sign | code;
}

/** The bfloat16 nearest to `x` (ties to even; `x` finite and positive here), as an f32. */
export function roundToBf16(x: number): number {
  const f = new Float32Array([x]);
  const bits = new Uint32Array(f.buffer);
  bits[0] = ((bits[0]! + 0x7fff + ((bits[0]! >>> 16) & 1)) >>> 16) << 16;
  return f[0]!;
}

/**
 * An FP8 weight: its codes `[rows, cols]` and its scales `[ceil(rows / b), ceil(cols / b)]`
 * (bfloat16 values).
 */
export interface Fp8Weight {
  readonly codes: Uint8Array;
  readonly scales: Float32Array;
  readonly scaleShape: readonly [number, number];
}

/** Quantizes the row-major `[rows, cols]` f32 `values` to FP8 in `blockRows x blockCols` tiles. */
export function quantizeFp8Blocks(
  values: Float32Array,
  rows: number,
  cols: number,
  blockRows: number,
  blockCols: number,
): Fp8Weight {
  const sr = Math.ceil(rows / blockRows);
  const sc = Math.ceil(cols / blockCols);
  const scales = new Float32Array(sr * sc);
  const codes = new Uint8Array(rows * cols);
  for (let br = 0; br < sr; br++) {
    for (let bc = 0; bc < sc; bc++) {
      const r1 = Math.min(rows, (br + 1) * blockRows);
      const c1 = Math.min(cols, (bc + 1) * blockCols);
      let amax = 0;
      for (let r = br * blockRows; r < r1; r++) {
        for (let c = bc * blockCols; c < c1; c++) {
          amax = Math.max(amax, Math.abs(values[r * cols + c]!));
        }
      }
      const scale = amax > 0 ? roundToBf16(amax / E4M3_MAX) : 1;
      scales[br * sc + bc] = scale;
      for (let r = br * blockRows; r < r1; r++) {
        for (let c = bc * blockCols; c < c1; c++) {
          codes[r * cols + c] = encodeE4m3(Math.fround(values[r * cols + c]! / scale));
        }
      }
    }
  }
  return { codes, scales, scaleShape: [sr, sc] };
}

/**
 * How a test checkpoint's FP8 weights are laid out: transformers' fine-grained FP8 (`block`:
 * `quant_method: "fp8"`, a BF16 `weight_scale_inv` per `block x block`), or compressed-tensors'
 * `float-quantized` format as llm-compressor's `FP8_DYNAMIC` scheme writes it (`channel`: a BF16
 * `weight_scale` of `[rows, 1]`; `tensor`: of `[1]`).
 */
export type Fp8CheckpointLayout =
  | { readonly scheme: "block"; readonly block: number }
  | { readonly scheme: "channel" }
  | { readonly scheme: "tensor" };

/** The schemes of {@linkcode Fp8CheckpointLayout}. */
export const FP8_SCHEMES = ["block", "channel", "tensor"] as const;

/** config.json's `quantization_config` for `layout`. */
export function fp8QuantizationConfig(layout: Fp8CheckpointLayout): Record<string, unknown> {
  if (layout.scheme === "block") {
    return {
      quant_method: "fp8",
      fmt: "e4m3",
      activation_scheme: "dynamic",
      weight_block_size: [layout.block, layout.block],
    };
  }
  return {
    quant_method: "compressed-tensors",
    format: "float-quantized",
    quantization_status: "compressed",
    config_groups: {
      group_0: {
        targets: ["Linear"],
        weights: {
          num_bits: 8,
          type: "float",
          symmetric: true,
          strategy: layout.scheme,
          dynamic: false,
          group_size: null,
          block_structure: null,
          actorder: null,
          observer: "minmax",
        },
        input_activations: {
          num_bits: 8,
          type: "float",
          symmetric: true,
          strategy: "token",
          dynamic: true,
          observer: null,
        },
        output_activations: null,
      },
    },
    ignore: ["lm_head"],
    kv_cache_scheme: null,
    sparsity_config: {},
  };
}

/** Weight rows and columns per scale under `layout`. */
function layoutBlock(layout: Fp8CheckpointLayout, rows: number, cols: number): [number, number] {
  return layout.scheme === "block"
    ? [layout.block, layout.block]
    : layout.scheme === "channel"
    ? [1, cols]
    : [rows, cols];
}

/** The name and shape of the scale tensor of FP8 weight `name` (`[rows, cols]`) under `layout`. */
export function fp8ScaleTensor(
  name: string,
  rows: number,
  cols: number,
  layout: Fp8CheckpointLayout,
): { name: string; shape: number[] } {
  const [bm, bn] = layoutBlock(layout, rows, cols);
  return {
    name: name.replace(/weight$/, layout.scheme === "block" ? "weight_scale_inv" : "weight_scale"),
    shape: layout.scheme === "tensor" ? [1] : [Math.ceil(rows / bm), Math.ceil(cols / bn)],
  };
}

/** The f32 `[rows, cols]` weight `values` quantized under `layout` (see the module doc). */
export function quantizeFp8(
  values: Float32Array,
  rows: number,
  cols: number,
  layout: Fp8CheckpointLayout,
): Fp8Weight {
  const [bm, bn] = layoutBlock(layout, rows, cols);
  return quantizeFp8Blocks(values, rows, cols, bm, bn);
}
