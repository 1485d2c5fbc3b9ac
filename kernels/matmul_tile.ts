/**
 * The `tiled` matmul kernel's configuration (kernels/matmul_tiled.wgsl): the policy's tile, the
 * shapes bench/matmul_tune.ts measures on an adapter, and their check.
 *
 * @module
 */

/**
 * A `tiled` configuration: invocations (wx, wy), each a 4 x 4 block of Y, and the K tile bk
 * (bk % 4 == 0, wx * wy % bk == 0, 4 * bk % wx == 0).
 */
export interface TileConfig {
  readonly wx: number;
  readonly wy: number;
  readonly bk: number;
}

/** The `tiled` configuration the policy uses. */
export const TILE: TileConfig = { wx: 16, wy: 16, bk: 16 };

/**
 * The `tiled` configurations bench/matmul_tune.ts measures (TILE first); each is tested like
 * TILE. On an NVIDIA H200 (2026-11-26, Qwen3-0.6B projections at M = 512) they took 0.305-0.409 ms
 * for qkv (TILE the fastest) and 0.285-0.411 ms for down (16x16 bk32 the fastest, TILE 0.314);
 * bk8 was the slowest at every M.
 */
export const TILE_CANDIDATES: readonly TileConfig[] = [
  TILE,
  { wx: 16, wy: 16, bk: 32 },
  { wx: 16, wy: 16, bk: 8 },
  { wx: 8, wy: 8, bk: 16 },
  { wx: 16, wy: 8, bk: 16 },
  { wx: 8, wy: 16, bk: 16 },
  { wx: 32, wy: 8, bk: 32 },
];

/**
 * Checks that `tile` is a valid `tiled` configuration.
 *
 * @throws {RangeError} when bk % 4, (wx * wy) % bk or (4 * bk) % wx is not 0, or wx * wy exceeds
 * 1024 invocations.
 */
export function checkTile(tile: TileConfig): void {
  const { wx, wy, bk } = tile;
  const ok = [wx, wy, bk].every((v) => Number.isInteger(v) && v > 0) && bk % 4 === 0 &&
    (wx * wy) % bk === 0 && (4 * bk) % wx === 0 && wx * wy <= 1024;
  if (!ok) {
    throw new RangeError(
      `Cannot use matmul tile ${wx}x${wy} bk${bk}: needs bk % 4 == 0, (wx * wy) % bk == 0, ` +
        `(4 * bk) % wx == 0 and wx * wy <= 1024`,
    );
  }
}
