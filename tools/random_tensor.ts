/**
 * Random tensor values for the checkpoints tools/make_model.ts writes (random weights, like
 * vLLM's `--load-format dummy`): deterministic in the seed and the tensor's name, so a tensor's
 * values do not depend on the shards or on which other tensors are written, and fast enough for
 * a 0.6B-parameter checkpoint (each 32-bit draw indexes a table of 65,536 normal samples twice).
 *
 * @module
 */

import type { CheckpointDtype } from "../engine/model/presets.ts";
import type { TensorInit, TensorSpec } from "../engine/model/preset_tensors.ts";

/** FNV-1a hash of the seed and a name: the seed of one tensor's stream. */
function streamSeed(seed: number, name: string): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  h ^= h >>> 16;
  return h === 0 ? 0x9e3779b9 : h;
}

/**
 * 65536 fixed standard-normal samples (Box-Muller from a fixed mulberry32 stream). Random
 * tensors index this table with 16-bit random numbers: two table lookups per 32-bit draw, far
 * faster than computing logs and cosines for hundreds of millions of values.
 */
const NORMAL_TABLE: Float64Array = (() => {
  const table = new Float64Array(65536);
  let s = 0x2545f491;
  const uniform = () => {
    let t = (s = (s + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  for (let i = 0; i < table.length; i += 2) {
    const r = Math.sqrt(-2 * Math.log(1 - uniform()));
    const a = 2 * Math.PI * uniform();
    table[i] = r * Math.cos(a);
    table[i + 1] = r * Math.sin(a);
  }
  return table;
})();

/** f32 -> bf16 bits, round to nearest even (values here are finite). */
export function bf16Bits(values: Float32Array): Uint16Array {
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  const out = new Uint16Array(values.length);
  for (let i = 0; i < bits.length; i++) {
    const b = bits[i]!;
    out[i] = (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
  }
  return out;
}

/** The 65536 possible values of a tensor with `init`, already encoded in `dtype`. */
function valueTable(init: TensorInit, dtype: CheckpointDtype): Uint16Array | Float32Array {
  const f32 = new Float32Array(65536);
  const mean = init.kind === "ones" ? 1 : 0;
  for (let i = 0; i < f32.length; i++) f32[i] = mean + init.std * NORMAL_TABLE[i]!;
  if (dtype === "f32") return f32;
  if (dtype === "f16") {
    const h = Float16Array.from(f32);
    return new Uint16Array(h.buffer);
  }
  return bf16Bits(f32);
}

/**
 * Random values for `spec` in `dtype`, as raw little-endian bytes: a xorshift32 stream (with a
 * multiplicative output scramble) seeded by `seed` and the tensor name, each 32-bit draw giving
 * two 16-bit indices into the tensor's value table.
 */
export function randomTensorBytes(
  spec: TensorSpec,
  dtype: CheckpointDtype,
  seed: number,
): Uint8Array {
  let n = 1;
  for (const d of spec.shape) n *= d;
  const table = valueTable(spec.init, dtype);
  const out = table instanceof Float32Array ? new Float32Array(n) : new Uint16Array(n);
  let s = streamSeed(seed, spec.name) | 0;
  const even = n & ~1;
  for (let i = 0; i < even; i += 2) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    const r = Math.imul(s, 0x2c1b3c6d);
    out[i] = table[r & 0xffff]!;
    out[i + 1] = table[r >>> 16]!;
  }
  if (even < n) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    out[even] = table[Math.imul(s, 0x2c1b3c6d) >>> 16]!;
  }
  return new Uint8Array(out.buffer);
}
