/**
 * The `tiled` matmul kernel's configuration (kernels/matmul_tiled.wgsl): the policy's tile, the
 * shapes bench/matmul_tune.ts measures on an adapter, and their check.
 *
 * @module
 */

/**
 * A `tiled` configuration: invocations (wx, wy), each a tm x tn block of Y (tm rows of X, tn
 * weight rows), and the K tile bk (bk % 4 == 0, wx * wy % bk == 0, tm * bk % wx == 0). A
 * workgroup computes a (tm wy) x (tn wx) tile of Y.
 */
export interface TileConfig {
  readonly wx: number;
  readonly wy: number;
  readonly bk: number;
  /** Rows of X per invocation, 4 or 8 (an 8 x 4 register block); default 4. */
  readonly tm?: number;
  /** Weight rows (columns of Y) per invocation, 4 or 8; default 4. */
  readonly tn?: number;
  /**
   * Double-buffered staging: two X and two W tiles in workgroup memory, the next K step's
   * global loads issued before the current step's FMAs and stored after them, one barrier per
   * K step (matmul_tiled.wgsl); default false.
   */
  readonly db?: boolean;
  /**
   * Split-K: the K steps divided among this many workgroups per tile of Y (one of
   * {@linkcode TILE_SPLITS}), each writing its partial sums, which a second dispatch adds up
   * (kernels/matmul_split.ts); for grids of few workgroups (a decode batch or a prefill with a
   * small N); default 1.
   */
  readonly sk?: number;
}

/** The K splits a `tiled` configuration accepts ({@linkcode TileConfig.sk}). */
export const TILE_SPLITS: readonly number[] = [1, 2, 4, 8];

/** The K splits of `tile` (its `sk`, default 1). */
export function tileSplit(tile: TileConfig): number {
  return tile.sk ?? 1;
}

/** The register block rows a `tiled` configuration accepts ({@linkcode TileConfig.tm}). */
export const TILE_ROWS: readonly number[] = [4, 8];

/** The register block columns a `tiled` configuration accepts ({@linkcode TileConfig.tn}). */
export const TILE_COLS: readonly number[] = [4, 8];

/** The rows of X per invocation of `tile` (its `tm`, default 4). */
export function tileRows(tile: TileConfig): number {
  return tile.tm ?? 4;
}

/** The weight rows (columns of Y) per invocation of `tile` (its `tn`, default 4). */
export function tileCols(tile: TileConfig): number {
  return tile.tn ?? 4;
}

/** Whether `tile` stages double-buffered ({@linkcode TileConfig.db}). */
export function tileBuffers(tile: TileConfig): 1 | 2 {
  return tile.db === true ? 2 : 1;
}

/**
 * Workgroup memory a `tiled` configuration stages, in bytes (X and W tiles of one K step, twice
 * when double-buffered).
 */
export function tileBytes(tile: TileConfig): number {
  const { wx, wy, bk } = tile;
  // One vec4 (16 bytes) of padding per staged line; see matmul_tiled.wgsl.
  return tileBuffers(tile) * 16 * bk *
    ((tileRows(tile) * wy) / 4 + 1 + (tileCols(tile) * wx) / 4 + 1);
}

/**
 * Workgroup memory every `tiled` configuration fits in: the engine requests the adapter's limit,
 * 32 KiB on lavapipe (where the tests run), 48 KiB on the NVIDIA GPUs measured.
 */
export const TILE_MAX_BYTES = 32768;

/**
 * A short name of `tile`, e.g. "16x16 bk16", "16x8 bk16 tm8", "16x16 bk16 tm8 tn8" or
 * "16x16 bk16 db".
 */
export function tileName(tile: TileConfig): string {
  const tm = tileRows(tile);
  const tn = tileCols(tile);
  return `${tile.wx}x${tile.wy} bk${tile.bk}${tm === 4 ? "" : ` tm${tm}`}${
    tn === 4 ? "" : ` tn${tn}`
  }${tileBuffers(tile) === 2 ? " db" : ""}${tileSplit(tile) === 1 ? "" : ` sk${tileSplit(tile)}`}`;
}

/**
 * The key of `tile` in pipeline caches, e.g. "t16x16k16m4n4" or "t16x16k16m4n4d" (double-buffered):
 * every field of the configuration, so two tiles that differ in any field never share a pipeline.
 */
export function tileKey(tile: TileConfig): string {
  const db = tileBuffers(tile) === 2 ? "d" : "";
  const sk = tileSplit(tile) === 1 ? "" : `s${tileSplit(tile)}`;
  return `t${tile.wx}x${tile.wy}k${tile.bk}m${tileRows(tile)}n${tileCols(tile)}${db}${sk}`;
}

/** Whether `a` and `b` are the same configuration. */
export function sameTile(a: TileConfig, b: TileConfig): boolean {
  return a.wx === b.wx && a.wy === b.wy && a.bk === b.bk && tileRows(a) === tileRows(b) &&
    tileCols(a) === tileCols(b) && tileBuffers(a) === tileBuffers(b) &&
    tileSplit(a) === tileSplit(b);
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
  // 8 x 4 register blocks: 32 FMAs per three vec4 reads of workgroup memory instead of 16 per two.
  { wx: 16, wy: 8, bk: 16, tm: 8 },
  { wx: 16, wy: 16, bk: 16, tm: 8 },
  { wx: 16, wy: 16, bk: 32, tm: 8 },
  { wx: 32, wy: 8, bk: 32, tm: 8 },
  // Small tiles (16 x 32, 16 x 64 of Y): more workgroups where M is a decode batch and N is small.
  { wx: 8, wy: 4, bk: 16 },
  { wx: 16, wy: 4, bk: 16 },
  // 8 x 8 register blocks (128 x 128 and 128 x 64 tiles): 64 FMAs per four vec4 reads of
  // workgroup memory, the block size of fast CUDA SGEMMs, for long prefills.
  { wx: 16, wy: 16, bk: 16, tm: 8, tn: 8 },
  { wx: 8, wy: 16, bk: 16, tm: 8, tn: 8 },
  // Double-buffered staging (one barrier per K step, the next step's loads in flight during this
  // one's FMAs) for the shapes the H200 chose or ran fastest in isolation, 2026-11-27.
  { wx: 16, wy: 16, bk: 16, db: true },
  { wx: 32, wy: 8, bk: 16, db: true },
  { wx: 16, wy: 16, bk: 16, tm: 8, db: true },
  { wx: 16, wy: 4, bk: 16, db: true },
  { wx: 8, wy: 16, bk: 16, db: true },
  { wx: 8, wy: 16, bk: 16, tm: 8, tn: 8, db: true },
  // Split-K (kernels/matmul_split.ts): 2 to 8 workgroups per tile of Y along K, for grids of few
  // workgroups (the H200's batch-64 decode ran N = 1,024 projections as 16 workgroups of 64 x 64,
  // each walking K = 2,048-3,072 at 2.3-3.6 TFLOP/s; a 512-token prefill's 128 x 128 tiles give
  // them 32).
  { wx: 16, wy: 16, bk: 16, sk: 4 },
  { wx: 16, wy: 16, bk: 16, db: true, sk: 8 },
  { wx: 16, wy: 4, bk: 16, sk: 4 },
  { wx: 16, wy: 16, bk: 16, tm: 8, sk: 2 },
  { wx: 8, wy: 16, bk: 16, tm: 8, tn: 8, sk: 2 },
];

/**
 * Checks that `tile` is a valid `tiled` configuration.
 *
 * @throws {RangeError} when tm is not one of {@linkcode TILE_ROWS}, tn not one of
 * {@linkcode TILE_COLS}, sk not one of {@linkcode TILE_SPLITS}, bk % 4, (wx * wy) % bk or (tm * bk) % wx is not 0, wx * wy exceeds
 * 1024 invocations, or the staged tiles exceed {@linkcode TILE_MAX_BYTES}.
 */
export function checkTile(tile: TileConfig): void {
  const { wx, wy, bk } = tile;
  const tm = tileRows(tile);
  const ok = [wx, wy, bk].every((v) => Number.isInteger(v) && v > 0) &&
    (tile.db === undefined || typeof tile.db === "boolean") &&
    TILE_SPLITS.includes(tileSplit(tile)) &&
    TILE_ROWS.includes(tm) && TILE_COLS.includes(tileCols(tile)) && bk % 4 === 0 &&
    (wx * wy) % bk === 0 && (tm * bk) % wx === 0 && wx * wy <= 1024 &&
    tileBytes(tile) <= TILE_MAX_BYTES;
  if (!ok) {
    throw new RangeError(
      `Cannot use matmul tile ${tileName(tile)}: needs tm of ${TILE_ROWS.join(" or ")}, ` +
        `tn of ${TILE_COLS.join(" or ")}, sk of ${TILE_SPLITS.join(", ")}, ` +
        `bk % 4 == 0, (wx * wy) % bk == 0, (tm * bk) % wx == 0, wx * wy <= 1024 and at most ` +
        `${TILE_MAX_BYTES} bytes of staged tiles`,
    );
  }
}
