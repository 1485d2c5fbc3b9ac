/**
 * The `gpu` policy's matmul choices measured on one adapter (plain data), and the rules that turn
 * measurements into them: which `tiled` configuration runs prefill, and up to which M each call
 * site shape runs `gemv` rather than `tiled`. kernels/matmul_tuner.ts measures; the engine caches
 * the result per adapter (engine/kernel_tuning.ts); `Matmul` follows it
 * ({@linkcode Matmul.setTuning}).
 *
 * @module
 */

import { sameTile, type TileConfig, tileName } from "./matmul_tile.ts";
import {
  GEMV_ROW_BLOCKS,
  GEMV_STEPS,
  GEMV_TPRS,
  type GemvKind,
  gemvStepMisfit,
  ROW_BLOCKS,
  type WeightFormat,
  type XForm,
} from "./matmul_kernels.ts";

/**
 * A `tiled` configuration measured for small M: the decode batches (up to `maxRows` rows of X)
 * of call sites whose `gemv` range ends below them.
 */
export interface SmallTile {
  /** One of {@linkcode TILE_CANDIDATES}. */
  readonly tile: TileConfig;
  /** The largest M it runs (larger M runs {@linkcode MatmulTuning.tile}). */
  readonly maxRows: number;
}

/**
 * One call-site shape's own `tiled` configurations: the fastest at its prefill rows, at the
 * largest decode batch (`small`) and at the row counts between ({@linkcode middleRows}: `middle`).
 * M runs the first of `small`, `middle` (ascending) whose `maxRows` holds it, else `tile`; an
 * entry is left out where it would run the same tile as the next one up ({@linkcode shapeTileOf}).
 */
export interface ShapeTile {
  /** One of {@linkcode TILE_CANDIDATES}. */
  readonly tile: TileConfig;
  /**
   * The configuration of small M (up to `maxRows`), when the measured best there is another than
   * the next larger row count's.
   */
  readonly small?: SmallTile;
  /**
   * The configurations of M between the decode batch and the prefill rows, by ascending
   * `maxRows` (all above `small`'s), each where the measured best there is another than the next
   * larger row count's.
   */
  readonly middle?: readonly SmallTile[];
}

/**
 * The row counts between the largest decode batch and the prefill rows at which the tuning also
 * times the tiles: the powers of two strictly between them, the largest three at most. A tile
 * chosen at 512 rows may give a 128-row prefill a quarter of its workgroups, too few for a large
 * GPU: a shorter prompt would take as long as a 512-token one.
 */
export function middleRows(decodeRows: number, prefillRows: number): number[] {
  let m = 1;
  while (m * 2 < prefillRows) m *= 2; // the largest power of two below prefillRows
  const out: number[] = [];
  for (; m > decodeRows && out.length < 3; m /= 2) out.unshift(m);
  return out;
}

/**
 * A shape's {@linkcode ShapeTile} from the fastest tile at each measured row count: `tile` at the
 * prefill rows, `small` at the decode batch (when measured) and `middle` at the row counts
 * between, ascending. An entry whose tile is the one the next larger row count runs is left out
 * (the lookup then reaches that one with the same tile).
 */
export function shapeTileOf(
  tile: TileConfig,
  small: SmallTile | undefined,
  middle: readonly SmallTile[],
): ShapeTile {
  let next = tile;
  const kept: SmallTile[] = [];
  for (const t of [...(small === undefined ? [] : [small]), ...middle].reverse()) {
    if (sameTile(t.tile, next)) continue;
    kept.unshift(t);
    next = t.tile;
  }
  const keptSmall = kept[0] === small && small !== undefined ? small : undefined;
  const keptMiddle = keptSmall === undefined ? kept : kept.slice(1);
  return {
    tile,
    ...(keptSmall === undefined ? {} : { small: keptSmall }),
    ...(keptMiddle.length === 0 ? {} : { middle: keptMiddle }),
  };
}

/** Measured choices of the `gpu` policy's matmul kernels on one adapter. */
export interface MatmulTuning {
  /**
   * The `tiled` configuration (one of {@linkcode TILE_CANDIDATES}) of shapes not in
   * `shapeTiles`: the fastest over all measured shapes (weighted by call sites).
   */
  readonly tile: TileConfig;
  /** The `tiled` configuration of small M, when the measured best there is another. */
  readonly smallTile?: SmallTile;
  /**
   * Per call-site shape ({@linkcode shapeKey}): its own `tiled` configurations; shapes not
   * listed run `tile` and `smallTile`.
   */
  readonly shapeTiles?: Readonly<Record<string, ShapeTile>>;
  /**
   * Per call-site shape ({@linkcode shapeKey}): the largest M run by `gemv` (larger M runs
   * `tiled`; 0: `tiled` for every M). Shapes not listed follow `Matmul.decodeMaxRows`.
   */
  readonly gemvMaxRows: Readonly<Record<string, number>>;
  /**
   * Per call-site shape: weight rows per `gemv` invocation (one of `GEMV_ROW_BLOCKS`); shapes
   * not listed use 1.
   */
  readonly gemvRows?: Readonly<Record<string, number>>;
  /**
   * Per call-site shape: weights per `gemv` invocation per step (one of `GEMV_STEPS`); shapes
   * not listed use 4.
   */
  readonly gemvSteps?: Readonly<Record<string, number>>;
  /**
   * Per call-site shape: invocations per weight row of `gemv` with steps of 4 or 8 (one of
   * `GEMV_TPRS`); shapes not listed use 64.
   */
  readonly gemvTprs?: Readonly<Record<string, number>>;
  /**
   * Per call-site shape: the most rows of X one `gemv` workgroup takes (one of `ROW_BLOCKS`;
   * more rows run in grid z, each workgroup reading the weights again); shapes not listed take
   * up to 8.
   */
  readonly gemvXRows?: Readonly<Record<string, number>>;
}

/** What identifies a call site's kernel choice: weight format and shape, X form, bias. */
export interface MatmulShape {
  readonly format: WeightFormat;
  /** N, the weight's rows (all parts). */
  readonly rows: number;
  /** K, the weight's columns. */
  readonly cols: number;
  readonly xForm: XForm;
  readonly bias: boolean;
}

/** The key of `s` in {@linkcode MatmulTuning.gemvMaxRows}, e.g. `"f16 1024x3072 swiglu"`. */
export function shapeKey(s: MatmulShape): string {
  return `${s.format} ${s.rows}x${s.cols} ${s.xForm}${s.bias ? " bias" : ""}`;
}

/** One row count's median times of the two kernels on one shape, in milliseconds. */
export interface CrossoverPoint {
  readonly m: number;
  /** The time of the `gemv` kernel chosen for the shape. */
  readonly gemvMs: number;
  readonly tiledMs: number;
  /** Each measured `gemv` ({@linkcode gemvKindKey} -> ms), when several were. */
  readonly gemvByKind?: Readonly<Record<string, number>>;
}

/**
 * The `gemv` kernels the tuning tries on a weight of row stride `rowStride` and `format`: every
 * weight rows per invocation with steps of 4, then with steps of 8 where the stride is a
 * multiple of 8, each with 64 and then 32 invocations per row, then, for int8 / int4 weights,
 * with steps of 32 (a whole group, their own invocations per row).
 */
export function gemvKinds(rowStride: number, format: WeightFormat = "f16"): GemvKind[] {
  return GEMV_STEPS.filter((step) => gemvStepMisfit(step, format, rowStride) === null)
    .flatMap((step) =>
      GEMV_ROW_BLOCKS.flatMap((rows): GemvKind[] =>
        step === 32 ? [{ rows, step }] : GEMV_TPRS.map((tpr) => ({ rows, step, tpr }))
      )
    );
}

/** The most rows of X one `gemv` workgroup takes without tuning (the largest `ROW_BLOCKS`). */
export const MAX_X_ROWS: number = ROW_BLOCKS[ROW_BLOCKS.length - 1]!;

/** A `gemv` kernel and the most rows of X one of its workgroups takes (one of `ROW_BLOCKS`). */
export interface GemvCandidate extends GemvKind {
  readonly xRows: number;
}

/**
 * The rows of X per `gemv` workgroup for `m` rows under a cap of `xRows`: the smallest compiled
 * block that holds `m` (at most 8), no more than the cap; `m` above it runs in grid z.
 */
export function effectiveXRows(m: number, xRows: number = MAX_X_ROWS): number {
  return Math.min(ROW_BLOCKS.find((b) => b >= m) ?? MAX_X_ROWS, xRows);
}

/**
 * What the tuning times per shape: each of {@linkcode gemvKinds} under each X rows cap, 8 first
 * (so that a tie, where no cap binds, keeps the untuned one).
 */
export function gemvCandidates(rowStride: number, format: WeightFormat = "f16"): GemvCandidate[] {
  const caps = [...ROW_BLOCKS].reverse();
  return gemvKinds(rowStride, format).flatMap((k) => caps.map((xRows) => ({ ...k, xRows })));
}

/** A `gemv` candidate's name in reports, e.g. "rb4 ks8 xr2". */
export function gemvCandidateKey(k: GemvCandidate): string {
  return `${gemvKindKey(k)} xr${k.xRows}`;
}

/** A `gemv` kernel's name in reports, e.g. "rb4 ks8" or "rb4 ks8 tpr32". */
export function gemvKindKey(k: GemvKind): string {
  return `rb${k.rows} ks${k.step}${(k.tpr ?? 64) === 64 ? "" : ` tpr${k.tpr}`}`;
}

/**
 * The largest measured M up to which `gemv` was at least as fast as `tiled` at every measured M
 * (0 when `tiled` was faster at the smallest). Above it the kernels are not assumed to alternate:
 * the first M where `tiled` wins ends `gemv`'s range.
 */
export function crossover(points: readonly CrossoverPoint[]): number {
  let last = 0;
  for (const p of [...points].sort((a, b) => a.m - b.m)) {
    if (p.gemvMs > p.tiledMs) break;
    last = p.m;
  }
  return last;
}

/**
 * The index of the `gemv` kernel (of those measured, `ms[i]` for kernel i) with the least total
 * time over the row counts where some `gemv` was at least as fast as `tiled` (all of them when
 * none was); ties go to the earlier.
 */
export function pickGemv(
  rows: readonly { readonly ms: readonly number[]; readonly tiledMs: number }[],
): number {
  const useful = rows.filter((r) => Math.min(...r.ms) <= r.tiledMs);
  const set = useful.length > 0 ? useful : rows;
  let best = 0;
  let bestMs = Infinity;
  (rows[0]?.ms ?? []).forEach((_, i) => {
    const total = set.reduce((sum, r) => sum + r.ms[i]!, 0);
    if (total < bestMs) {
      best = i;
      bestMs = total;
    }
  });
  return best;
}

/** 1, 2, 4, ... up to `maxBatch`, then `maxBatch` and `prefillRows` (at most `prefillRows`). */
export function rowCounts(maxBatch: number, prefillRows: number): number[] {
  const out = new Set<number>();
  for (let m = 1; m < maxBatch; m *= 2) out.add(m);
  out.add(maxBatch);
  out.add(prefillRows);
  return [...out].filter((m) => m <= prefillRows).sort((a, b) => a - b);
}

/** One pass over the tile candidates in {@linkcode tileRounds}. */
export interface TileRound {
  /** Candidate indices in the order they are timed. */
  readonly order: readonly number[];
  /** Whether this pass's times count (the first pass's do not). */
  readonly kept: boolean;
}

/**
 * The passes that time `n` tile candidates: a first pass, forward, whose times are discarded (it
 * compiles each candidate right before timing it, on a GPU left idle while the shader compiled;
 * on an NVIDIA H200, 2026-11-27, three start-ups chose three different tiles, none the fastest in
 * isolation, e.g. a decode tile 1.4x slower there than the best), then `rounds` passes (an even
 * number) alternately backward and forward. A candidate's time is the mean of its kept passes, in
 * which the positions of every candidate add up to the same total, so a steady drift of the
 * clocks weighs on each alike.
 */
export function tileRounds(n: number, rounds = 2): TileRound[] {
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`Cannot time ${n} tile candidates`);
  if (!Number.isInteger(rounds) || rounds < 2 || rounds % 2 !== 0) {
    throw new RangeError(`Cannot time tiles in ${rounds} rounds: an even number from 2 is needed`);
  }
  const forward = Array.from({ length: n }, (_, i) => i);
  const backward = [...forward].reverse();
  return [
    { order: forward, kept: false },
    ...Array.from({ length: rounds }, (_, r) => ({
      order: r % 2 === 0 ? backward : forward,
      kept: true,
    })),
  ];
}

/**
 * The tile with the least total time, given each candidate's time per shape and each shape's
 * number of call sites (`weights`, default 1). Ties go to the earlier candidate.
 */
export function pickTile(
  times: ReadonlyMap<TileConfig, readonly number[]>,
  weights?: readonly number[],
): TileConfig {
  let best: TileConfig | undefined;
  let bestMs = Infinity;
  for (const [tile, ms] of times) {
    const total = ms.reduce((sum, t, i) => sum + t * (weights?.[i] ?? 1), 0);
    if (total < bestMs) {
      best = tile;
      bestMs = total;
    }
  }
  if (best === undefined) throw new RangeError("Cannot pick a tile: no candidate was measured");
  return best;
}

/**
 * One line describing `t`, e.g. "tile 16x16 bk16 (8x4 bk16 up to M = 64); gemv up to M = 64 for
 * f16 1024x3072 swiglu; tiles per shape: 16x16 bk16 sk4 (16x4 bk16 sk4 up to M = 64, 32x8 bk32
 * up to M = 256) for f16 1024x3072 swiglu".
 */
export function describeTuning(t: MatmulTuning): string {
  const rows = Object.entries(t.gemvMaxRows).map(([k, m]) => {
    const rb = t.gemvRows?.[k] ?? 1;
    const step = t.gemvSteps?.[k] ?? 4;
    const xRows = t.gemvXRows?.[k] ?? 8;
    const tpr = t.gemvTprs?.[k] ?? 64;
    const kind = [
      rb > 1 ? `${rb} rows each` : "",
      step > 4 ? `steps of ${step}` : "",
      tpr !== 64 ? `${tpr} invocations a row` : "",
      xRows < 8 ? `${xRows} X row${xRows > 1 ? "s" : ""} per workgroup` : "",
    ].filter((s) => s !== "").join(", ");
    return `${m}${kind === "" ? "" : ` (${kind})`} for ${k}`;
  });
  const tiles = (tile: TileConfig, small?: SmallTile, middle: readonly SmallTile[] = []) => {
    const below = [...(small === undefined ? [] : [small]), ...middle]
      .map((b) => `${tileName(b.tile)} up to M = ${b.maxRows}`);
    return `${tileName(tile)}${below.length === 0 ? "" : ` (${below.join(", ")})`}`;
  };
  const shapes = Object.entries(t.shapeTiles ?? {}).map(([k, s]) =>
    `${tiles(s.tile, s.small, s.middle)} for ${k}`
  );
  return `tile ${tiles(t.tile, t.smallTile)}; gemv up to M = ${
    rows.length > 0 ? rows.join(", ") : "(no shape)"
  }${shapes.length > 0 ? `; tiles per shape: ${shapes.join(", ")}` : ""}`;
}
