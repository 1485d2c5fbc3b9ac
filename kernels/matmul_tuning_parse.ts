/**
 * Reads a {@linkcode MatmulTuning} back from plain data (engine/kernel_tuning.ts's cache file),
 * checking every field against what the tuner can choose.
 *
 * @module
 */

import { checkTile, sameTile, TILE_CANDIDATES, type TileConfig } from "./matmul_tile.ts";
import { GEMV_ROW_BLOCKS, GEMV_STEPS, GEMV_TPRS, ROW_BLOCKS } from "./matmul_kernels.ts";
import type { MatmulTuning, ShapeTile, SmallTile } from "./matmul_tuning.ts";

/**
 * Checks plain data read back (e.g. from a cache file) as a {@linkcode MatmulTuning}: the tile
 * must be one of {@linkcode TILE_CANDIDATES} (the configurations tested against the reference),
 * every row count a non-negative integer.
 *
 * @throws {TypeError} naming what is wrong.
 */
export function parseMatmulTuning(data: unknown): MatmulTuning {
  const o = data as
    | {
      tile?: unknown;
      smallTile?: { tile?: unknown; maxRows?: unknown };
      shapeTiles?: unknown;
      gemvMaxRows?: unknown;
      gemvRows?: unknown;
      gemvSteps?: unknown;
      gemvTprs?: unknown;
      gemvXRows?: unknown;
    }
    | null;
  const tile = parseTile(o?.tile);
  const smallTile = o?.smallTile === undefined
    ? undefined
    : parseSmallTile("smallTile", o.smallTile);
  const shapeTiles: Record<string, ShapeTile> = {};
  const table = o?.shapeTiles ?? {};
  if (typeof table !== "object" || table === null || Array.isArray(table)) {
    throw new TypeError("Invalid matmul tuning: shapeTiles must be an object");
  }
  for (const [key, value] of Object.entries(table)) {
    const v = value as { tile?: unknown; small?: unknown; middle?: unknown } | null;
    const small = v?.small === undefined
      ? undefined
      : parseSmallTile(`shapeTiles["${key}"].small`, v.small);
    const middle = parseMiddle(`shapeTiles["${key}"].middle`, v?.middle, small?.maxRows ?? 0);
    shapeTiles[key] = {
      tile: parseTile(v?.tile),
      ...(small === undefined ? {} : { small }),
      ...(middle.length === 0 ? {} : { middle }),
    };
  }
  const rows = o?.gemvMaxRows;
  if (typeof rows !== "object" || rows === null || Array.isArray(rows)) {
    throw new TypeError("Invalid matmul tuning: gemvMaxRows must be an object");
  }
  const gemvMaxRows: Record<string, number> = {};
  for (const [key, value] of Object.entries(rows)) {
    if (!Number.isInteger(value) || (value as number) < 0) {
      throw new TypeError(
        `Invalid matmul tuning: gemvMaxRows["${key}"] must be a non-negative integer, got ${
          JSON.stringify(value)
        }`,
      );
    }
    gemvMaxRows[key] = value as number;
  }
  const gemvRows = parseChoices("gemvRows", o?.gemvRows, GEMV_ROW_BLOCKS);
  const gemvSteps = parseChoices("gemvSteps", o?.gemvSteps, GEMV_STEPS);
  const gemvTprs = parseChoices("gemvTprs", o?.gemvTprs, GEMV_TPRS);
  const gemvXRows = parseChoices("gemvXRows", o?.gemvXRows, ROW_BLOCKS);
  return {
    tile,
    ...(smallTile === undefined ? {} : { smallTile }),
    ...(Object.keys(shapeTiles).length === 0 ? {} : { shapeTiles }),
    gemvMaxRows,
    gemvRows,
    gemvSteps,
    gemvTprs,
    gemvXRows,
  };
}

/** A per-shape table `name` (absent: empty) whose values are all among `allowed`. */
function parseChoices(
  name: string,
  data: unknown,
  allowed: readonly number[],
): Record<string, number> {
  const table = data ?? {};
  if (typeof table !== "object" || table === null || Array.isArray(table)) {
    throw new TypeError(`Invalid matmul tuning: ${name} must be an object`);
  }
  const out: Record<string, number> = {};
  for (const [key, value] of Object.entries(table)) {
    if (!allowed.some((b) => b === value)) {
      throw new TypeError(
        `Invalid matmul tuning: ${name}["${key}"] must be one of ${allowed.join(", ")}, ` +
          `got ${JSON.stringify(value)}`,
      );
    }
    out[key] = value as number;
  }
  return out;
}

/** A {@linkcode SmallTile} read back as `name`. */
function parseSmallTile(name: string, data: unknown): SmallTile {
  const o = data as { tile?: unknown; maxRows?: unknown } | null;
  const maxRows = o?.maxRows;
  if (!Number.isInteger(maxRows) || (maxRows as number) < 1) {
    throw new TypeError(
      `Invalid matmul tuning: ${name}.maxRows must be a positive integer, got ${
        JSON.stringify(maxRows)
      }`,
    );
  }
  return { tile: parseTile(o?.tile), maxRows: maxRows as number };
}

/** A {@linkcode ShapeTile.middle} read back as `name` (absent: empty), above `floor` rows. */
function parseMiddle(name: string, data: unknown, floor: number): SmallTile[] {
  if (data === undefined) return [];
  if (!Array.isArray(data)) throw new TypeError(`Invalid matmul tuning: ${name} must be an array`);
  const out = data.map((d, i) => parseSmallTile(`${name}[${i}]`, d));
  out.forEach((t, i) => {
    const below = i === 0 ? floor : out[i - 1]!.maxRows;
    if (t.maxRows <= below) {
      throw new TypeError(
        `Invalid matmul tuning: ${name}[${i}].maxRows ${t.maxRows} must exceed ${below}`,
      );
    }
  });
  return out;
}

/** The candidate `t` names (see {@linkcode parseMatmulTuning}). */
function parseTile(t: unknown): TileConfig {
  const c = t as Partial<TileConfig> | null | undefined;
  const tile = TILE_CANDIDATES.find((k) =>
    sameTile(k, {
      wx: c?.wx ?? 0,
      wy: c?.wy ?? 0,
      bk: c?.bk ?? 0,
      tm: c?.tm,
      tn: c?.tn,
      db: c?.db === true,
      sk: c?.sk,
    })
  );
  if (tile === undefined) {
    throw new TypeError(`Invalid matmul tuning: tile ${JSON.stringify(t)} is not a candidate`);
  }
  checkTile(tile);
  return tile;
}
