/**
 * A float64 reference of fine-grained FP8 weights (transformers' `Fp8Dequantize`), written from
 * the format's definition and reading the bytes itself, so that it shares nothing with the
 * engine's FP8 path (engine/model/fp8.ts, engine/model/checkpoint.ts) but the header offsets.
 *
 * @module
 */

import type { Checkpoint, CheckpointTensor } from "../../engine/model/checkpoint.ts";
import { isPackedInt } from "../../engine/model/checkpoint_quantization.ts";
import { bf16Value } from "./safetensors.ts";

/**
 * The value of a `float8_e4m3fn` byte: sign, 4 exponent bits (bias 7), 3 mantissa bits;
 * exponent 0 subnormal (`2^-6 * m / 8`), `S.1111.111` NaN, no infinities.
 */
export function e4m3Value(bits: number): number {
  const sign = bits & 0x80 ? -1 : 1;
  const exp = (bits >> 3) & 0xf;
  const man = bits & 0x7;
  if (exp === 0xf && man === 0x7) return NaN;
  if (exp === 0) return sign * 2 ** -6 * (man / 8);
  return sign * 2 ** (exp - 7) * (1 + man / 8);
}

/** The value of every e4m3 code (a table of {@linkcode e4m3Value}). */
export const E4M3_VALUES: readonly number[] = Array.from({ length: 256 }, (_, c) => e4m3Value(c));

/** The finite non-negative e4m3 values, by code (0 .. 0x7E), increasing. */
const E4M3_MAGNITUDES = E4M3_VALUES.slice(0, 0x7f);

/**
 * The `float8_e4m3fn` code of `x` as an fp8 KV cache stores it (scale 1): the nearest finite
 * value, a tie to the even code, magnitudes past 448 saturated to the code of +-448, the sign
 * bit kept (-0 and the negative values that round to 0 are 0x80); NaN is 0x7F.
 */
export function e4m3Code(x: number): number {
  if (Number.isNaN(x)) return 0x7f;
  const a = Math.min(Math.abs(x), 448);
  // hi: the first magnitude >= a (a binary search), lo: its lower neighbour.
  let lo = 0;
  let hi = E4M3_MAGNITUDES.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (E4M3_MAGNITUDES[mid]! >= a) hi = mid;
    else lo = mid + 1;
  }
  lo = Math.max(0, hi - 1);
  const dLo = a - E4M3_MAGNITUDES[lo]!;
  const dHi = E4M3_MAGNITUDES[hi]! - a;
  const code = dLo < dHi || (dLo === dHi && lo % 2 === 0) ? lo : hi;
  return code | (x < 0 || Object.is(x, -0) ? 0x80 : 0);
}

/** `x` rounded as an fp8 cache holds it: the value of {@linkcode e4m3Code}'s code. */
export function e4m3Round(x: number): number {
  return E4M3_VALUES[e4m3Code(x)]!;
}

/** The raw bytes of tensor `t`, read from its file at its header offset. */
async function rawBytes(t: CheckpointTensor): Promise<Uint8Array> {
  const file = await Deno.open(t.file, { read: true });
  try {
    const out = new Uint8Array(t.byteLength);
    await file.seek(t.fileOffset, Deno.SeekMode.Start);
    let done = 0;
    while (done < out.length) {
      const n = await file.read(out.subarray(done));
      if (n === null) throw new RangeError(`${t.file}: short read of ${t.name}`);
      done += n;
    }
    return out;
  } finally {
    file.close();
  }
}

/** The float64 values of an F32 / BF16 scale tensor, from its bytes. */
function scaleValues(t: CheckpointTensor, bytes: Uint8Array): Float64Array {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = t.shape.reduce((a, d) => a * d, 1);
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    out[i] = t.dtype === "F32"
      ? view.getFloat32(4 * i, true)
      : bf16Value(view.getUint16(2 * i, true));
  }
  return out;
}

/**
 * FP8 weight `name` of `ck` dequantized in float64: `q[r][c]` times the scale of its tensor, its
 * row (per channel) or its block (`S[floor(r / bm)][floor(c / bn)]`).
 */
export async function fp8WeightRef(ck: Checkpoint, name: string): Promise<Float64Array> {
  const t = ck.tensor(name);
  const s = ck.fp8Scale(name);
  const q = ck.quantization;
  if (t.dtype !== "F8_E4M3" || s === undefined || q === null || isPackedInt(q)) {
    throw new RangeError(`fp8WeightRef: ${name} is not an FP8 weight with a scale`);
  }
  const [rows, cols] = t.shape as [number, number];
  const codes = await rawBytes(t);
  const scales = scaleValues(s, await rawBytes(s));
  const out = new Float64Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      // One scale per tensor, per output row, or per block of the row-major scale grid.
      const sc = q.scaling;
      const scale = sc.kind === "tensor"
        ? scales[0]!
        : sc.kind === "channel"
        ? scales[r]!
        : scales[Math.floor(r / sc.rows) * Math.ceil(cols / sc.cols) + Math.floor(c / sc.cols)]!;
      out[r * cols + c] = e4m3Value(codes[r * cols + c]!) * scale;
    }
  }
  return out;
}
