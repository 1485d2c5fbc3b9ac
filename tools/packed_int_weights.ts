/**
 * Writes weights as GPTQ, AWQ and compressed-tensors `pack-quantized` checkpoints store them (the
 * layouts of engine/model/packed_int.ts), for test and benchmark checkpoints
 * (tools/make_model.ts `--gptq`, `--awq`, `--pack-quantized`). The codes are round-to-nearest per
 * group, as the quantizers' own `Quantizer` / `pseudo_quantize_tensor` / `calculate_qparams`
 * compute them (the GPTQ and AWQ algorithms only choose better values to round; the stored format
 * is the same). With `2^bits` codes:
 *
 * - symmetric (GPTQ `sym`, compressed-tensors `symmetric`): `m = max|w|` over the group, `scale =
 *   2 m / (2^bits - 1)`, zero `2^(bits - 1)`;
 * - with zero points (GPTQ `sym: false`, AWQ, compressed-tensors asymmetric): `scale = (max(w, 0)
 *   - min(w, 0)) / (2^bits - 1)`, zero `round(-min(w, 0) / scale)`;
 *
 * the scale rounded to an f16 (GPTQ, AWQ) or a bf16 (compressed-tensors, whose scales are in the
 * model's dtype), 1 for an all-zero group, and `code = clamp(round(w / scale) + zero, 0, 2^bits -
 * 1)`, stored unsigned (compressed-tensors' signed `q = code - 2^(bits - 1)` plus its offset is the
 * same number). Act-order (GPTQ `desc_act`, compressed-tensors `actorder: "group"`) is imitated
 * by a seeded permutation of the inputs: group `g` holds the inputs at positions `g * group_size
 * ..` of that order, and the group index tensor says so.
 *
 * @module
 */

import { encodeTensorData } from "../engine/model/safetensors.ts";
import { roundToBf16 } from "./fp8_weights.ts";

/** How make-model writes a packed-integer checkpoint. */
export interface PackedIntLayout {
  readonly method: "gptq" | "awq" | "compressed-tensors";
  readonly bits: 4 | 8;
  /** Inputs per group; -1: one group per row. */
  readonly groupSize: number;
  /** GPTQ, compressed-tensors: symmetric codes (default), or zero points per group. */
  readonly symmetric?: boolean;
  /** GPTQ, compressed-tensors: permuted groups with a group index (`desc_act: true`). */
  readonly actOrder?: boolean;
  /** GPTQ only: `gptq_v2` zero points (as they are) instead of `gptq`'s `zero - 1`. */
  readonly v2?: boolean;
}

/** `config.json`'s `quantization_config` for `layout`, as transformers writes it. */
export function packedIntQuantizationConfig(layout: PackedIntLayout): Record<string, unknown> {
  if (layout.method === "compressed-tensors") {
    // As llm-compressor writes a W4A16 / W8A16 scheme (RedHatAI's `-quantized.w4a16` models).
    return {
      quant_method: "compressed-tensors",
      format: "pack-quantized",
      quantization_status: "compressed",
      config_groups: {
        group_0: {
          targets: ["Linear"],
          weights: {
            num_bits: layout.bits,
            type: "int",
            symmetric: layout.symmetric ?? true,
            strategy: layout.groupSize === -1 ? "channel" : "group",
            group_size: layout.groupSize === -1 ? null : layout.groupSize,
            actorder: layout.actOrder ? "group" : null,
            dynamic: false,
            observer: "minmax",
            block_structure: null,
          },
          input_activations: null,
          output_activations: null,
          format: "pack-quantized",
        },
      },
      ignore: ["lm_head"],
      kv_cache_scheme: null,
      sparsity_config: {},
      global_compression_ratio: null,
    };
  }
  if (layout.method === "awq") {
    return {
      quant_method: "awq",
      bits: layout.bits,
      group_size: layout.groupSize,
      zero_point: true,
      version: "gemm",
      modules_to_not_convert: null,
    };
  }
  return {
    quant_method: "gptq",
    bits: layout.bits,
    group_size: layout.groupSize,
    desc_act: layout.actOrder ?? false,
    sym: layout.symmetric ?? true,
    checkpoint_format: layout.v2 ? "gptq_v2" : "gptq",
    damp_percent: 0.01,
    true_sequential: true,
    use_exllama: true,
  };
}

/** A stored tensor: its dtype, shape and data. */
export interface PackedPartData {
  readonly dtype: "I32" | "I64" | "F16" | "BF16";
  readonly shape: number[];
  readonly data: Uint8Array;
}

/** The stored tensors of one packed weight, by name suffix (`qweight`, `weight_packed`, ...). */
export type PackedIntTensors = Record<string, PackedPartData>;

function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/**
 * The tensors {@linkcode quantizePackedInt} writes for a `[rows, cols]` weight, in order: name
 * suffix, dtype and shape (known before the values are).
 */
export function packedPartSpecs(
  layout: PackedIntLayout,
  rows: number,
  cols: number,
): { suffix: string; dtype: PackedPartData["dtype"]; shape: number[] }[] {
  const per = 32 / layout.bits;
  const groups = layout.groupSize === -1 ? 1 : Math.ceil(cols / layout.groupSize);
  if (layout.method === "compressed-tensors") {
    return [
      { suffix: "weight_packed", dtype: "I32", shape: [rows, cols / per] },
      { suffix: "weight_scale", dtype: "BF16", shape: [rows, groups] },
      { suffix: "weight_shape", dtype: "I64", shape: [2] },
      ...(layout.symmetric ?? true
        ? []
        : [{ suffix: "weight_zero_point", dtype: "I32" as const, shape: [rows / per, groups] }]),
      ...(layout.actOrder
        ? [{ suffix: "weight_g_idx", dtype: "I32" as const, shape: [cols] }]
        : []),
    ];
  }
  return [
    {
      suffix: "qweight",
      dtype: "I32",
      shape: layout.method === "gptq" ? [cols / per, rows] : [cols, rows / per],
    },
    { suffix: "qzeros", dtype: "I32", shape: [groups, rows / per] },
    { suffix: "scales", dtype: "F16", shape: [groups, rows] },
    ...(layout.method === "gptq"
      ? [{ suffix: "g_idx", dtype: "I32" as const, shape: [cols] }]
      : []),
  ];
}

/** A seeded xorshift permutation of `0 .. n - 1`. */
function permutation(n: number, seed: number): Int32Array {
  const order = Int32Array.from({ length: n }, (_, i) => i);
  let s = (seed ^ 0x9e3779b9) >>> 0 || 1;
  for (let i = n - 1; i > 0; i--) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    const j = (s >>> 0) % (i + 1);
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  return order;
}

/**
 * Quantizes row-major `[rows, cols]` values (`rows` a multiple of `32 / bits`) in `layout`,
 * `seed` choosing the act-order permutation.
 */
export function quantizePackedInt(
  values: Float32Array,
  rows: number,
  cols: number,
  layout: PackedIntLayout,
  seed = 0,
): PackedIntTensors {
  const { method, bits } = layout;
  const per = 32 / bits;
  const maxq = (1 << bits) - 1;
  const size = layout.groupSize === -1 ? cols : layout.groupSize;
  const groups = Math.ceil(cols / size);
  const ct = method === "compressed-tensors";
  const symmetric = method !== "awq" && (layout.symmetric ?? true);
  const order = method !== "awq" && layout.actOrder
    ? permutation(cols, seed)
    : Int32Array.from({ length: cols }, (_, i) => i);
  const gIdx = new Int32Array(cols);
  order.forEach((input, k) => gIdx[input] = Math.floor(k / size));

  const scales = ct ? new Float32Array(groups * rows) : new Float16Array(groups * rows);
  const zeros = new Int32Array(groups * rows);
  const codes = new Int32Array(rows * cols);
  for (let o = 0; o < rows; o++) {
    for (let g = 0; g < groups; g++) {
      const members = order.subarray(g * size, Math.min(cols, (g + 1) * size));
      let lo = 0;
      let hi = 0;
      for (const i of members) {
        lo = Math.min(lo, values[o * cols + i]!);
        hi = Math.max(hi, values[o * cols + i]!);
      }
      if (symmetric) hi = Math.max(hi, -lo), lo = -hi;
      let scale = ct ? roundToBf16((hi - lo) / maxq) : Math.f16round((hi - lo) / maxq);
      if (scale === 0) scale = 1;
      const zero = symmetric ? (maxq + 1) / 2 : Math.min(maxq, Math.round(-lo / scale));
      scales[g * rows + o] = scale;
      zeros[g * rows + o] = zero;
      for (const i of members) {
        codes[o * cols + i] = Math.min(
          maxq,
          Math.max(0, Math.round(values[o * cols + i]! / scale) + zero),
        );
      }
    }
  }

  if (ct) return packCompressedTensors(codes, zeros, scales, gIdx, rows, cols, groups, layout);
  // Zero points, packed along the outputs (AWQ's interleaved order for AWQ).
  const position = (o: number) => method === "awq" ? [0, 4, 1, 5, 2, 6, 3, 7][o % per]! : o % per;
  const offset = method === "gptq" && !layout.v2 ? 1 : 0;
  const qzeros = new Uint32Array(groups * (rows / per));
  for (let g = 0; g < groups; g++) {
    for (let o = 0; o < rows; o++) {
      const at = g * (rows / per) + Math.floor(o / per);
      const z = (zeros[g * rows + o]! - offset) & maxq;
      qzeros[at] = (qzeros[at]! | (z << (bits * position(o)))) >>> 0;
    }
  }
  const parts: PackedIntTensors = {
    qzeros: { dtype: "I32", shape: [groups, rows / per], data: bytesOf(qzeros) },
    scales: { dtype: "F16", shape: [groups, rows], data: bytesOf(scales) },
  };
  if (method === "gptq") {
    const qweight = new Uint32Array((cols / per) * rows);
    for (let i = 0; i < cols; i++) {
      for (let o = 0; o < rows; o++) {
        const at = Math.floor(i / per) * rows + o;
        qweight[at] = (qweight[at]! | (codes[o * cols + i]! << (bits * (i % per)))) >>> 0;
      }
    }
    return {
      qweight: { dtype: "I32", shape: [cols / per, rows], data: bytesOf(qweight) },
      ...parts,
      g_idx: { dtype: "I32", shape: [cols], data: bytesOf(gIdx) },
    };
  }
  const qweight = new Uint32Array(cols * (rows / per));
  for (let i = 0; i < cols; i++) {
    for (let o = 0; o < rows; o++) {
      const at = i * (rows / per) + Math.floor(o / per);
      qweight[at] = (qweight[at]! | (codes[o * cols + i]! << (bits * position(o)))) >>> 0;
    }
  }
  return { qweight: { dtype: "I32", shape: [cols, rows / per], data: bytesOf(qweight) }, ...parts };
}

/**
 * compressed-tensors' tensors of a weight's unsigned codes, zeros and scales (`[groups, rows]`
 * here, stored `[rows, groups]` in BF16): `weight_packed` along the inputs, `weight_zero_point`
 * (with zero points) along the outputs, `weight_g_idx` with act-order, `weight_shape` (I64, as
 * `torch.tensor(weight.shape)` is).
 */
function packCompressedTensors(
  codes: Int32Array,
  zeros: Int32Array,
  scales: Float16Array | Float32Array,
  gIdx: Int32Array,
  rows: number,
  cols: number,
  groups: number,
  layout: PackedIntLayout,
): PackedIntTensors {
  const bits = layout.bits;
  const per = 32 / bits;
  const packed = new Uint32Array(rows * (cols / per));
  for (let o = 0; o < rows; o++) {
    for (let i = 0; i < cols; i++) {
      const at = o * (cols / per) + Math.floor(i / per);
      packed[at] = (packed[at]! | (codes[o * cols + i]! << (bits * (i % per)))) >>> 0;
    }
  }
  // [groups, rows] -> [rows, groups]; the values are bfloat16s already, so BF16 is exact.
  const stored = new Float32Array(rows * groups);
  for (let o = 0; o < rows; o++) {
    for (let g = 0; g < groups; g++) stored[o * groups + g] = scales[g * rows + o]!;
  }
  const out: PackedIntTensors = {
    weight_packed: { dtype: "I32", shape: [rows, cols / per], data: bytesOf(packed) },
    weight_scale: { dtype: "BF16", shape: [rows, groups], data: encodeTensorData(stored, "BF16") },
    weight_shape: {
      dtype: "I64",
      shape: [2],
      data: bytesOf(BigInt64Array.of(BigInt(rows), BigInt(cols))),
    },
  };
  if (!(layout.symmetric ?? true)) {
    const zp = new Uint32Array((rows / per) * groups);
    for (let o = 0; o < rows; o++) {
      for (let g = 0; g < groups; g++) {
        const at = Math.floor(o / per) * groups + g;
        zp[at] = (zp[at]! | (zeros[g * rows + o]! << (bits * (o % per)))) >>> 0;
      }
    }
    out.weight_zero_point = { dtype: "I32", shape: [rows / per, groups], data: bytesOf(zp) };
  }
  if (layout.actOrder) out.weight_g_idx = { dtype: "I32", shape: [cols], data: bytesOf(gIdx) };
  return out;
}
