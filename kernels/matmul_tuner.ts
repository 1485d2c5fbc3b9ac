/**
 * Measures the `gpu` policy's matmul choices on this adapter, on a model's own call sites (their
 * weights and buffers, so every shape, weight format, X form and bias is the one that will run):
 * 1. the `tiled` configuration: each of {@linkcode TILE_CANDIDATES} times every call-site
 *    shape at the prefill row count; the least total (each shape weighted by its call sites)
 *    wins;
 * 2. the `tiled` configuration of decode batches: the same at the largest decode batch (where a
 *    prefill tile may leave most of a GPU idle: 16 workgroups for N = 1,024 at M = 64 with 64 x 64
 *    tiles); when another tile wins there, it runs every M up to that batch
 *    ({@linkcode SmallTile});
 * 3. per shape, its own tiles ({@linkcode ShapeTile}): from the same measurements, the fastest
 *    at its prefill rows and, when another, at the decode batch; and the fastest at the row
 *    counts between ({@linkcode middleRows}: 128 and 256 between a batch of 64 and 512 rows),
 *    timed for that (a tile chosen at 512 rows may give a 128-token prefill a quarter of its
 *    workgroups: on a large GPU, as long as 512 tokens); 1 and 2 remain for shapes bound later;
 * 4. per shape, `gemv` (with 1 and 4 weight rows per invocation, each with steps of 4 and, where
 *    the row stride allows, 8 weights at 64 and 32 invocations a row, and for int8 / int4
 *    weights steps of 32, each taking at most 8, 4, 2 or 1 rows of X per workgroup:
 *    {@linkcode gemvCandidates}) against `tiled` (the tile that
 *    runs that M) at row counts 1, 2, 4, ... up to the largest decode batch and the prefill row
 *    count; the shape's `gemv` is the one with the least total time ({@linkcode pickGemv}),
 *    and it runs up to the last M before the first where `tiled` was faster
 *    ({@linkcode crossover}).
 *
 * Each time is the median of several passes timed on the GPU (`timestamp-query`; else the host
 * clock over several passes), gpu/timer.ts; the candidates of one shape and row count (a round's
 * tiles; the `gemv` kernels and the tile at one M) are timed in one submission and one wait
 * (`PassClock.medianMsEach`), each with call sites of its own. Each pass runs the next of the
 * shape's call sites in turn (up to {@linkcode MAX_ROTATED_SITES}, on through the candidates
 * of a submission), so a pass reads weights that the passes just before it did not, as a model
 * step does (28 layers apart): timed on one call site, a projection's weights stay in a GPU's L2
 * from one pass to the next (50 MB on an H200: every Qwen3-0.6B projection) and every candidate
 * looks as fast as a cache allows. Nothing is timed right after its
 * compile: the tiles go through a discarded first pass, then passes backward and forward
 * ({@linkcode tileRounds}); each shape's `gemv` kernels run once before their row counts are
 * timed. The call sites'
 * outputs are overwritten (run it before serving). The result is plain data
 * ({@linkcode MatmulTuning}) for {@linkcode Matmul.setTuning} and a cache
 * (engine/kernel_tuning.ts).
 *
 * @module
 */

import type { GpuContext } from "../gpu/context.ts";
import { ParamArena } from "../gpu/params.ts";
import { PassClock } from "../gpu/timer.ts";
import { Matmul, type MatmulOp } from "./matmul.ts";
import { DEFAULT_GEMV } from "./matmul_kernels.ts";
import { sameTile, TILE_CANDIDATES, type TileConfig } from "./matmul_tile.ts";
import { tileAt } from "./matmul_choice.ts";
import {
  crossover,
  type CrossoverPoint,
  effectiveXRows,
  type GemvCandidate,
  gemvCandidateKey,
  gemvCandidates,
  gemvKindKey,
  type MatmulTuning,
  MAX_X_ROWS,
  middleRows,
  pickGemv,
  pickTile,
  rowCounts,
  shapeKey,
  type ShapeTile,
  shapeTileOf,
  type SmallTile,
  tileRounds,
} from "./matmul_tuning.ts";

/**
 * Changes whenever what {@linkcode tuneMatmul} measures or chooses does, so that tunings cached
 * under an older one are measured again (engine/kernel_tuning_parts.ts puts it in the key).
 * 2 (2026-11-27): tiles timed in rounds after a discarded pass; the X rows per `gemv` workgroup.
 * 3 (2026-11-29): split-K tiles among the candidates; double-buffered tiles timed as themselves
 * (before, as their single-buffered twins: the pipeline key omitted `db`); tiles per shape; the
 * `gemv` at 32 invocations a row.
 * 4 (2026-11-29): each timed pass runs the next of the shape's call sites (their own weights), not
 * always the first.
 * 5 (2026-11-29): each shape's tiles also timed at the row counts between the decode batch and
 * the prefill rows (`ShapeTile.middle`).
 */
export const MATMUL_TUNER_REVISION = 5;

/**
 * The most call sites of one shape that the timed passes rotate over: enough that their weights
 * exceed a GPU's L2 for all but the smallest projections (32 sites of 2 MiB: 64 MiB).
 */
export const MAX_ROTATED_SITES = 32;

/** Options of {@linkcode tuneMatmul}. */
export interface MatmulTunerOptions {
  /** The largest decode batch (rows of X) the call sites run. */
  readonly maxBatch: number;
  /** Rows of X of the prefill the tile is chosen at (capped by each call site); default 512. */
  readonly prefillRows?: number;
  /** Timed passes per measurement; default 5. */
  readonly repeats?: number;
  /** The tile candidates; default {@linkcode TILE_CANDIDATES}. */
  readonly tiles?: readonly TileConfig[];
}

/** What {@linkcode tuneMatmul} measured and chose. */
export interface MatmulTuningReport {
  readonly tuning: MatmulTuning;
  /**
   * Each tile candidate's time summed over the shapes (weighted by call sites), in ms, at the
   * prefill row count (`totalMs`) and at the largest decode batch (`smallMs`; absent when that
   * batch reaches the prefill row count of every shape).
   */
  readonly tiles: readonly {
    readonly tile: TileConfig;
    readonly totalMs: number;
    readonly smallMs?: number;
  }[];
  /**
   * Per shape key: each tile candidate's time (in the order of `tiles`) at the shape's prefill
   * rows, at the largest decode batch and at the row counts between, in ms.
   */
  readonly shapes: Readonly<
    Record<string, {
      readonly tileMs: readonly number[];
      readonly smallMs?: readonly number[];
      /** The same at each row count between (`ShapeTile.middle`), ascending. */
      readonly middleMs?: readonly { readonly rows: number; readonly ms: readonly number[] }[];
      /** The call sites the timed passes rotated over. */
      readonly sites: number;
    }>
  >;
  /** Per shape key: the row counts measured for the `gemv` / `tiled` choice. */
  readonly crossovers: Readonly<Record<string, readonly CrossoverPoint[]>>;
  /** How the kernels were timed ("timestamp-query", "host clock / N passes"). */
  readonly method: string;
  /** The GPU errors of the candidates the adapter could not run (measured as Infinity). */
  readonly failures: readonly string[];
  /** Wall time of the whole measurement, in ms. */
  readonly wallMs: number;
}

/**
 * One call-site shape: a representative op, the matmul it belongs to, how many share it, and the
 * buffers of those the timed passes rotate over (the representative's first).
 */
interface ShapeGroup {
  readonly key: string;
  readonly op: MatmulOp;
  readonly matmul: Matmul;
  count: number;
  readonly sites: MatmulOp["buffers"][];
}

/**
 * Measures the tile and the per-shape `gemv` row limits on the call sites bound to `matmuls`
 * (see the module documentation).
 *
 * @throws {RangeError} when a matmul does not follow the `gpu` policy, none has a call site, or
 *   `maxBatch` is not a positive integer.
 */
export async function tuneMatmul(
  ctx: GpuContext,
  matmuls: readonly Matmul[],
  options: MatmulTunerOptions,
): Promise<MatmulTuningReport> {
  const t0 = performance.now();
  if (!Number.isInteger(options.maxBatch) || options.maxBatch < 1) {
    throw new RangeError(`Cannot tune matmul: maxBatch ${options.maxBatch} is not positive`);
  }
  const groups = shapeGroups(matmuls);
  const tiles = options.tiles ?? TILE_CANDIDATES;
  const kinds = groups.map((g) =>
    gemvCandidates(g.op.buffers.weight.rowStride, g.op.buffers.weight.format)
  );
  // Slots: per rotated call site, one op per (shape, tile) and per (shape, gemv kind), each with
  // one per weight part.
  const slots = groups.reduce(
    (n, g, j) =>
      n + g.sites.length * g.op.buffers.weight.parts.length * (tiles.length + kinds[j]!.length),
    0,
  );
  const arena = new ParamArena(ctx, slots + 1, "matmul-tuning");
  const clock = new PassClock(ctx, arena, options.repeats);
  try {
    // One trial matmul per (matmul, tile): the rotated call sites re-bound with that tile.
    // Candidates timed together (PassClock.medianMsEach) must not share parameter slots, so each
    // gemv kind of a shape gets call sites of its own too.
    const trials = new Map<string, { matmul: Matmul; ops: MatmulOp[] }>();
    const trialOf = (g: ShapeGroup, tile: TileConfig) => {
      const id = `${g.key}/${tiles.indexOf(tile)}`;
      let t = trials.get(id);
      if (t === undefined) {
        const { dtype, bias, policy } = g.matmul;
        const matmul = new Matmul(ctx, { dtype, bias, policy, tile });
        t = { matmul, ops: g.sites.map((buffers) => matmul.bind(arena, buffers)) };
        trials.set(id, t);
      }
      return t;
    };
    const trial = (g: ShapeGroup, tile: TileConfig): MatmulOp[] => trialOf(g, tile).ops;
    const gemvOps = new Map<string, MatmulOp[]>();
    const gemvOp = (g: ShapeGroup, kind: GemvCandidate, tile: TileConfig): MatmulOp[] => {
      const id = `${g.key}/${gemvCandidateKey(kind)}`;
      let ops = gemvOps.get(id);
      if (ops === undefined) {
        const { matmul } = trialOf(g, tile);
        ops = g.sites.map((buffers) => matmul.bind(arena, buffers));
        gemvOps.set(id, ops);
      }
      return ops;
    };
    const turns = new SiteTurns();
    /** One candidate: its call sites (made, and its kernels compiled, in the clock's scopes). */
    const run = (
      g: ShapeGroup,
      op: () => MatmulOp[],
      m: number,
      variant: "gemv" | "tiled",
      gemv: GemvCandidate = { ...DEFAULT_GEMV, xRows: MAX_X_ROWS },
    ) =>
    () => {
      const ops = op();
      return (pass: GPUComputePassEncoder) =>
        turns.next(g.key, ops).encode(pass, m, {
          variant,
          gemvRows: gemv.rows,
          gemvStep: gemv.step,
          gemvTpr: gemv.tpr ?? 64,
          gemvXRows: gemv.xRows,
        });
    };
    const prefill = (g: ShapeGroup) => Math.min(options.prefillRows ?? 512, g.op.maxRows);
    // Each tile's time per shape: the mean of its kept passes (tileRounds: a discarded first
    // pass that compiles, then passes backward and forward), a shape's tiles of one pass timed
    // together.
    // A shape whose `rows` is null is left out (its times read 0).
    const timeTiles = async (rows: (g: ShapeGroup) => number | null) => {
      const sums = tiles.map(() => groups.map(() => 0));
      const rounds = tileRounds(tiles.length);
      const keptRounds = rounds.filter((r) => r.kept).length;
      for (const round of rounds) {
        for (const [j, g] of groups.entries()) {
          const m = rows(g);
          if (m === null) continue;
          const ms = await clock.medianMsEach(
            round.order.map((i) => run(g, () => trial(g, tiles[i]!), m, "tiled")),
          );
          if (round.kept) round.order.forEach((i, k) => sums[i]![j]! += ms[k]!);
        }
      }
      return new Map(tiles.map((tile, i) => [tile, sums[i]!.map((ms) => ms / keptRounds)]));
    };
    const counts = groups.map((g) => g.count);
    const tileTimes = await timeTiles(prefill);
    const tile = pickTile(tileTimes, counts);
    const decodeRows = options.maxBatch;
    const smallTimes = groups.some((g) => decodeRows < prefill(g))
      ? await timeTiles((g) => Math.min(decodeRows, prefill(g)))
      : undefined;
    const small = smallTimes === undefined ? tile : pickTile(smallTimes, counts);
    const smallTile: SmallTile | undefined = sameTile(small, tile)
      ? undefined
      : { tile: small, maxRows: decodeRows };
    // The row counts between the decode batch and each shape's prefill rows, timed for that
    // shape's own tiles only.
    const middleOf = (g: ShapeGroup) => middleRows(decodeRows, prefill(g));
    const middleTimes = new Map<number, ReadonlyMap<TileConfig, readonly number[]>>();
    for (const r of [...new Set(groups.flatMap(middleOf))].sort((a, b) => a - b)) {
      middleTimes.set(r, await timeTiles((g) => middleOf(g).includes(r) ? r : null));
    }
    // Each shape's own tiles, from the same measurements: the fastest at its prefill rows and,
    // when another, at the decode batch and at the row counts between.
    const shapeBest = (times: ReadonlyMap<TileConfig, readonly number[]>, j: number) =>
      pickTile(new Map([...times].map(([t, ms]) => [t, [ms[j]!]])));
    const shapeTiles: Record<string, ShapeTile> = {};
    for (const [j, g] of groups.entries()) {
      const own = shapeBest(tileTimes, j);
      const ownSmall = smallTimes === undefined
        ? undefined
        : { tile: shapeBest(smallTimes, j), maxRows: decodeRows };
      const middle = middleOf(g).map((r) => ({
        tile: shapeBest(middleTimes.get(r)!, j),
        maxRows: r,
      }));
      shapeTiles[g.key] = shapeTileOf(own, ownSmall, middle);
    }
    // The tiles chosen so far, as the tuned call sites will look them up (matmul_choice.ts).
    const tiled: MatmulTuning = { tile, smallTile, shapeTiles, gemvMaxRows: {} };
    const crossovers: Record<string, CrossoverPoint[]> = {};
    const gemvMaxRows: Record<string, number> = {};
    const gemvRows: Record<string, number> = {};
    const gemvSteps: Record<string, number> = {};
    const gemvTprs: Record<string, number> = {};
    const gemvXRows: Record<string, number> = {};
    for (const [j, g] of groups.entries()) {
      const own = kinds[j]!;
      const rows: { m: number; ms: number[]; tiledMs: number }[] = [];
      const op = (kind: GemvCandidate) => () => gemvOp(g, kind, tile);
      // Each kernel once, untimed in effect: it compiles there, so the times kept below follow a
      // busy GPU rather than a compile (see tileRounds).
      await clock.medianMsEach(
        own.map((kind) => run(g, op(kind), Math.min(kind.xRows, g.op.maxRows), "gemv", kind)),
      );
      for (const m of rowCounts(options.maxBatch, prefill(g))) {
        // Candidates whose X rows cap does not bind at this M run the same kernel: timed once.
        const key = (kind: GemvCandidate) =>
          `${gemvKindKey(kind)} mb${effectiveXRows(m, kind.xRows)}`;
        const distinct = [...new Map(own.map((kind) => [key(kind), kind])).values()];
        const t = tileAt(tiled, m, g.op.shape);
        // The distinct kernels, then the tile that runs this M, timed together.
        const times = await clock.medianMsEach([
          ...distinct.map((kind) => run(g, op(kind), m, "gemv", kind)),
          run(g, () => trial(g, t), m, "tiled"),
        ]);
        const byKey = new Map(distinct.map((kind, i) => [key(kind), times[i]!]));
        const r = { m, ms: own.map((kind) => byKey.get(key(kind))!), tiledMs: times.at(-1)! };
        rows.push(r);
        if (Math.min(...r.ms) > r.tiledMs) break;
      }
      const best = pickGemv(rows);
      const points = rows.map((r) => ({
        m: r.m,
        gemvMs: r.ms[best]!,
        tiledMs: r.tiledMs,
        gemvByKind: Object.fromEntries(own.map((k, i) => [gemvCandidateKey(k), r.ms[i]!])),
      }));
      crossovers[g.key] = points;
      gemvMaxRows[g.key] = crossover(points);
      gemvRows[g.key] = own[best]!.rows;
      gemvSteps[g.key] = own[best]!.step;
      gemvTprs[g.key] = own[best]!.tpr ?? 64;
      gemvXRows[g.key] = own[best]!.xRows;
    }
    ctx.check();
    const total = (ms: readonly number[]) => ms.reduce((s, t, i) => s + t * counts[i]!, 0);
    return {
      tuning: {
        tile,
        ...(smallTile === undefined ? {} : { smallTile }),
        shapeTiles,
        gemvMaxRows,
        gemvRows,
        gemvSteps,
        gemvTprs,
        gemvXRows,
      },
      tiles: tiles.map((t) => ({
        tile: t,
        totalMs: total(tileTimes.get(t)!),
        ...(smallTimes === undefined ? {} : { smallMs: total(smallTimes.get(t)!) }),
      })),
      shapes: Object.fromEntries(groups.map((g, j) => [g.key, {
        tileMs: tiles.map((t) => tileTimes.get(t)![j]!),
        ...(smallTimes === undefined ? {} : { smallMs: tiles.map((t) => smallTimes.get(t)![j]!) }),
        ...(middleOf(g).length === 0 ? {} : {
          middleMs: middleOf(g).map((rows) => ({
            rows,
            ms: tiles.map((t) => middleTimes.get(rows)!.get(t)![j]!),
          })),
        }),
        sites: g.sites.length,
      }])),
      crossovers,
      method: clock.method,
      failures: clock.failures,
      wallMs: performance.now() - t0,
    };
  } finally {
    arena.destroy();
  }
}

/**
 * Which call site each timed pass runs: per shape key, the next of the candidate's sites in
 * turn, the count going on from one candidate to the next (a candidate's first pass does not
 * re-read the weights the previous candidate's last pass read).
 */
export class SiteTurns {
  readonly #next = new Map<string, number>();

  /** The site of `key`'s next pass among `sites` (all candidates of a key have as many). */
  next<T>(key: string, sites: readonly T[]): T {
    const i = (this.#next.get(key) ?? 0) % sites.length;
    this.#next.set(key, i + 1);
    return sites[i]!;
  }
}

/** The call sites of `matmuls` grouped by shape key, in binding order. */
function shapeGroups(matmuls: readonly Matmul[]): ShapeGroup[] {
  const groups = new Map<string, ShapeGroup>();
  for (const matmul of matmuls) {
    if (matmul.policy !== "gpu") {
      throw new RangeError(
        `Cannot tune matmul: the ${matmul.policy} policy has no measured choices (gpu only)`,
      );
    }
    for (const op of matmul.ops) {
      const key = shapeKey(op.shape);
      const g = groups.get(key);
      if (g === undefined) groups.set(key, { key, op, matmul, count: 1, sites: [op.buffers] });
      else {
        g.count++;
        // Sites of one shape share the model's activation buffers; one with fewer rows of X
        // could not run every row count the representative's can.
        if (g.sites.length < MAX_ROTATED_SITES && op.maxRows === g.op.maxRows) {
          g.sites.push(op.buffers);
        }
      }
    }
  }
  if (groups.size === 0) throw new RangeError("Cannot tune matmul: no call site is bound");
  return [...groups.values()];
}
