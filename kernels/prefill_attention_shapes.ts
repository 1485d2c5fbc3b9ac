/**
 * The workgroup shapes of the two GPU prefill attention kernels that share a tile of query rows
 * across 64 invocations (kernels/paged_attention_prefill.ts): `tiled`
 * (`paged_attention_prefill_tiled.wgsl`, a row per 64 / BR invocations) and `blocked`
 * (`paged_attention_prefill_blocked.wgsl`, register blocks of BR / 8 rows by BK / 8 keys). A
 * shape is the rows per workgroup (BR) and the keys staged per step (BK); each kernel's header
 * gives its workgroup memory in bytes, reproduced here.
 *
 * @module
 */

import type { DType } from "../gpu/dtype.ts";

/** The prefill kernels with a tile of rows per workgroup. */
export type TiledPrefillVariant = "tiled" | "blocked";

/** Rows per workgroup (BR) and keys per step (BK). */
export interface PrefillTileShape {
  readonly br: number;
  readonly bk: number;
}

/** (rows, keys per step) of each kernel, tried in order; the first that fits is the default. */
const SHAPES: Readonly<Record<TiledPrefillVariant, readonly (readonly [number, number])[]>> = {
  tiled: [[32, 16], [32, 8], [16, 16], [16, 8], [16, 4], [8, 16], [8, 8]],
  blocked: [[32, 32], [32, 16], [16, 32], [16, 16], [16, 8], [8, 16], [8, 8]],
};

/**
 * The rows per workgroup a `tiled` or `blocked` kernel can be asked for
 * (`PagedAttentionPrefillConfig.tiledRows`): fewer rows give a prefill more workgroups (a
 * 512-token sequence of 8 kv heads: 256 of 32 rows for GQA 2, 1,024 of 8), each with less work
 * per K step.
 */
export const TILED_ROWS: readonly number[] = [32, 16, 8];

/** Workgroup memory in bytes of `variant` with shape (br, bk), from the kernels' headers. */
export function prefillTileBytes(
  variant: TiledPrefillVariant,
  headDim: number,
  dtype: DType,
  br: number,
  bk: number,
): number {
  const d4 = headDim / 4;
  if (variant === "tiled") return 16 * d4 * (br + 2 * bk) + 4 * br * (bk + 2);
  // Rows padded to d4 + 1 vec4s and bk + 1 scores; K and V staged in the cache's type.
  const qs = d4 + 1;
  const kvVec4 = dtype === "f16" ? 8 : 16;
  return 16 * br * qs + 2 * bk * qs * kvVec4 + 4 * br * (bk + 1 + 8);
}

/**
 * The shape of `variant` for `headDim`, a GQA group and a KV dtype in `storage` bytes of
 * workgroup memory: the first of its list with `rows` rows (any, when not given) that holds the
 * group (`br >= group`) and fits; null when none does.
 */
export function prefillTileShape(
  variant: TiledPrefillVariant,
  headDim: number,
  group: number,
  storage: number,
  dtype: DType,
  rows?: number,
): PrefillTileShape | null {
  for (const [br, bk] of SHAPES[variant]) {
    if (rows !== undefined && br !== rows) continue;
    if (br >= group && prefillTileBytes(variant, headDim, dtype, br, bk) <= storage) {
      return { br, bk };
    }
  }
  return null;
}

/**
 * The other row counts of `variant` ({@linkcode TILED_ROWS}) that fit beside its default
 * shape's (each its own kernel), for the tuner to measure.
 */
export function prefillTileRows(
  variant: TiledPrefillVariant,
  headDim: number,
  group: number,
  storage: number,
  dtype: DType,
): number[] {
  const first = prefillTileShape(variant, headDim, group, storage, dtype);
  if (first === null) return [];
  return TILED_ROWS.filter((rows) =>
    rows !== first.br && prefillTileShape(variant, headDim, group, storage, dtype, rows) !== null
  );
}
