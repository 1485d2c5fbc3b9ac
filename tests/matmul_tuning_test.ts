import {
  deepEqual as assertEqual,
  ok as assert,
  rejects as assertRejects,
  throws as assertThrows,
} from "node:assert/strict";
import { join } from "node:path";
import type { GpuContext } from "../gpu/context.ts";
import { roundTo } from "../gpu/dtype.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import {
  Matmul,
  type MatmulOp,
  type MatmulTuning,
  TILE,
  TILE_CANDIDATES,
} from "../kernels/matmul.ts";
import { sameTile, type TileConfig } from "../kernels/matmul_tile.ts";
import { tileAt } from "../kernels/matmul_choice.ts";
import { SiteTurns, tuneMatmul } from "../kernels/matmul_tuner.ts";
import {
  crossover,
  describeTuning,
  effectiveXRows,
  gemvCandidateKey,
  gemvCandidates,
  gemvKindKey,
  gemvKinds,
  middleRows,
  pickGemv,
  pickTile,
  rowCounts,
  shapeKey,
  shapeTileOf,
  tileRounds,
} from "../kernels/matmul_tuning.ts";
import { parseMatmulTuning } from "../kernels/matmul_tuning_parse.ts";
import {
  applyKernelTuning,
  cachedTunings,
  effectiveTuningMode,
  KERNEL_TUNING_ENV,
  kernelTuningCachePath,
  kernelTuningKey,
} from "../engine/kernel_tuning.ts";
import { assertClose, toleranceFor } from "./support/assert_close.ts";
import {
  GPU_TEST,
  ParamArena,
  poisonedF32,
  readF32,
  runPass,
  testContext,
  upload,
  whole,
} from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { matmulRef } from "./reference/matmul.ts";
import { ReferenceModel } from "./reference/model.ts";
import { referenceRun } from "./support/solo_run.ts";
import { LLMEngine } from "../engine/llm_engine.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import { makeModel } from "../tools/make_model.ts";

Deno.test("crossover() ends gemv's range at the first row count where tiled is faster", () => {
  const p = (m: number, gemvMs: number, tiledMs: number) => ({ m, gemvMs, tiledMs });
  assertEqual(crossover([p(1, 1, 2), p(2, 1, 2), p(4, 3, 2), p(8, 1, 2)]), 2);
  // Unsorted input is read in row order.
  assertEqual(crossover([p(8, 1, 2), p(1, 1, 2), p(4, 1, 2)]), 8);
  assertEqual(crossover([p(1, 5, 2), p(2, 1, 2)]), 0);
  assertEqual(crossover([p(16, 2, 2)]), 16, "a tie goes to gemv");
  assertEqual(crossover([]), 0);
});

Deno.test("pickTile() picks the least total time weighted by call sites, ties to the first", () => {
  const [a, b, c] = TILE_CANDIDATES;
  const times = new Map([[a!, [1, 10]], [b!, [2, 8]], [c!, [1, 10]]]);
  assertEqual(pickTile(times), b, "11 vs 10");
  assertEqual(pickTile(times, [10, 1]), a, "20 vs 28: a first among equals");
  assertThrows(() => pickTile(new Map()), RangeError);
});

Deno.test("tileRounds() discards a forward pass, then keeps passes in which every position adds up alike", () => {
  const r = tileRounds(4);
  assertEqual(r.map((x) => [x.order, x.kept]), [
    [[0, 1, 2, 3], false],
    [[3, 2, 1, 0], true],
    [[0, 1, 2, 3], true],
  ]);
  for (const [n, rounds] of [[1, 2], [5, 4], [15, 2], [16, 6]] as const) {
    const passes = tileRounds(n, rounds);
    assertEqual(passes.length, rounds + 1);
    assertEqual(passes[0]!.kept, false);
    // Each kept pass times every candidate once; a candidate's positions add up to the same sum.
    const sums = Array.from({ length: n }, () => 0);
    for (const p of passes.filter((p) => p.kept)) {
      assertEqual([...p.order].sort((a, b) => a - b), [...Array(n).keys()]);
      p.order.forEach((i, pos) => sums[i]! += pos);
    }
    assertEqual(new Set(sums).size, 1, `n ${n}, ${rounds} rounds: ${sums}`);
  }
  assertThrows(() => tileRounds(0), RangeError);
  assertThrows(() => tileRounds(3, 3), /an even number/);
});

Deno.test("parseMatmulTuning() accepts candidate tiles and row limits, refuses the rest", () => {
  const good = { tile: { ...TILE_CANDIDATES[1]! }, gemvMaxRows: { "f16 8x8 plain": 32 } };
  const t = parseMatmulTuning(JSON.parse(JSON.stringify(good)));
  assertEqual(t.tile, TILE_CANDIDATES[1]);
  assertEqual(t.gemvMaxRows, { "f16 8x8 plain": 32 });
  assertThrows(
    () => parseMatmulTuning({ tile: { wx: 4, wy: 4, bk: 4 }, gemvMaxRows: {} }),
    /tile \{"wx":4,"wy":4,"bk":4\} is not a candidate/,
  );
  assertThrows(() => parseMatmulTuning(null), TypeError);
  // A double-buffered candidate reads back as itself, not as its single-buffered twin.
  const db = TILE_CANDIDATES.find((c) => c.db === true && sameTile({ ...c, db: false }, TILE))!;
  assertEqual(
    parseMatmulTuning(JSON.parse(JSON.stringify({ tile: db, gemvMaxRows: {} }))).tile,
    db,
  );
  assertEqual(parseMatmulTuning({ tile: { ...TILE }, gemvMaxRows: {} }).tile, TILE);
  assert(describeTuning({ tile: db, gemvMaxRows: {} }).startsWith("tile 16x16 bk16 db;"));
  assertThrows(() => parseMatmulTuning({ tile: TILE, gemvMaxRows: [] }), /must be an object/);
  assertThrows(
    () => parseMatmulTuning({ tile: TILE, gemvMaxRows: { a: -1 } }),
    /gemvMaxRows\["a"\] must be a non-negative integer, got -1/,
  );
  assertThrows(() => parseMatmulTuning({ tile: TILE, gemvMaxRows: { a: 1.5 } }), TypeError);
  assertThrows(
    () => parseMatmulTuning({ tile: TILE, gemvMaxRows: {}, gemvRows: { a: 3 } }),
    /gemvRows\["a"\] must be one of 1, 4, got 3/,
  );
  assertEqual(parseMatmulTuning({ tile: TILE, gemvMaxRows: {}, gemvRows: { a: 4 } }).gemvRows, {
    a: 4,
  });
  const steps = parseMatmulTuning({ tile: TILE, gemvMaxRows: { a: 8 }, gemvSteps: { a: 8 } });
  assertEqual(steps.gemvSteps, { a: 8 });
  assert(describeTuning(steps).includes("8 (steps of 8) for a"));
  assertThrows(
    () => parseMatmulTuning({ tile: TILE, gemvMaxRows: {}, gemvSteps: { a: 16 } }),
    /gemvSteps\["a"\] must be one of 4, 8, 32, got 16/,
  );
  const xRows = parseMatmulTuning({
    tile: TILE,
    gemvMaxRows: { a: 64 },
    gemvRows: { a: 4 },
    gemvXRows: { a: 2 },
  });
  assertEqual(xRows.gemvXRows, { a: 2 });
  assert(describeTuning(xRows).includes("64 (4 rows each, 2 X rows per workgroup) for a"));
  const tprs = parseMatmulTuning({ tile: TILE, gemvMaxRows: { a: 8 }, gemvTprs: { a: 32 } });
  assertEqual(tprs.gemvTprs, { a: 32 });
  assert(describeTuning(tprs).includes("8 (32 invocations a row) for a"));
  assertThrows(
    () => parseMatmulTuning({ tile: TILE, gemvMaxRows: {}, gemvTprs: { a: 16 } }),
    /gemvTprs\["a"\] must be one of 64, 32, got 16/,
  );
  assertThrows(
    () => parseMatmulTuning({ tile: TILE, gemvMaxRows: {}, gemvXRows: { a: 3 } }),
    /gemvXRows\["a"\] must be one of 1, 2, 4, 8, got 3/,
  );
  assert(describeTuning(t).includes("32 for f16 8x8 plain"));
  // An 8 x 4 block tile and a small-M tile.
  const tm8 = TILE_CANDIDATES.find((c) => c.tm === 8)!;
  const small = parseMatmulTuning(
    JSON.parse(
      JSON.stringify({ tile: tm8, smallTile: { tile: TILE, maxRows: 64 }, gemvMaxRows: {} }),
    ),
  );
  assertEqual([small.tile, small.smallTile], [tm8, { tile: TILE, maxRows: 64 }]);
  assert(describeTuning(small).startsWith("tile 16x8 bk16 tm8 (16x16 bk16 up to M = 64); "));
  assertThrows(
    () => parseMatmulTuning({ tile: { ...TILE, tm: 2 }, gemvMaxRows: {} }),
    /is not a candidate/,
  );
  assertThrows(
    () => parseMatmulTuning({ tile: TILE, smallTile: { tile: TILE, maxRows: 0 }, gemvMaxRows: {} }),
    /smallTile.maxRows must be a positive integer, got 0/,
  );
  assertThrows(
    () => parseMatmulTuning({ tile: TILE, smallTile: { maxRows: 8 }, gemvMaxRows: {} }),
    /tile undefined is not a candidate/,
  );
  // Tiles per shape, with and without a small-M tile of their own.
  const split = TILE_CANDIDATES.find((c) => c.sk === 4 && c.wy === 16)!;
  const perShape = {
    tile: TILE,
    shapeTiles: { a: { tile: split, small: { tile: tm8, maxRows: 64 } }, b: { tile: tm8 } },
    gemvMaxRows: {},
  };
  const own = parseMatmulTuning(JSON.parse(JSON.stringify(perShape)));
  assertEqual(own.shapeTiles, perShape.shapeTiles);
  assert(
    describeTuning(own).endsWith(
      "; tiles per shape: 16x16 bk16 sk4 (16x8 bk16 tm8 up to M = 64) for a, 16x8 bk16 tm8 for b",
    ),
  );
  assertEqual(parseMatmulTuning({ tile: TILE, gemvMaxRows: {} }).shapeTiles, undefined);
  assertThrows(
    () => parseMatmulTuning({ tile: TILE, shapeTiles: [], gemvMaxRows: {} }),
    /shapeTiles must be an object/,
  );
  assertThrows(
    () =>
      parseMatmulTuning({
        tile: TILE,
        shapeTiles: { a: { tile: { ...split, sk: 3 } } },
        gemvMaxRows: {},
      }),
    /is not a candidate/,
  );
  assertThrows(
    () =>
      parseMatmulTuning({
        tile: TILE,
        shapeTiles: { a: { tile: TILE, small: { tile: TILE, maxRows: -2 } } },
        gemvMaxRows: {},
      }),
    /shapeTiles\["a"\].small.maxRows must be a positive integer, got -2/,
  );
  // Middle tiles: ascending, above the small-M tile's rows.
  const middle = {
    tile: TILE,
    shapeTiles: {
      a: {
        tile: split,
        small: { tile: tm8, maxRows: 64 },
        middle: [{ tile: TILE, maxRows: 128 }, { tile: tm8, maxRows: 256 }],
      },
    },
    gemvMaxRows: {},
  };
  const mid = parseMatmulTuning(JSON.parse(JSON.stringify(middle)));
  assertEqual(mid.shapeTiles, middle.shapeTiles);
  assert(
    describeTuning(mid).endsWith(
      "; tiles per shape: 16x16 bk16 sk4 (16x8 bk16 tm8 up to M = 64, 16x16 bk16 up to M = 128, " +
        "16x8 bk16 tm8 up to M = 256) for a",
    ),
  );
  const withMiddle = (m: unknown, small?: unknown) => () =>
    parseMatmulTuning({
      tile: TILE,
      shapeTiles: { a: { tile: TILE, ...(small === undefined ? {} : { small }), middle: m } },
      gemvMaxRows: {},
    });
  assertThrows(withMiddle({}), /shapeTiles\["a"\].middle must be an array/);
  assertThrows(
    withMiddle([{ tile: TILE, maxRows: 64 }], { tile: tm8, maxRows: 64 }),
    /shapeTiles\["a"\].middle\[0\].maxRows 64 must exceed 64/,
  );
  assertThrows(
    withMiddle([{ tile: TILE, maxRows: 256 }, { tile: tm8, maxRows: 128 }]),
    /middle\[1\].maxRows 128 must exceed 256/,
  );
  assertThrows(withMiddle([{ tile: { wx: 1 }, maxRows: 128 }]), /is not a candidate/);
});

Deno.test("pickGemv() takes the least total over the row counts where gemv was useful", () => {
  const r = (ms: number[], tiledMs: number) => ({ ms, tiledMs });
  assertEqual(pickGemv([r([1, 2], 5), r([2, 1], 5)]), 0, "3 against 3: the first");
  assertEqual(pickGemv([r([2, 1], 5), r([3, 2], 5)]), 1);
  // Past the crossover (tiled faster than every gemv) the times do not count.
  assertEqual(pickGemv([r([2, 1, 3], 5), r([90, 99, 7], 6)]), 1);
  assertEqual(pickGemv([r([9, 8], 5)]), 1, "no useful row: all of them");
});

Deno.test("gemvKinds() tries steps of 8 only where the weight row stride allows them", () => {
  const vec4 = ["rb1 ks4", "rb1 ks4 tpr32", "rb4 ks4", "rb4 ks4 tpr32"];
  assertEqual(gemvKinds(12).map(gemvKindKey), vec4);
  assertEqual(
    gemvKinds(16).map(gemvKindKey),
    [...vec4, "rb1 ks8", "rb1 ks8 tpr32", "rb4 ks8", "rb4 ks8 tpr32"],
  );
  assertEqual(gemvKinds(16, "f32").map(gemvKindKey), gemvKinds(16).map(gemvKindKey));
});

Deno.test("gemvKinds() tries steps of a whole group only when weights are int8 / int4", () => {
  // 64 and 32 invocations a row with steps of 4 and 8; steps of 32 run their own.
  const quantized = [
    "rb1 ks4",
    "rb1 ks4 tpr32",
    "rb4 ks4",
    "rb4 ks4 tpr32",
    "rb1 ks8",
    "rb1 ks8 tpr32",
    "rb4 ks8",
    "rb4 ks8 tpr32",
    "rb1 ks32",
    "rb4 ks32",
  ];
  assertEqual(gemvKinds(64, "int4").map(gemvKindKey), quantized);
  assertEqual(gemvKinds(64, "int8").map(gemvKindKey), quantized);
  assertEqual(gemvKinds(64, "f16").map(gemvKindKey).includes("rb1 ks32"), false);
});

Deno.test("rowCounts() doubles up to the decode batch, then adds it and the prefill rows", () => {
  assertEqual(rowCounts(64, 512), [1, 2, 4, 8, 16, 32, 64, 512]);
  assertEqual(rowCounts(48, 40), [1, 2, 4, 8, 16, 32, 40]);
  assertEqual(rowCounts(1, 1), [1]);
  assertEqual(rowCounts(6, 100), [1, 2, 4, 6, 100]);
});

Deno.test("middleRows() gives the powers of two between the decode batch and the prefill rows, three at most", () => {
  assertEqual(middleRows(64, 512), [128, 256]);
  assertEqual(middleRows(8, 512), [64, 128, 256]);
  assertEqual(middleRows(1, 2048), [256, 512, 1024]);
  assertEqual(middleRows(4, 24), [8, 16]);
  assertEqual(middleRows(64, 300), [128, 256]);
  assertEqual(middleRows(256, 512), []);
  assertEqual(middleRows(64, 128), [], "128 is the prefill rows themselves");
  assertEqual(middleRows(64, 64), []);
  assertEqual(middleRows(1, 1), []);
});

Deno.test("shapeTileOf() keeps a row count's tile only where the next larger one runs another", () => {
  const [a, b, c] = TILE_CANDIDATES as unknown as [TileConfig, TileConfig, TileConfig];
  const at = (tile: TileConfig, maxRows: number) => ({ tile, maxRows });
  // All the same: the prefill tile alone.
  assertEqual(shapeTileOf(a, at(a, 64), [at(a, 128), at(a, 256)]), { tile: a });
  // Small differs from the middle tile above it, which is the prefill one.
  assertEqual(shapeTileOf(a, at(b, 64), [at(a, 128), at(a, 256)]), { tile: a, small: at(b, 64) });
  // A middle tile of its own; small equal to it is left out (M <= 64 reaches 128's tile).
  assertEqual(shapeTileOf(a, at(b, 64), [at(b, 128), at(a, 256)]), {
    tile: a,
    middle: [at(b, 128)],
  });
  // Small equal to the prefill tile is kept when a middle tile between differs.
  assertEqual(shapeTileOf(a, at(a, 64), [at(c, 128), at(b, 256)]), {
    tile: a,
    small: at(a, 64),
    middle: [at(c, 128), at(b, 256)],
  });
  // No decode batch measured.
  assertEqual(shapeTileOf(a, undefined, [at(b, 8), at(b, 16)]), { tile: a, middle: [at(b, 16)] });
  assertEqual(shapeTileOf(a, undefined, []), { tile: a });
});

Deno.test("kernelTuningCachePath() follows WEBGPU_LLM_CACHE_DIR, XDG_CACHE_HOME, then HOME", () => {
  const env = (vars: Record<string, string>) => (name: string) => vars[name];
  assertEqual(
    kernelTuningCachePath(env({ WEBGPU_LLM_CACHE_DIR: "/c", HOME: "/h" })),
    "/c/matmul_tuning.json",
  );
  assertEqual(
    kernelTuningCachePath(env({ XDG_CACHE_HOME: "/x", HOME: "/h" })),
    "/x/webgpu-llm/matmul_tuning.json",
  );
  assertEqual(
    kernelTuningCachePath(env({ HOME: "/h" })),
    "/h/.cache/webgpu-llm/matmul_tuning.json",
  );
});

Deno.test("effectiveTuningMode() lets WEBGPU_LLM_KERNEL_TUNING replace auto only", () => {
  const env = (value?: string) => (name: string) => name === KERNEL_TUNING_ENV ? value : undefined;
  assertEqual(effectiveTuningMode("auto", env()), { mode: "auto", why: "" });
  assertEqual(effectiveTuningMode("auto", env("off")).mode, "off");
  assertEqual(effectiveTuningMode("measure", env("off")).mode, "measure", "a flag beats it");
  assertThrows(() => effectiveTuningMode("auto", env("fast")), /got "fast"/);
});

/** Runs `fn` without WEBGPU_LLM_KERNEL_TUNING (a run may set it), restoring it after. */
async function withoutTuningEnv(fn: () => Promise<void>): Promise<void> {
  const before = Deno.env.get(KERNEL_TUNING_ENV);
  Deno.env.delete(KERNEL_TUNING_ENV);
  try {
    await fn();
  } finally {
    if (before !== undefined) Deno.env.set(KERNEL_TUNING_ENV, before);
  }
}

/** Two call sites of different shapes on random weights; `done` releases their buffers. */
function bindSites(ctx: GpuContext, matmul: Matmul, m: number, shapes: [number, number][]) {
  const own: { destroy(): void }[] = [];
  const arena = new ParamArena(ctx, 8);
  own.push(arena);
  const sites = shapes.map(([n, k]) => {
    const { rng } = testSeed(`tuning sites ${n}x${k}`);
    const w = rng.array(n * k, -1, 1);
    const x = rng.array(m * k, -1, 1);
    const weight = GpuMatrix.fromArray(ctx, "w", w, n, k, matmul.dtype, { padColsTo: 4 });
    const xBuf = upload(ctx, x);
    const yBuf = poisonedF32(ctx, m * n);
    own.push(weight, xBuf, yBuf);
    const op = matmul.bind(arena, { x: whole(xBuf), weight, y: whole(yBuf) });
    return { op, n, k, w, x, yBuf };
  });
  return { arena, sites, done: () => own.forEach((o) => o.destroy()) };
}

Deno.test(
  "Matmul.setTuning() moves a shape's gemv limit and tile, and results still match float64",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const dtype = ctx.weightDtype;
    const matmul = new Matmul(ctx, { dtype, bias: false, policy: "gpu" });
    const m = 40;
    const { arena, sites, done } = bindSites(ctx, matmul, m, [[67, 129], [33, 64]]);
    try {
      const [a, b] = sites as [typeof sites[0], typeof sites[0]];
      // A site's first `rows` rows of Y against the float64 reference.
      const checkSite = async (s: typeof a, rows: number, what: string) => {
        const got = (await readF32(ctx, s.yBuf)).subarray(0, rows * s.n);
        const w = roundTo(s.w, dtype);
        const want = matmulRef(s.x.subarray(0, rows * s.k), w, undefined, rows, s.n, s.k);
        assertClose(got, want, toleranceFor(dtype), what);
      };
      const variants = (op: MatmulOp) => [16, 17, 40].map((rows) => op.variantFor(rows));
      assertEqual(variants(a.op), ["gemv", "tiled", "tiled"], "default: gemv up to 16 rows");
      const tile = TILE_CANDIDATES[3]!;
      assertEqual(a.op.variantFor(40), "tiled");
      matmul.setTuning({
        tile,
        gemvMaxRows: { [shapeKey(a.op.shape)]: 40 },
        gemvRows: { [shapeKey(a.op.shape)]: 4 },
      });
      assertEqual(matmul.tile, tile);
      assertEqual(a.op.variantFor(40), "gemv", "the call site re-chooses the same M");
      assertEqual(variants(a.op), ["gemv", "gemv", "gemv"], "tuned shape: gemv up to 40");
      assertEqual(variants(b.op), ["gemv", "tiled", "tiled"], "an unlisted shape keeps 16");
      // Both kernels, under the new tile (and gemv with 4 weight rows per invocation for a),
      // against the float64 reference.
      for (const rows of [40, 17]) {
        await runPass(ctx, arena, (pass) => {
          for (const s of sites) s.op.encode(pass, rows);
        });
        for (const s of sites) await checkSite(s, rows, `${shapeKey(s.op.shape)} M ${rows}`);
      }
      matmul.setTuning({ tile: TILE, gemvMaxRows: { [shapeKey(a.op.shape)]: 0 } });
      assertEqual(variants(a.op), ["tiled", "tiled", "tiled"], "limit 0: tiled for every M");
      // A small-M tile runs M up to its limit, the tile above it; both match float64.
      const small = TILE_CANDIDATES.find((c) => c.wy === 4)!;
      const tm8 = TILE_CANDIDATES.find((c) => c.tm === 8)!;
      matmul.setTuning({ tile: tm8, smallTile: { tile: small, maxRows: 17 }, gemvMaxRows: {} });
      assertEqual([matmul.tileFor(17), matmul.tileFor(18)], [small, tm8]);
      const grid = (rows: number) => matmul.choose(rows, 67, 129, 132, "tiled").mPerGroup;
      assertEqual([grid(17), grid(40)], [4 * small.wy, 8 * tm8.wy]);
      for (const rows of [17, 40]) {
        await runPass(ctx, arena, (pass) => a.op.encode(pass, rows, { variant: "tiled" }));
        await checkSite(a, rows, `small tile, M ${rows}`);
      }
      // Tiles of a's own (split-K above 17 rows), the common ones for b; all match float64.
      const split = TILE_CANDIDATES.find((c) => c.sk === 4 && c.wy === 16)!;
      matmul.setTuning({
        tile: tm8,
        smallTile: { tile: small, maxRows: 17 },
        shapeTiles: { [shapeKey(a.op.shape)]: { tile: split, small: { tile: TILE, maxRows: 17 } } },
        gemvMaxRows: {},
      });
      assertEqual(
        [17, 18].map((m) => [matmul.tileFor(m, a.op.shape), matmul.tileFor(m, b.op.shape)]),
        [[TILE, small], [split, tm8]],
      );
      assertEqual([matmul.tileFor(17), matmul.tileFor(18)], [small, tm8], "no shape: common");
      assertEqual([17, 40].map((m) => a.op.configFor(m, { variant: "tiled" }).split), [1, 4]);
      for (const rows of [17, 40]) {
        await runPass(ctx, arena, (pass) => {
          for (const s of sites) s.op.encode(pass, rows, { variant: "tiled" });
        });
        for (const s of sites) {
          await checkSite(s, rows, `${shapeKey(s.op.shape)} own tile, M ${rows}`);
        }
      }
      // A middle tile of a's own, from 18 to 30 rows: it runs M = 25, which matches float64.
      matmul.setTuning({
        tile: tm8,
        shapeTiles: {
          [shapeKey(a.op.shape)]: {
            tile: split,
            small: { tile: TILE, maxRows: 17 },
            middle: [{ tile: small, maxRows: 30 }],
          },
        },
        gemvMaxRows: {},
      });
      assertEqual(
        [17, 18, 30, 31].map((m) => matmul.tileFor(m, a.op.shape)),
        [TILE, small, small, split],
      );
      const config = (m: number) => a.op.configFor(m, { variant: "tiled" });
      assertEqual([25, 31].map((m) => [config(m).mPerGroup, config(m).split]), [
        [4 * small.wy, 1],
        [4 * split.wy, 4],
      ]);
      for (const rows of [25, 31]) {
        await runPass(ctx, arena, (pass) => a.op.encode(pass, rows, { variant: "tiled" }));
        await checkSite(a, rows, `middle tile, M ${rows}`);
      }
      const [ka, kb] = [shapeKey(a.op.shape), shapeKey(b.op.shape)];
      /** Follows `tuning`: b at `mb` rows and a at `ma` run the gemv kernels keyed `keyB` and `keyA`, and match float64. */
      const follow = async (
        tuning: MatmulTuning,
        [mb, keyB]: [number, string],
        [ma, keyA]: [number, string],
      ) => {
        matmul.setTuning(tuning);
        assertEqual(matmul.choose(mb, 33, 64, 64).key.endsWith(keyB), true, keyB);
        assertEqual(matmul.choose(ma, 67, 129, 132).key.endsWith(keyA), true, keyA);
        await runPass(ctx, arena, (pass) => {
          b.op.encode(pass, mb);
          a.op.encode(pass, ma);
        });
        await checkSite(b, mb, `b ${keyB}, M ${mb}`);
        await checkSite(a, ma, `a ${keyA}, M ${ma}`);
      };
      // Steps of 8 weights where the tuning lists them and the row stride (64 for b) allows
      // them; a's stride of 132 keeps steps of 4.
      await follow(
        {
          tile: TILE,
          gemvMaxRows: { [kb]: 64 },
          gemvRows: { [kb]: 4 },
          gemvSteps: { [ka]: 8, [kb]: 8 },
        },
        [40, "/mb8/rb4/ks8/x4"], // b: K = 64, X read as vec4s
        [8, "/mb8"],
      );
      // 32 invocations a row where the tuning says so (b), 64 elsewhere (a).
      await follow(
        {
          tile: TILE,
          gemvMaxRows: { [ka]: 64, [kb]: 64 },
          gemvSteps: { [kb]: 8 },
          gemvTprs: { [kb]: 32 },
        },
        [8, "/mb8/ks8/tp32/x4"],
        [8, "/mb8"],
      );
      // At most 2 (or 1) rows of X per gemv workgroup: M = 40 and 17 run 20 / 9 (40 / 17)
      // workgroups in grid z; both match float64.
      for (const cap of [2, 1]) {
        matmul.setTuning({
          tile: TILE,
          gemvMaxRows: { [ka]: 40 },
          gemvRows: { [ka]: 4 },
          gemvXRows: { [ka]: cap },
        });
        assertEqual(matmul.choose(40, 67, 129, 132).key.endsWith(`/mb${cap}/rb4`), true);
        assertEqual(matmul.choose(1, 67, 129, 132).key.endsWith("/mb1/rb4"), true);
        for (const rows of [40, 17]) {
          await runPass(ctx, arena, (pass) => a.op.encode(pass, rows));
          await checkSite(a, rows, `a, ${cap} X rows per workgroup, M ${rows}`);
        }
      }
      assertEqual(matmul.choose(40, 33, 64, 64, "gemv").key.endsWith("/mb8/x4"), true, "b keeps 8");
      assertThrows(
        () => matmul.choose(8, 67, 129, 132, "gemv", "f32", "plain", { xRows: 3 }),
        /Cannot encode matmul gemv with 3 X rows per workgroup/,
      );
      assertThrows(
        () => matmul.setTuning({ tile: { wx: 3, wy: 3, bk: 3 }, gemvMaxRows: {} }),
        RangeError,
      );
    } finally {
      done();
    }
  },
);

Deno.test(
  "tuneMatmul() measures each shape's tiles and crossover on the bound call sites",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const matmul = new Matmul(ctx, { dtype: ctx.weightDtype, bias: false, policy: "gpu" });
    // Two call sites share the first shape (weight 2 in the tile's total).
    const { done, sites } = bindSites(ctx, matmul, 24, [[40, 64], [40, 64], [24, 96]]);
    try {
      const tiles = [TILE, TILE_CANDIDATES[3]!];
      const r = await tuneMatmul(ctx, [matmul], {
        maxBatch: 4,
        prefillRows: 24,
        repeats: 2,
        tiles,
      });
      assert(tiles.includes(r.tuning.tile));
      const keys = [shapeKey(sites[0]!.op.shape), shapeKey(sites[2]!.op.shape)];
      // The timed passes rotate over a shape's call sites: the second 40 x 64 site ran too, so
      // the first row of its Y holds its product, no longer the poison.
      assertEqual(keys.map((key) => r.shapes[key]!.sites), [2, 1]);
      const second = sites[1]!;
      const w = roundTo(second.w, ctx.weightDtype);
      assertClose(
        (await readF32(ctx, second.yBuf)).subarray(0, second.n),
        matmulRef(second.x.subarray(0, second.k), w, undefined, 1, second.n, second.k),
        toleranceFor(ctx.weightDtype),
        "the second call site's first row",
      );
      assertEqual(Object.keys(r.tuning.gemvMaxRows), keys);
      for (const key of keys) {
        const points = r.crossovers[key]!;
        assertEqual(r.tuning.gemvMaxRows[key], crossover(points));
        // Both row strides (64, 96) allow steps of 8: eight gemv kernels per row count (1 or 4
        // rows, steps of 4 or 8, 64 or 32 invocations a row), each under the caps of 8, 4, 2 and
        // 1 rows of X per workgroup.
        const candidates = gemvCandidates(64);
        const names = candidates.map(gemvCandidateKey);
        assertEqual(names.length, 32);
        const chosen = {
          rows: r.tuning.gemvRows![key]!,
          step: r.tuning.gemvSteps![key]!,
          tpr: r.tuning.gemvTprs![key]!,
          xRows: r.tuning.gemvXRows![key]!,
        };
        for (const p of points) assertEqual(Object.keys(p.gemvByKind!), names);
        const ms = (p: (typeof points)[number]) => names.map((n) => p.gemvByKind![n]!);
        const best = pickGemv(points.map((p) => ({ ms: ms(p), tiledMs: p.tiledMs })));
        assertEqual(candidates[best], chosen);
        for (const p of points) assertEqual(p.gemvMs, p.gemvByKind![gemvCandidateKey(chosen)]);
        // A cap at or above M's block runs the same kernel: one measurement for all of them.
        for (const p of points) {
          for (const k of candidates) {
            const same = { ...k, xRows: effectiveXRows(p.m, k.xRows) };
            assertEqual(p.gemvByKind![gemvCandidateKey(k)], p.gemvByKind![gemvCandidateKey(same)]);
          }
        }
        // Measured in order, stopping after the first row count where tiled won.
        const counts = points.map((p) => p.m);
        assertEqual(counts, rowCounts(4, 24).slice(0, counts.length));
        // (the measuring stops once tiled beats every gemv; the chosen gemv may lose earlier)
        const stop = points.findIndex((p) => Math.min(...ms(p)) > p.tiledMs);
        assert(stop === -1 || stop === points.length - 1, `${key}: measured past tiled's win`);
        for (const p of points) assert(p.gemvMs > 0 && p.tiledMs > 0, `${key} M ${p.m}`);
      }
      const best = Math.min(...r.tiles.map((t) => t.totalMs));
      assertEqual(r.tiles.find((t) => t.totalMs === best)!.tile, r.tuning.tile);
      // Each shape's own tiles: the fastest for it alone at its prefill rows, at the decode
      // batch and at the row counts between (8 and 16), each kept where it differs from the tile
      // of the next larger row count.
      assertEqual(Object.keys(r.shapes), keys);
      const fastest = (ms: readonly number[]) => tiles[ms.indexOf(Math.min(...ms))]!;
      for (const key of keys) {
        const { tileMs, smallMs, middleMs } = r.shapes[key]!;
        assertEqual(middleMs!.map((x) => x.rows), [8, 16]);
        for (const x of middleMs!) assert(x.ms.every((t) => t > 0), `${key} M ${x.rows}`);
        const chain = [
          { tile: fastest(smallMs!), maxRows: 4 },
          ...middleMs!.map((x) => ({ tile: fastest(x.ms), maxRows: x.rows })),
        ];
        const want: { tile: TileConfig; below: { tile: TileConfig; maxRows: number }[] } = {
          tile: fastest(tileMs),
          below: [],
        };
        for (const t of [...chain].reverse()) {
          const next = want.below[0]?.tile ?? want.tile;
          if (!sameTile(t.tile, next)) want.below.unshift(t);
        }
        const got = r.tuning.shapeTiles![key]!;
        assertEqual(got.tile, want.tile);
        assertEqual([...(got.small ? [got.small] : []), ...(got.middle ?? [])], want.below);
        // Each M runs the tile measured fastest at the least measured row count holding it.
        for (const m of [1, 4, 5, 8, 9, 16, 17, 24]) {
          const at = chain.find((t) => m <= t.maxRows)?.tile ?? want.tile;
          assertEqual(tileAt(r.tuning, m, sites[key === keys[0] ? 0 : 2]!.op.shape), at);
        }
      }
      // The decode batch's tile: the best there, kept only when it is not the prefill tile.
      const bestSmall = Math.min(...r.tiles.map((t) => t.smallMs!));
      const small = r.tiles.find((t) => t.smallMs === bestSmall)!.tile;
      assertEqual(
        r.tuning.smallTile,
        small === r.tuning.tile ? undefined : { tile: small, maxRows: 4 },
      );
      // The measured matmul is untouched until the tuning is applied.
      assertEqual(matmul.tile, TILE);
      await assertRejects(
        () =>
          tuneMatmul(ctx, [new Matmul(ctx, { dtype: "f32", bias: false, policy: "cpu" })], {
            maxBatch: 1,
          }),
        /the cpu policy has no measured choices/,
      );
      await assertRejects(
        () =>
          tuneMatmul(ctx, [new Matmul(ctx, { dtype: "f32", bias: true, policy: "gpu" })], {
            maxBatch: 1,
          }),
        /no call site is bound/,
      );
    } finally {
      done();
    }
  },
);

Deno.test(
  "applyKernelTuning() measures and caches, then reads the cache back; off and cpu do nothing",
  GPU_TEST,
  () =>
    withoutTuningEnv(async () => {
      const gpu = await testContext({ kernelProfile: "gpu" });
      const dir = await Deno.makeTempDir({ prefix: "tuning_cache_" });
      const cachePath = join(dir, "sub", "matmul_tuning.json");
      const matmul = new Matmul(gpu, { dtype: gpu.weightDtype, bias: false });
      const { done } = bindSites(gpu, matmul, 8, [[24, 32]]);
      try {
        const lines: string[] = [];
        const base = { maxBatch: 4, prefillRows: 8, cachePath, log: (l: string) => lines.push(l) };
        const off = await applyKernelTuning(gpu, [matmul], { ...base, mode: "off" });
        assertEqual([off.tuning, lines.pop()?.includes("--kernel-tuning off")], [null, true]);
        if (gpu.adapter.isFallback) {
          const auto = await applyKernelTuning(gpu, [matmul], { ...base, mode: "auto" });
          assertEqual(auto.tuning, null, "auto, nothing cached: a software adapter keeps defaults");
        }
        const measured = await applyKernelTuning(gpu, [matmul], { ...base, mode: "measure" });
        assertEqual(measured.source, "measured");
        assert(lines.pop()!.startsWith("Kernel tuning: measured in "));
        // Said before it starts, with where the result goes.
        assertEqual(
          lines.pop(),
          "Kernel tuning: measuring the matmul choices on this adapter (--kernel-tuning measure); " +
            `the result is cached in ${cachePath}`,
        );
        assertEqual(matmul.tile, measured.tuning!.tile, "applied");
        const counted = await cachedTunings(gpu, cachePath);
        assertEqual(counted?.entries, 1);
        assertEqual(await cachedTunings(gpu, join(dir, "none.json")), { entries: 0, newest: "" });
        const file = JSON.parse(await Deno.readTextFile(cachePath));
        const key = kernelTuningKey(gpu, [matmul], 4, 8);
        assertEqual(file.entries[key].parts, {
          matmul: JSON.parse(JSON.stringify(measured.tuning)),
        });
        matmul.setTuning({ tile: TILE, gemvMaxRows: {} });
        const cached = await applyKernelTuning(gpu, [matmul], { ...base, mode: "auto" });
        assertEqual([cached.source, cached.tuning], ["cached", measured.tuning]);
        assertEqual(matmul.tile, measured.tuning!.tile, "the cached tuning is applied");
        assert(lines.pop()!.startsWith("Kernel tuning: cached "));
        // A broken cache file is reported and replaced by a new measurement.
        await Deno.writeTextFile(cachePath, "{not json");
        assertEqual(await cachedTunings(gpu, cachePath), null);
        const again = await applyKernelTuning(gpu, [matmul], { ...base, mode: "measure" });
        assert(lines.some((l) => l.includes(`cache ${cachePath} ignored`)), lines.join("\n"));
        assertEqual(again.source, "measured");
        assert(JSON.parse(await Deno.readTextFile(cachePath)).entries[key] !== undefined);
        const cpu = await testContext({ kernelProfile: "cpu" });
        const none = await applyKernelTuning(cpu, [], { ...base, mode: "measure" });
        assertEqual([none.tuning, none.source], [
          null,
          "the cpu kernel profile has no tuned choices",
        ]);
      } finally {
        done();
        await Deno.remove(dir, { recursive: true });
      }
    }),
);

Deno.test(
  "applyKernelTuning() keeps a part's defaults when it cannot be measured, and caches nothing",
  GPU_TEST,
  () =>
    withoutTuningEnv(async () => {
      const gpu = await testContext({ kernelProfile: "gpu" });
      const dir = await Deno.makeTempDir({ prefix: "tuning_fail_" });
      const cachePath = join(dir, "matmul_tuning.json");
      // A cpu-policy call site among the matmuls: the matmul part throws while measuring.
      const matmul = new Matmul(gpu, { dtype: gpu.weightDtype, bias: false, policy: "cpu" });
      const { done } = bindSites(gpu, matmul, 4, [[24, 32]]);
      try {
        const lines: string[] = [];
        const r = await applyKernelTuning(gpu, [matmul], {
          maxBatch: 2,
          prefillRows: 4,
          cachePath,
          mode: "measure",
          log: (l) => lines.push(l),
        });
        assertEqual([r.tuning, r.source], [null, "measured (partly; not cached)"]);
        assert(
          lines.some((l) =>
            l.startsWith("Kernel tuning: matmul not measured (Cannot tune matmul: the cpu policy")
          ),
          lines.join("\n"),
        );
        assertEqual(matmul.tile, TILE, "defaults kept");
        await assertRejects(() => Deno.stat(cachePath), Deno.errors.NotFound);
        gpu.check();
      } finally {
        done();
        await Deno.remove(dir, { recursive: true });
      }
    }),
);

Deno.test(
  "LLMEngine measures its matmul tuning under the gpu profile, caches it, and stays equal to float64",
  GPU_TEST,
  () =>
    withoutTuningEnv(async () => {
      const dir = await Deno.makeTempDir({ prefix: "tuning_engine_" });
      const before = Deno.env.get("WEBGPU_LLM_CACHE_DIR");
      Deno.env.set("WEBGPU_LLM_CACHE_DIR", join(dir, "cache"));
      try {
        await makeModel({ out: join(dir, "m"), preset: "tiny-qwen3", dtype: "f32", seed: 21 });
        const ref = await ReferenceModel.load(join(dir, "m"));
        const prompt = [5, 3, 9, 1, 7, 2, 8, 4, 6, 11, 13];
        const expected = referenceRun(ref, prompt, 8);
        for (const kernelTuning of ["measure", "auto"] as const) {
          const lines: string[] = [];
          const engine = await LLMEngine.create({
            model: join(dir, "m"),
            kernelProfile: "gpu",
            kernelTuning,
            forceF32: true,
            maxNumSeqs: 4,
            showProgress: false,
          }, (l) => lines.push(l));
          try {
            const said = kernelTuning === "measure" ? "measured in" : "cached";
            assert(
              lines.some((l) => l.startsWith(`Kernel tuning: ${said}`)),
              lines.join("\n"),
            );
            for (const part of ["decode attention split at", "prefill attention "]) {
              assert(
                lines.some((l) => l.startsWith(`Kernel tuning: ${said}`) && l.includes(part)),
                lines.join("\n"),
              );
            }
            const out: number[] = [];
            for await (
              const o of engine.generate({
                requestId: "t",
                promptTokenIds: prompt,
                params: samplingParams({ temperature: 0, maxTokens: 8, ignoreEos: true }),
              })
            ) out.push(...o.tokenIds);
            for (let i = 0; i < 8; i++) {
              if (expected[i]!.gap < 1e-4) break;
              assertEqual(out[i], expected[i]!.token, `${kernelTuning}: token ${i}`);
            }
          } finally {
            await engine.shutdown();
          }
        }
      } finally {
        if (before === undefined) Deno.env.delete("WEBGPU_LLM_CACHE_DIR");
        else Deno.env.set("WEBGPU_LLM_CACHE_DIR", before);
        await Deno.remove(dir, { recursive: true });
      }
    }),
);

Deno.test("SiteTurns.next() cycles over a shape's sites and goes on from one candidate to the next", () => {
  const turns = new SiteTurns();
  const a = ["a0", "a1", "a2"];
  const b = ["b0", "b1", "b2"];
  // Candidate a's four passes, then candidate b's: b starts where a stopped.
  const passes = [a, a, a, a, b, b].map((sites) => turns.next("k", sites));
  assertEqual(passes, ["a0", "a1", "a2", "a0", "b1", "b2"]);
  // Another shape has its own turn.
  assertEqual(turns.next("other", ["o0", "o1"]), "o0");
  assertEqual(turns.next("k", a), "a0");
});
