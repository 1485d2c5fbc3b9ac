/**
 * What a {@linkcode MatmulTuning} (or the defaults, where it lists nothing) chooses for one
 * call-site shape: its `tiled` configurations at a row count, its `gemv` kernel, the rows of X per
 * `gemv` workgroup and the largest M run by `gemv`. Plain lookups; `Matmul` compiles and binds
 * what they name.
 *
 * @module
 */

import type { GemvKind } from "./matmul_kernels.ts";
import { checkTile, sameTile, type TileConfig, tileSplit } from "./matmul_tile.ts";
import { type MatmulShape, type MatmulTuning, MAX_X_ROWS, shapeKey } from "./matmul_tuning.ts";

/**
 * The tiles `shape` runs under `tuning` (its own, or the common ones): prefill, small M, and the
 * shape's own between them.
 */
function tilesOf(tuning: MatmulTuning, shape?: MatmulShape) {
  const own = shape === undefined ? undefined : tuning.shapeTiles?.[shapeKey(shape)];
  return own === undefined
    ? { tile: tuning.tile, small: tuning.smallTile, middle: [] }
    : { tile: own.tile, small: own.small, middle: own.middle ?? [] };
}

/**
 * The `tiled` configuration that runs `m` rows of X of `shape` under `tuning`: the shape's own
 * when the tuning lists it (the first of its small-M and middle tiles whose rows hold `m`, else
 * its prefill tile), else the common one (the small-M tile up to its rows).
 */
export function tileAt(tuning: MatmulTuning, m: number, shape?: MatmulShape): TileConfig {
  const { tile, small, middle } = tilesOf(tuning, shape);
  const below = small === undefined ? middle : [small, ...middle];
  return below.find((b) => m <= b.maxRows)?.tile ?? tile;
}

/**
 * Every `tiled` configuration `shape` may run under `tuning` (any shape's common ones without
 * it): the tile, the small-M and middle tiles, and each split-K one's unsplit twin (what runs the
 * M whose partials do not fit, `Matmul.fitSplit`).
 */
export function tilesRun(tuning: MatmulTuning, shape?: MatmulShape): TileConfig[] {
  const { tile, small, middle } = tilesOf(tuning, shape);
  const all = [tile, ...(small === undefined ? [] : [small.tile]), ...middle.map((b) => b.tile)]
    .flatMap((t) => tileSplit(t) === 1 ? [t] : [t, { ...t, sk: 1 }]);
  return all.filter((t, i) => all.findIndex((u) => sameTile(u, t)) === i);
}

/**
 * Checks every tile of `tuning`.
 *
 * @throws {RangeError} when one is not a valid configuration (`checkTile`).
 */
export function checkTuningTiles(tuning: MatmulTuning): void {
  checkTile(tuning.tile);
  if (tuning.smallTile !== undefined) checkTile(tuning.smallTile.tile);
  for (const own of Object.values(tuning.shapeTiles ?? {})) {
    checkTile(own.tile);
    if (own.small !== undefined) checkTile(own.small.tile);
    for (const b of own.middle ?? []) checkTile(b.tile);
  }
}

/**
 * The `gemv` kernel for `shape`: weight rows per invocation, weights per step and invocations
 * per row (the tuning's, or 1, 4 and 64).
 */
export function gemvKindOf(tuning: MatmulTuning, shape: MatmulShape): GemvKind {
  const key = shapeKey(shape);
  return {
    rows: tuning.gemvRows?.[key] ?? 1,
    step: tuning.gemvSteps?.[key] ?? 4,
    tpr: tuning.gemvTprs?.[key] ?? 64,
  };
}

/**
 * The most rows of X one `gemv` workgroup takes for `shape` (the tuning's, or 8): M above it
 * runs several workgroups in grid z, each reading the weights again (from the GPU's caches).
 */
export function gemvXRowsOf(tuning: MatmulTuning, shape: MatmulShape): number {
  return tuning.gemvXRows?.[shapeKey(shape)] ?? MAX_X_ROWS;
}

/** The largest M run by `gemv` for `shape` (the tuning's, or `fallback`). */
export function gemvMaxRowsOf(tuning: MatmulTuning, shape: MatmulShape, fallback: number): number {
  return tuning.gemvMaxRows[shapeKey(shape)] ?? fallback;
}
