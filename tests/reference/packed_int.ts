/**
 * A float64 reference of GPTQ, AWQ and compressed-tensors `pack-quantized` weights, written from
 * the formats' definitions (AutoGPTQ's and AutoAWQ's packing, compressed-tensors'
 * `unpack_from_int32`) and reading the checkpoint's files itself: the safetensors headers, the
 * int32 words and the f16 / bf16 scales. It shares nothing with the engine's path
 * (engine/model/packed_int.ts, engine/model/checkpoint.ts) but the parsed `quantization_config`.
 *
 * @module
 */

import type { PackedIntQuantization } from "../../engine/model/checkpoint_quantization.ts";
import { bf16Value } from "./safetensors.ts";

/** AutoAWQ's pack order: the word's value `k` holds output `8 c + AWQ_PACK_ORDER[k]`. */
const AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7];

/** A stored tensor: dtype, shape and bytes, read from a safetensors file by hand. */
interface RawTensor {
  readonly dtype: string;
  readonly shape: number[];
  readonly bytes: DataView;
}

/** Every tensor of the checkpoint in `dir` whose name starts with `prefix`. */
async function rawTensors(dir: string, prefix: string): Promise<Map<string, RawTensor>> {
  const names = await Array.fromAsync(Deno.readDir(dir));
  const files = names.map((e) => e.name).filter((n) => n.endsWith(".safetensors"));
  const out = new Map<string, RawTensor>();
  for (const f of files) {
    const data = await Deno.readFile(`${dir}/${f}`);
    const view = new DataView(data.buffer);
    const headerLength = Number(view.getBigUint64(0, true));
    const header = JSON.parse(new TextDecoder().decode(data.subarray(8, 8 + headerLength)));
    for (const [name, t] of Object.entries(header)) {
      if (name === "__metadata__" || !name.startsWith(prefix)) continue;
      const { dtype, shape, data_offsets: [begin, end] } = t as {
        dtype: string;
        shape: number[];
        data_offsets: [number, number];
      };
      const at = 8 + headerLength + begin;
      out.set(name, { dtype, shape, bytes: new DataView(data.buffer, at, end - begin) });
    }
  }
  return out;
}

/** Input `i`'s group: the stored group index, else `i / group_size` (0: one group per row). */
function groupOf(gIdx: RawTensor | undefined, q: PackedIntQuantization, i: number): number {
  if (gIdx !== undefined) return gIdx.bytes.getInt32(4 * i, true);
  return q.groupSize === null ? 0 : Math.floor(i / q.groupSize);
}

/** The `bits`-bit unsigned value number `k` of an int32 word (lowest bits first). */
function field(word: number, k: number, bits: number): number {
  return Math.floor(word / 2 ** (bits * k)) % 2 ** bits;
}

/**
 * Weight `weightName` (`X.weight`) of the GPTQ / AWQ checkpoint in `dir`, quantized as `q`,
 * dequantized in float64: `[out, in]` row-major,
 * `W[o][i] = (code - (zero + offset)) * scale` of input `i`'s group.
 */
export async function packedWeightRef(
  dir: string,
  weightName: string,
  q: PackedIntQuantization,
): Promise<{ rows: number; cols: number; data: Float64Array }> {
  const prefix = weightName.slice(0, -"weight".length);
  const parts = await rawTensors(dir, prefix);
  if (q.layout === "pack-quantized") return compressedTensorsRef(parts, prefix, q);
  const get = (suffix: string) => {
    const t = parts.get(prefix + suffix);
    if (t === undefined) throw new RangeError(`packedWeightRef: no ${prefix}${suffix}`);
    return t;
  };
  const qweight = get("qweight");
  const qzeros = get("qzeros");
  const scales = get("scales");
  const gIdx = parts.get(`${prefix}g_idx`);
  if (scales.dtype !== "F16") throw new RangeError("packedWeightRef reads F16 scales");
  const per = 32 / q.bits;
  const gptq = q.method === "gptq";
  const cols = gptq ? qweight.shape[0]! * per : qweight.shape[0]!;
  const rows = gptq ? qweight.shape[1]! : qweight.shape[1]! * per;
  const word = (t: RawTensor, r: number, c: number) =>
    t.bytes.getUint32(4 * (r * t.shape[1]! + c), true);
  // Where output o's value sits in a word packed along the outputs.
  const slot = (o: number) => gptq ? o % per : AWQ_PACK_ORDER.indexOf(o % per);
  const out = new Float64Array(rows * cols);
  for (let o = 0; o < rows; o++) {
    for (let i = 0; i < cols; i++) {
      const g = groupOf(gIdx, q, i);
      const code = gptq
        ? field(word(qweight, Math.floor(i / per), o), i % per, q.bits)
        : field(word(qweight, i, Math.floor(o / per)), slot(o), q.bits);
      const zero = field(word(qzeros, g, Math.floor(o / per)), slot(o), q.bits) + q.zeroOffset;
      const scale = scales.bytes.getFloat16(2 * (g * rows + o), true);
      out[o * cols + i] = (code - zero) * scale;
    }
  }
  return { rows, cols, data: out };
}

/**
 * compressed-tensors `pack-quantized`, as its `unpack_from_int32` and `dequantize` define it:
 * `weight_packed [out, in / P]` holds input `P c + j` of row `o` in bits `b j ..` of word `[o][c]`,
 * unsigned, the signed code being that minus `2^(b - 1)`; `weight_zero_point [out / P, groups]`
 * likewise along the outputs (none when symmetric: zero 0); `weight_scale [out, groups]`;
 * `W[o][i] = (q - zp) * scale` of input i's group (`weight_g_idx`, or `i / group_size`).
 */
function compressedTensorsRef(
  parts: Map<string, RawTensor>,
  prefix: string,
  q: PackedIntQuantization,
): { rows: number; cols: number; data: Float64Array } {
  const packed = parts.get(`${prefix}weight_packed`)!;
  const scale = parts.get(`${prefix}weight_scale`)!;
  const zp = parts.get(`${prefix}weight_zero_point`);
  const gIdx = parts.get(`${prefix}weight_g_idx`);
  const b = q.bits;
  const per = 32 / b;
  const offset = 2 ** (b - 1);
  const rows = packed.shape[0]!;
  const cols = packed.shape[1]! * per;
  const groups = scale.shape[1]!;
  const out = new Float64Array(rows * cols);
  for (let o = 0; o < rows; o++) {
    for (let i = 0; i < cols; i++) {
      const g = groupOf(gIdx, q, i);
      const word = packed.bytes.getUint32(4 * (o * (cols / per) + Math.floor(i / per)), true);
      const code = field(word, i % per, b) - offset;
      const zero = zp === undefined
        ? 0
        : field(zp.bytes.getUint32(4 * (Math.floor(o / per) * groups + g), true), o % per, b) -
          offset;
      const s = scale.dtype === "BF16"
        ? bf16Value(scale.bytes.getUint16(2 * (o * groups + g), true))
        : scale.bytes.getFloat16(2 * (o * groups + g), true);
      out[o * cols + i] = (code - zero) * s;
    }
  }
  return { rows, cols, data: out };
}
