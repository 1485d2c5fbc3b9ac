/**
 * The stored tensors of a checkpoint's packed-integer weights (GPTQ, AWQ, compressed-tensors
 * `pack-quantized`; their layouts in engine/model/packed_int.ts): grouped into one weight
 * `X.weight` each, checked against the weight's shape, and read whole.
 *
 * @module
 */

import type { CheckpointTensor } from "./checkpoint.ts";
import { type PackedIntQuantization, packedLayoutName } from "./checkpoint_quantization.ts";
import { CheckpointError } from "./errors.ts";
import { shapeText } from "./safetensors_header.ts";
import {
  PACKED_PARTS,
  packedGroups,
  type PackedPart,
  packedPartShapes,
  packedPartSuffixes,
  type PackedWeight,
  packedWeightShape,
  sequentialGroups,
} from "./packed_int.ts";

/** A packed weight's stored tensors, by role. */
export type PackedParts = Partial<Record<PackedPart, CheckpointTensor>>;

/** How {@linkcode readPackedWeight} reads a part: its raw bytes, or its values as f32. */
export interface PackedPartReader {
  bytes(t: CheckpointTensor): Promise<ArrayBuffer>;
  f32(t: CheckpointTensor): Promise<Float32Array>;
}

/**
 * Replaces, in `tensors` (a checkpoint's weights by canonical name), each codes tensor
 * (`X.qweight`, `X.weight_packed`) and the parts beside it by one weight `X.weight` (module doc):
 * its shape the `[out, in]` one its codes hold, its bytes those of all its parts, its dtype e.g.
 * `GPTQ_I4`. Returns each such weight's parts by role.
 */
export function groupPackedTensors(
  q: PackedIntQuantization,
  tensors: Map<string, CheckpointTensor>,
): Map<string, PackedParts> {
  const packed = new Map<string, PackedParts>();
  const suffixes = packedPartSuffixes(q.layout);
  const codesSuffix = suffixes.codes!;
  const label = q.layout === "pack-quantized" ? "CT" : q.layout.toUpperCase();
  for (const [name, codes] of [...tensors]) {
    if (!name.endsWith(`.${codesSuffix}`)) continue;
    const prefix = name.slice(0, -codesSuffix.length);
    const weight = `${prefix}weight`;
    if (tensors.has(weight)) continue; // Both: the codes stay, reported as unused.
    const parts: PackedParts = {};
    let byteLength = 0;
    for (const part of PACKED_PARTS) {
      const suffix = suffixes[part];
      const t = suffix === undefined ? undefined : tensors.get(prefix + suffix);
      if (t === undefined) continue;
      parts[part] = t;
      byteLength += t.byteLength;
      tensors.delete(prefix + suffix);
    }
    packed.set(weight, parts);
    tensors.set(weight, {
      name: weight,
      dtype: `${label}_I${q.bits}`,
      shape: packedWeightShape(q, codes.shape) ?? codes.shape,
      fileOffset: codes.fileOffset,
      byteLength,
      file: codes.file,
    });
  }
  return packed;
}

/**
 * Checks packed weight `t`'s parts: all there, of the shapes and dtypes its shape needs.
 *
 * @throws {CheckpointError} one line naming the part.
 */
export function checkPackedParts(
  q: PackedIntQuantization,
  t: CheckpointTensor,
  parts: PackedParts,
): void {
  const [rows, cols] = t.shape as [number, number];
  const per = 32 / q.bits;
  const suffixes = packedPartSuffixes(q.layout);
  const prefix = t.name.slice(0, -"weight".length);
  const layout = packedLayoutName(q.layout);
  if (rows % per !== 0) {
    throw new CheckpointError(
      `${t.name}: ${rows} outputs are not a multiple of the ${per} ${q.bits}-bit zero points an int32 packs`,
    );
  }
  const ct = q.layout === "pack-quantized";
  // Which parts must be there (true), may be (undefined) or must not (false).
  const needed: Record<PackedPart, boolean | undefined> = {
    codes: true,
    zeros: ct ? !q.symmetric : true,
    scales: true,
    groups: q.layout === "awq" ? false : ct ? q.actOrder : undefined,
    shape: ct ? undefined : false,
  };
  const want = packedPartShapes(q, rows, cols);
  for (const part of PACKED_PARTS) {
    const p = parts[part];
    const stored = `${prefix}${suffixes[part] ?? part}`;
    if (p === undefined) {
      if (needed[part] !== true) continue;
      throw new CheckpointError(
        `${stored}: tensor not found beside ${prefix}${suffixes.codes} in ${t.file} (${layout} ${
          q.symmetric ? "symmetric " : "zero-point "
        }weights need it)`,
      );
    }
    if (needed[part] === false) {
      throw new CheckpointError(
        `${p.name}: a ${layout} checkpoint ${
          q.symmetric ? "with symmetric codes " : ""
        }has no such tensor (in ${p.file})`,
      );
    }
    const shape = want[part];
    if (p.shape.length !== shape.length || p.shape.some((d, i) => d !== shape[i])) {
      throw new CheckpointError(
        `${p.name}: expected shape ${shapeText(shape)} (${layout} ${q.bits}-bit, ${
          packedGroups(q, cols)
        } groups, weight [${rows}, ${cols}]), found ${shapeText(p.shape)} in ${p.file}`,
      );
    }
    const ok = part === "scales"
      ? p.dtype === "F16" || p.dtype === "BF16" || p.dtype === "F32"
      : p.dtype === "I32" || (part === "shape" && p.dtype === "I64");
    if (!ok) {
      throw new CheckpointError(
        `${p.name}: unsupported dtype ${p.dtype} in ${p.file} (expected ${
          part === "scales" ? "F16, BF16 or F32" : "I32"
        })`,
      );
    }
  }
}

/**
 * Packed weight `t` read whole through `read` (its codes, zero points, scales and groups).
 *
 * @throws {CheckpointError} for parts missing or of the wrong shape or dtype
 *   ({@linkcode checkPackedParts}), a group index naming a group that does not exist, or a
 *   `weight_shape` other than the weight's.
 */
export async function readPackedWeight(
  q: PackedIntQuantization,
  t: CheckpointTensor,
  parts: PackedParts,
  read: PackedPartReader,
): Promise<PackedWeight> {
  checkPackedParts(q, t, parts);
  const [rows, cols] = t.shape as [number, number];
  const groups = packedGroups(q, cols);
  const bytes = read.bytes;
  if (parts.shape !== undefined) {
    const raw = await bytes(parts.shape);
    const shape = parts.shape.dtype === "I64"
      ? [...new BigInt64Array(raw)].map(Number)
      : [...new Int32Array(raw)];
    if (shape[0] !== rows || shape[1] !== cols) {
      throw new CheckpointError(
        `${parts.shape.name}: says [${
          shape.join(", ")
        }], but the codes hold a [${rows}, ${cols}] weight (in ${parts.shape.file})`,
      );
    }
  }
  let scales = await read.f32(parts.scales!);
  if (q.layout === "pack-quantized") {
    // [rows, groups] -> [groups, rows].
    const t = new Float32Array(scales.length);
    for (let o = 0; o < rows; o++) {
      for (let g = 0; g < groups; g++) t[g * rows + o] = scales[o * groups + g]!;
    }
    scales = t;
  }
  let groupOf = sequentialGroups(q, cols);
  if (parts.groups !== undefined) {
    groupOf = new Int32Array(await bytes(parts.groups));
    const bad = groupOf.findIndex((g) => g < 0 || g >= groups);
    if (bad >= 0) {
      throw new CheckpointError(
        `${parts.groups.name}: input ${bad} is in group ${
          groupOf[bad]
        }, but there are ${groups} groups (in ${parts.groups.file})`,
      );
    }
  }
  return {
    quantization: q,
    rows,
    cols,
    qweight: new Uint32Array(await bytes(parts.codes!)),
    qzeros: parts.zeros === undefined ? null : new Uint32Array(await bytes(parts.zeros)),
    scales,
    groupOf,
  };
}
