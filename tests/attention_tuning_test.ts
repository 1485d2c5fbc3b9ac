import {
  deepEqual as assertEqual,
  ok as assert,
  rejects as assertRejects,
  throws as assertThrows,
} from "node:assert/strict";
import {
  checkDecodeSplitTuning,
  decodeChoiceFor,
  type DecodeSplitTuning,
  describeDecodeSplit,
  SPLIT_CANDIDATES,
  splitPartitionFor,
  WIDE_MIN_PARTITION,
} from "../kernels/decode_split.ts";
import { splitBatches, splitCandidates, tuneDecodeSplit } from "../kernels/decode_split_tuner.ts";
import {
  describePrefillChoice,
  parsePrefillChoice,
  prefillChoiceAt,
  prefillLengths,
  tunePrefillAttention,
} from "../kernels/prefill_attention_tuner.ts";
import { PagedAttentionDecode } from "../kernels/paged_attention_decode.ts";
import type { PagedAttentionDecodeVariant } from "../kernels/paged_attention_decode_config.ts";
import type { GpuContext } from "../gpu/context.ts";
import { GPU_TEST, ParamArena, testContext, upload, whole } from "./support/gpu.ts";
import { ModelRunner } from "../engine/model_runner.ts";
import { gpuPrefillCompiles } from "../engine/models/attention_block.ts";
import { TILE, TILE_CANDIDATES, type TileConfig } from "../kernels/matmul.ts";
import { shapeKey } from "../kernels/matmul_tuning.ts";
import { tileName } from "../kernels/matmul_tile.ts";
import { makeModel } from "../tools/make_model.ts";
import { ReferenceModel } from "./reference/model.ts";
import { referenceRun, SOLO_RUNNER_OPTIONS, soloGreedy } from "./support/solo_run.ts";

const TUNING: DecodeSplitTuning = {
  contextLen: 1024,
  partitionByBatch: { "1": 64, "2": 128, "4": 0, "8": 256 },
};

/** Checks `splitPartitionFor(tuning, batch, context)` for each [batch, context, size, why?]. */
function expectSplits(
  tuning: DecodeSplitTuning,
  cases: readonly (readonly [number, number, number, string?])[],
): void {
  for (const [batch, context, size, why] of cases) {
    assertEqual(splitPartitionFor(tuning, batch, context), size, why ?? `${batch} x ${context}`);
  }
}

Deno.test("splitPartitionFor() takes the smallest measured batch at or above the step's", () => {
  expectSplits(TUNING, [
    [1, 1000, 64],
    [2, 1000, 128],
    [3, 1000, 0, "batch 4 measured direct"],
    [5, 1000, 256, "batch 8's entry"],
    [9, 1000, 0, "past the largest: direct"],
    [1, 64, 0, "one partition: no split"],
    [1, 65, 64],
    // Past the measured 1,024 tokens the 16 partitions of 64 grow: 4,096 tokens in 16 of 256.
    [1, 1024, 64],
    [1, 4096, 256],
    [1, 1025, 80, "65 tokens rounded up to 16"],
    [5, 3000, 752, "4 of 256 at 1,024: 3,000 in 4 of 752"],
  ]);
});

/** TUNING with choices measured at 128 and 512 tokens too. */
const WITH_SHORTER: DecodeSplitTuning = {
  ...TUNING,
  shorter: [
    { contextLen: 128, partitionByBatch: { "1": 16, "2": 0 } },
    { contextLen: 512, partitionByBatch: { "1": 32, "8": 0 } },
  ],
};

Deno.test("splitPartitionFor() follows the shortest measured context at or above the step's", () => {
  expectSplits(WITH_SHORTER, [
    [1, 100, 16, "128 tokens' batch 1"],
    [1, 128, 16],
    [2, 128, 0, "128 tokens' batch 2: direct"],
    [3, 128, 0, "past 128 tokens' largest batch"],
    [1, 16, 0, "one partition: no split"],
    [1, 129, 32, "512 tokens' batch 1"],
    [5, 512, 0, "512 tokens' batch 8: direct"],
    [5, 513, 256, "1,024 tokens' batch 8"],
    [1, 1000, 64],
    // Past the longest measured context its own choice still scales (never a shorter one's).
    [1, 4096, 256],
  ]);
});

/** TUNING with batches 1 and 8 measured fastest 256 invocations wide. */
const WIDE: DecodeSplitTuning = {
  ...TUNING,
  widthByBatch: { "1": 256, "8": 256 },
  shorter: [{ contextLen: 128, partitionByBatch: { "1": 0, "2": 0 }, widthByBatch: { "2": 256 } }],
};

Deno.test("decodeChoiceFor() takes the width of the same measured entry as the partition", () => {
  const cases: [number, number, number, number][] = [
    [1, 1000, 64, 256],
    [2, 1000, 128, 64],
    [3, 1000, 0, 64],
    [5, 1000, 256, 256],
    [5, 200, 0, 256], // one partition of batch 8's 256 tokens: direct, at its width
    [9, 1000, 0, 64], // past the largest measured batch
    [1, 100, 0, 64], // 128 tokens' batch 1, no width listed
    [2, 100, 0, 256],
  ];
  for (const [batch, context, partition, width] of cases) {
    assertEqual(
      decodeChoiceFor(WIDE, batch, context),
      { partition, width },
      `${batch} x ${context}`,
    );
    assertEqual(splitPartitionFor(WIDE, batch, context), partition);
  }
  // A tuning without widths (measured before they existed) runs the default everywhere.
  assertEqual(decodeChoiceFor(TUNING, 1, 1000), { partition: 64, width: 64 });
});

Deno.test("checkDecodeSplitTuning() refuses bad batches, sizes and lengths, naming them", () => {
  checkDecodeSplitTuning(TUNING);
  const bad = (t: unknown) => () => checkDecodeSplitTuning(t as DecodeSplitTuning);
  assertThrows(bad({ ...TUNING, contextLen: 0 }), /contextLen 0 is not positive/);
  assertThrows(bad({ ...TUNING, partitionByBatch: [] }), /must be an object/);
  assertThrows(bad({ ...TUNING, partitionByBatch: { "0": 64 } }), /batch "0"/);
  assertThrows(bad({ ...TUNING, partitionByBatch: { "1.5": 64 } }), /batch "1.5"/);
  assertThrows(
    bad({ ...TUNING, partitionByBatch: { "2": 100 } }),
    /batch 2 has partition size 100/,
  );
  assertThrows(bad(null), TypeError);
  checkDecodeSplitTuning(WITH_SHORTER);
  const shorter = WITH_SHORTER.shorter!;
  assertThrows(bad({ ...TUNING, shorter: {} }), /shorter must be an array/);
  assertThrows(bad({ ...TUNING, shorter: [shorter[1], shorter[0]] }), /128 is not ascending/);
  assertThrows(
    bad({ ...TUNING, shorter: [{ contextLen: 1024, partitionByBatch: {} }] }),
    /1024 is not ascending below 1024/,
  );
  assertThrows(
    bad({ ...TUNING, shorter: [{ contextLen: 64, partitionByBatch: { "1": 8 } }] }),
    /batch 1 has partition size 8/,
  );
  assertEqual(
    describeDecodeSplit(TUNING),
    "decode attention split at 1024 tokens: batch 1 x 64, 2 x 128, 4 direct, 8 x 256",
  );
  checkDecodeSplitTuning(WIDE);
  assertThrows(bad({ ...TUNING, widthByBatch: [] }), /widthByBatch must be an object/);
  assertThrows(bad({ ...TUNING, widthByBatch: { "1": 128 } }), /batch 1 has width 128/);
  assertThrows(bad({ ...TUNING, widthByBatch: { "3": 256 } }), /width of batch "3" has no/);
  // Against a kernel's own widths (the unrolled kernel runs the default only).
  assertThrows(() => checkDecodeSplitTuning(WIDE, [64]), /batch 1 has width 256 \(one of 64\)/);
  assertEqual(
    describeDecodeSplit(WIDE),
    "decode attention split at 128 tokens: batch 1 direct, 2 direct w256; at 1024 tokens: " +
      "batch 1 x 64 w256, 2 x 128, 4 direct, 8 x 256 w256",
  );
  assertEqual(
    describeDecodeSplit(WITH_SHORTER),
    "decode attention split at 128 tokens: batch 1 x 16, 2 direct; at 512 tokens: batch 1 x 32, " +
      "8 direct; at 1024 tokens: batch 1 x 64, 2 x 128, 4 direct, 8 x 256",
  );
});

Deno.test("splitCandidates() adds the direct path and long partitions at each wider width", () => {
  const base = SPLIT_CANDIDATES.map((size) => ({ size, width: 64 }));
  assertEqual(splitCandidates([64]), base);
  assertEqual(splitCandidates([64, 256]), [
    ...base,
    ...SPLIT_CANDIDATES.filter((s) => s === 0 || s >= WIDE_MIN_PARTITION).map((size) => ({
      size,
      width: 256,
    })),
  ]);
});

Deno.test("splitBatches() doubles up to the batch, then adds it", () => {
  assertEqual(splitBatches(1), [1]);
  assertEqual(splitBatches(6), [1, 2, 4, 6]);
  assertEqual(splitBatches(64), [1, 2, 4, 8, 16, 32, 64]);
  assertEqual(splitBatches(80), [1, 2, 4, 8, 16, 32, 64, 80]);
});

/**
 * The (size, width) pairs tuneDecodeSplit() tries for `kernel` at `len` tokens: the direct path
 * and the partitions shorter than `len` that `fits` allows, at each width the kernel runs.
 */
function tries(
  kernel: PagedAttentionDecode,
  len: number,
  fits: (size: number) => boolean = () => true,
): [number, number][] {
  return splitCandidates(kernel.widths)
    .filter((c) => c.size === 0 || (c.size < len && fits(c.size)))
    .map((c) => [c.size, c.width]);
}

/** Checks that `choice` keeps the fastest of `tried` for `batch`: its partition and width. */
function expectFastest(
  choice: { partitionByBatch: Record<string, number>; widthByBatch?: Record<string, number> },
  batch: string,
  tried: readonly { size: number; width: number; ms: number }[],
  why: string,
): void {
  const best = tried.reduce((a, p) => (p.ms < a.ms ? p : a));
  assertEqual(
    [choice.partitionByBatch[batch], choice.widthByBatch?.[batch] ?? 64],
    [best.size, best.width],
    why,
  );
}

/** A decode attention kernel and one call site on small zero buffers. */
async function smallOp(maxSeqs: number, maxLen: number, variant?: PagedAttentionDecodeVariant) {
  const ctx = await testContext();
  const kernel = new PagedAttentionDecode(ctx, {
    numQHeads: 4,
    numKvHeads: 2,
    headDim: 16,
    blockSize: 16,
    dtype: "f32",
    ...(variant === undefined ? {} : { variant }),
  });
  const scratch = kernel.createScratch(maxSeqs, maxLen);
  const b = (n: number) => whole(upload(ctx, new Float32Array(n)));
  const op = kernel.bind(new ParamArena(ctx, 2), {
    q: b(maxSeqs * 64),
    kCache: b(16),
    vCache: b(16),
    blockTables: b(16),
    contextLens: b(16),
    out: b(maxSeqs * 64),
    scratch,
  }, { qStride: 64, btStride: 4 });
  return { ctx, kernel, scratch, op };
}

Deno.test(
  "PagedAttentionDecodeOp.splitPartition() follows the kernel's tuning within the scratch",
  GPU_TEST,
  async () => {
    const { kernel, scratch, op } = await smallOp(8, 2048);
    try {
      // The default rule: partitions of 512 tokens past 1024 tokens.
      assertEqual([op.splitPartition(1, 1000), op.splitPartition(1, 1500)], [0, 512]);
      kernel.setSplitTuning(TUNING);
      assertEqual(kernel.splitTuning, TUNING);
      assertEqual(op.splitPartition(1, 1000), 64);
      assertEqual(op.splitPartition(2, 1000), 128);
      assertEqual(op.splitPartition(4, 1000), 0);
      // The scratch holds 8 x 128 short partials (partitions of 16 tokens up to 2,048); batch 8's
      // 256 tokens, 4 partitions at the measured 1,024, are 4 of 512 at 2,000.
      assertEqual(scratch.pairs, 8 * 128);
      assertEqual(op.splitPartition(8, 2000), 512);
      assertEqual(op.usesSplit(1000, 1), true);
      kernel.setSplitTuning(null);
      assertEqual(op.splitPartition(1, 1000), 0);
      assertThrows(
        () => kernel.setSplitTuning({ contextLen: 8, partitionByBatch: { "1": 65 } }),
        TypeError,
      );
    } finally {
      scratch.destroy();
    }
  },
);

Deno.test(
  "tuneDecodeSplit() times batches above 16 with the partitions their scratch holds, 64 tokens included",
  GPU_TEST,
  async () => {
    const { ctx, kernel, scratch } = await smallOp(1, 16);
    scratch.destroy();
    // 200 sequences of 1,024 tokens: room for 16 partitions of 64 tokens each (the scratch's
    // large-batch room; the short partitions of 16 sequences alone would leave 5).
    const big = kernel.createScratch(200, 1024);
    assertEqual(big.partitionsPerSeq(200), 16);
    big.destroy();
    const r = await tuneDecodeSplit(ctx, kernel, { maxBatch: 40, contextLen: 200, repeats: 1 });
    assertEqual(Object.keys(r.points), ["1", "2", "4", "8", "16", "32", "40"]);
    // At 40 sequences of 200 tokens the scratch (16 x 13 short partitions, 208) holds 5 per
    // sequence: 64-token partitions (4) and longer, not 16- or 32-token ones (13, 7).
    assertEqual(
      r.points["40"]!.map((p) => [p.size, p.width]),
      tries(kernel, 200, (s) => s >= 64),
    );
    assert(r.points["40"]!.some((p) => p.size === 64));
    checkDecodeSplitTuning(r.tuning);
    // A step of 40 sequences follows the choice measured at 40.
    assertEqual(splitPartitionFor(r.tuning, 40, 200), r.tuning.partitionByBatch["40"]);
  },
);

Deno.test(
  "tuneDecodeSplit() times the direct path and each partition size per batch, keeping the fastest",
  GPU_TEST,
  async () => {
    const { ctx, kernel, scratch } = await smallOp(1, 16);
    scratch.destroy();
    const r = await tuneDecodeSplit(ctx, kernel, { maxBatch: 3, contextLen: 200, repeats: 2 });
    assertEqual(Object.keys(r.points), ["1", "2", "3"]);
    assertEqual(r.tuning.contextLen, 200);
    for (const [batch, tried] of Object.entries(r.points)) {
      // 256 and 512 would be one partition of 200 tokens: not tried.
      assertEqual(tried.map((p) => [p.size, p.width]), tries(kernel, 200));
      expectFastest(r.tuning, batch, tried, `batch ${batch}`);
      for (const p of tried) assert(p.ms > 0 && Number.isFinite(p.ms), `batch ${batch}`);
    }
    checkDecodeSplitTuning(r.tuning);
    assertEqual(r.tuning.shorter, undefined);
    assertEqual(r.shorterPoints, {});
    await assertRejects(
      () => tuneDecodeSplit(ctx, kernel, { maxBatch: 0, contextLen: 10 }),
      /must be positive/,
    );
    await assertRejects(
      () => tuneDecodeSplit(ctx, kernel, { maxBatch: 1, contextLen: 10, shorterContexts: [0] }),
      /shorter contexts \[0\] must be positive/,
    );
  },
);

Deno.test(
  "tuneDecodeSplit() measures each shorter context below the longest, keeping each one's fastest",
  GPU_TEST,
  async () => {
    const { ctx, kernel, scratch } = await smallOp(1, 16);
    scratch.destroy();
    const r = await tuneDecodeSplit(ctx, kernel, {
      maxBatch: 2,
      contextLen: 200,
      // 300 and 200 are not shorter: dropped; 40 twice is measured once.
      shorterContexts: [100, 40, 300, 200, 40],
      repeats: 2,
    });
    assertEqual(r.tuning.contextLen, 200);
    assertEqual(r.tuning.shorter?.map((c) => c.contextLen), [40, 100]);
    assertEqual(Object.keys(r.shorterPoints), ["40", "100"]);
    for (const c of r.tuning.shorter!) {
      const points = r.shorterPoints[c.contextLen]!;
      assertEqual(Object.keys(points), ["1", "2"]);
      for (const [batch, tried] of Object.entries(points)) {
        // Only partitions shorter than the context are tried: 40 tokens gives direct, 16, 32
        // (and direct at the wider width).
        assertEqual(tried.map((p) => [p.size, p.width]), tries(kernel, c.contextLen));
        expectFastest(c, batch, tried, `${c.contextLen} tokens, batch ${batch}`);
      }
    }
    assertEqual(Object.keys(r.points), ["1", "2"]);
    checkDecodeSplitTuning(r.tuning);
  },
);

Deno.test(
  "PagedAttentionDecodeOp.choice() follows the tuning's widths; the unrolled kernel refuses them",
  GPU_TEST,
  async () => {
    const { ctx, kernel, scratch, op } = await smallOp(8, 2048, "workgroup");
    assertEqual(kernel.widths, [64, 256]);
    try {
      assertEqual(op.choice(1, 1000), { partition: 0, width: 64 });
      kernel.setSplitTuning(WIDE);
      assertEqual(op.choice(1, 1000), { partition: 64, width: 256 });
      assertEqual(op.choice(2, 1000), { partition: 128, width: 64 });
      assertEqual(op.choice(2, 100), { partition: 0, width: 256 });
      const unrolled = new PagedAttentionDecode(ctx, {
        numQHeads: 4,
        numKvHeads: 2,
        headDim: 16,
        blockSize: 16,
        variant: "unrolled",
      });
      assertEqual(unrolled.widths, [64]);
      assertThrows(() => unrolled.setSplitTuning(WIDE), /batch 1 has width 256 \(one of 64\)/);
      unrolled.setSplitTuning(TUNING);
    } finally {
      scratch.destroy();
    }
  },
);

Deno.test(
  "tuneDecodeSplit() measures the fused variant of a kernel compiled with rope, without GPU errors",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const normDtype of ["f32", null] as const) {
      const kernel = new PagedAttentionDecode(ctx, {
        numQHeads: 4,
        numKvHeads: 2,
        headDim: 64,
        blockSize: 16,
        dtype: "f32",
        variant: "workgroup",
        rope: { normDtype },
      });
      const r = await tuneDecodeSplit(ctx, kernel, { maxBatch: 2, contextLen: 100, repeats: 2 });
      assertEqual(r.failures, [], `norm ${normDtype}`);
      assertEqual(Object.keys(r.points), ["1", "2"]);
      // The workgroup kernel's 256-wide direct path is timed beside the default's.
      assert(r.points["1"]!.some((p) => p.size === 0 && p.width === 256), `norm ${normDtype}`);
      for (const tried of Object.values(r.points)) {
        for (const p of tried) assert(p.ms > 0 && Number.isFinite(p.ms), `norm ${normDtype}`);
      }
      checkDecodeSplitTuning(r.tuning);
    }
  },
);

/**
 * Runs `fn` on a runner of a fresh tiny-qwen3 checkpoint (f32), then checks that `prompt`
 * greedily generates `maxTokens` tokens equal to the float64 reference's (near-ties excepted).
 */
async function withTinyRunner(
  seed: number,
  kernelProfile: "cpu" | "gpu" | undefined,
  prompt: readonly number[],
  maxTokens: number,
  chunk: number,
  fn: (runner: ModelRunner, ctx: GpuContext) => Promise<void> | void,
  fusedDecode = true,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "attention_tuning_model_" });
  try {
    await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed });
    const ctx = await testContext({ forceF32: true, ...(kernelProfile ? { kernelProfile } : {}) });
    const runner = await ModelRunner.load(ctx, dir, { ...SOLO_RUNNER_OPTIONS, fusedDecode });
    try {
      await fn(runner, ctx);
      const got = await soloGreedy(runner, prompt, maxTokens, { chunk });
      const expected = referenceRun(await ReferenceModel.load(dir), prompt, maxTokens);
      for (let i = 0; i < maxTokens; i++) {
        if (expected[i]!.gap < 1e-4) break;
        assertEqual(got[i], expected[i]!.token, `token ${i}`);
      }
    } finally {
      runner.destroy();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

for (const size of [64, 16]) {
  Deno.test(
    `ModelRunner decodes equal to the float64 reference with ${size}-token split partitions`,
    GPU_TEST,
    async () => {
      // Every decode step of this run takes split-K with partitions of `size` tokens: contexts
      // of 70 to 85 tokens are 2 partitions of 64, or 5 to 6 of 16.
      const prompt = Array.from({ length: 70 }, (_, i) => (i * 37 + 11) % 500);
      await withTinyRunner(31 + size, undefined, prompt, 16, 32, (runner) => {
        runner.decodeAttention.setSplitTuning({
          contextLen: 128,
          partitionByBatch: { "4": size },
        });
      });
    },
  );
}

for (const size of [0, 16]) {
  Deno.test(
    `ModelRunner decodes equal to the float64 reference 256 invocations wide (partitions ${size})`,
    GPU_TEST,
    async () => {
      // Under the gpu profile every decode step runs the fused workgroup kernel 256 wide: one
      // tile of up to 256 positions (direct), or 5 to 6 partitions of 16 tokens.
      const prompt = Array.from({ length: 70 }, (_, i) => (i * 43 + 7) % 500);
      await withTinyRunner(53 + size, "gpu", prompt, 16, 32, (runner) => {
        const tuning = {
          contextLen: 128,
          partitionByBatch: { "4": size },
          widthByBatch: { "4": 256 },
        };
        runner.decodeAttention.setSplitTuning(tuning);
        assertEqual(decodeChoiceFor(tuning, 1, 80).width, 256);
      });
    },
  );
}

Deno.test(
  "ModelRunner decodes equal to the float64 reference as a shorter context's split choice ends",
  GPU_TEST,
  async () => {
    // Contexts of 71 to 78 tokens follow the 78-token choice (split-K in 16-token partitions),
    // longer ones the 128-token choice (direct), under the gpu profile's fused attention: a step
    // that took the wrong choice, or lost the K/V written on the other path, fails the parity.
    const prompt = Array.from({ length: 70 }, (_, i) => (i * 29 + 3) % 500);
    const tuning: DecodeSplitTuning = {
      contextLen: 128,
      partitionByBatch: { "4": 0 },
      shorter: [{ contextLen: 78, partitionByBatch: { "4": 16 } }],
    };
    assertEqual([71, 78, 79, 86].map((c) => splitPartitionFor(tuning, 1, c)), [16, 16, 0, 0]);
    await withTinyRunner(47, "gpu", prompt, 16, 32, (runner) => {
      runner.decodeAttention.setSplitTuning(tuning);
    });
  },
);

for (
  const [name, pick, seed] of [
    ["8 x 8 register tiles", (t: TileConfig) => t.tm === 8 && t.tn === 8 && t.wx === 16, 36],
    ["double-buffered 8 x 8 tiles", (t: TileConfig) => t.tm === 8 && t.tn === 8 && t.db, 37],
  ] as const
) {
  Deno.test(
    `ModelRunner prefills and decodes equal to the float64 reference with ${name}`,
    GPU_TEST,
    async () => {
      // Every matmul of 2 rows or more (prefill chunks of 40 and 13 tokens, all but the first
      // decode steps' M = 1) runs `tiled` with 8 x 8 blocks: a 128 x 128 (or, double-buffered,
      // 128 x 64) tile of Y per workgroup, over K steps of 16.
      const prompt = Array.from({ length: 53 }, (_, i) => (i * 41 + 5) % 500);
      const tile = TILE_CANDIDATES.find(pick)!;
      await withTinyRunner(seed, "gpu", prompt, 8, 40, (runner) => {
        for (const m of runner.matmuls) {
          const all = (v: number) => Object.fromEntries(m.ops.map((op) => [shapeKey(op.shape), v]));
          m.setTuning({ tile, gemvMaxRows: all(1) });
          for (const op of m.ops) {
            const { rows, cols, format, xForm } = op.shape;
            const stride = op.buffers.weight.rowStride;
            const config = m.choose(40, rows, cols, stride, undefined, format, xForm);
            assertEqual(
              [config.variant, config.mPerGroup, config.rowsPerGroup],
              ["tiled", 128, 8 * tile.wx],
            );
          }
        }
      });
    },
  );
}

Deno.test(
  "ModelRunner prefills and decodes equal to the float64 reference with split-K tiles",
  GPU_TEST,
  async () => {
    // Every matmul of 2 rows or more runs `tiled` with its K steps split 4 ways: a 64 x 64 tile
    // for the prefill chunk of 40 tokens, 16 x 64 for the chunk of 5, each followed by the reduce
    // that adds the slices up (with the row statistic of the norm X forms).
    const prompt = Array.from({ length: 45 }, (_, i) => (i * 41 + 5) % 500);
    const find = (name: string) => TILE_CANDIDATES.find((t) => tileName(t) === name)!;
    const tile = find("16x16 bk16 sk4");
    const small = find("16x4 bk16 sk4");
    await withTinyRunner(38, "gpu", prompt, 8, 40, (runner) => {
      for (const m of runner.matmuls) {
        const all = (v: number) => Object.fromEntries(m.ops.map((op) => [shapeKey(op.shape), v]));
        m.setTuning({ tile, smallTile: { tile: small, maxRows: 8 }, gemvMaxRows: all(1) });
        for (const op of m.ops) {
          for (const [rows, want] of [[40, tile], [5, small]] as const) {
            const config = op.configFor(rows);
            assertEqual(
              [config.variant, config.split, config.tile && tileName(config.tile)],
              ["tiled", 4, tileName(want)],
            );
          }
        }
      }
    });
  },
);

Deno.test(
  "ModelRunner prefills equal to the float64 reference with the tiled and blocked prefill attention",
  GPU_TEST,
  async () => {
    // Chunks of 24 tokens: later chunks attend to the cached prefix through the chosen kernel.
    const prompt = Array.from({ length: 60 }, (_, i) => (i * 53 + 7) % 500);
    // Each GPU kernel's default shape (32 rows a workgroup here), then 16 and 8 rows.
    const names = [
      "workgroup",
      "tiled",
      "tiled br16",
      "tiled br8",
      "blocked",
      "blocked br16",
      "blocked br8",
    ];
    for (const chosen of ["tiled br8", "blocked", "blocked br8"]) {
      await withTinyRunner(33, "gpu", prompt, 8, 24, async (runner, ctx) => {
        const pre = runner.prefillAttention;
        assertEqual(pre.kernels.map((k) => k.name), names);
        assertEqual(pre.kernels.map((k) => k.config.tiledRows), [0, 32, 16, 8, 32, 16, 8]);
        assertThrows(() => pre.use("unrolled"), /this model runs workgroup or tiled or tiled br16/);
        const r = await tunePrefillAttention(ctx, pre.kernels, {
          tokens: 40,
          blockSize: 16,
          repeats: 2,
        });
        assertEqual(r.points.map((p) => p.name), names);
        assertEqual(r.name, r.points.reduce((a, p) => (p.ms < a.ms ? p : a)).name);
        await assertRejects(
          () => tunePrefillAttention(ctx, [], { tokens: 4, blockSize: 16 }),
          /0 kernels/,
        );
        // The chosen kernel runs every layer's prefill (the chunks after the tuning's overwrites).
        pre.use(chosen);
        assertEqual(runner.prefillAttention.name, chosen);
      });
    }
  },
);

Deno.test("prefillLengths() and prefillChoiceAt() choose the prefill attention by step length", () => {
  assertEqual(prefillLengths(512), [128, 512]);
  assertEqual(prefillLengths(100), [25, 100]);
  assertEqual(prefillLengths(60), [60], "a quarter below 16 tokens: one length");
  assertEqual(prefillLengths(1), [1]);
  const choice = [{ tokens: 128, name: "blocked br8" }, { tokens: 512, name: "blocked" }];
  assertEqual([1, 128, 129, 512, 4096].map((t) => prefillChoiceAt(choice, t)), [
    "blocked br8",
    "blocked br8",
    "blocked",
    "blocked",
    "blocked",
  ]);
  assertThrows(() => prefillChoiceAt([], 4), /no choice/);
  const names = ["workgroup", "blocked", "blocked br8"];
  assertEqual(
    describePrefillChoice(choice, names),
    "prefill attention blocked br8 up to 128 tokens, blocked above (of workgroup, blocked, " +
      "blocked br8; 128 and 512 tokens)",
  );
  assertEqual(
    describePrefillChoice([{ tokens: 128, name: "blocked" }, { tokens: 512, name: "blocked" }], [
      "blocked",
    ]),
    "prefill attention blocked (of blocked; 128 and 512 tokens)",
  );
  // Read back from a cache: one entry per measured length, each a compiled kernel.
  const data = JSON.parse(JSON.stringify(choice));
  assertEqual(parsePrefillChoice(data, names, [128, 512]), choice);
  assertThrows(() => parsePrefillChoice("blocked", names, [128, 512]), /one entry per length/);
  assertThrows(() => parsePrefillChoice(data, names, [512]), /one entry per length/);
  assertThrows(() => parsePrefillChoice(data, names, [64, 512]), /tokens 128, not 64/);
  assertThrows(
    () => parsePrefillChoice(data, ["workgroup", "blocked"], [128, 512]),
    /"blocked br8" is not one of workgroup,blocked/,
  );
});

Deno.test(
  "ModelRunner prefills equal to the float64 reference with the prefill attention chosen by step length",
  GPU_TEST,
  async () => {
    // Chunks of 24, 24 and 12 tokens: `blocked` runs the first two, `tiled br8` (up to 16 tokens)
    // the last, each attending to the cached prefix.
    const prompt = Array.from({ length: 60 }, (_, i) => (i * 59 + 3) % 500);
    const labels: string[] = [];
    const proto = GPUComputePassEncoder.prototype;
    const setPipeline = proto.setPipeline;
    let layers = 0;
    try {
      await withTinyRunner(34, "gpu", prompt, 6, 24, (runner) => {
        layers = runner.config.numLayers;
        const pre = runner.prefillAttention;
        pre.useChoice([{ tokens: 16, name: "tiled br8" }, { tokens: 48, name: "blocked" }]);
        assertEqual(
          [1, 16, 17, 48, 4096].map((t) => runner.prefillAttention.nameFor(t)),
          ["tiled br8", "tiled br8", "blocked", "blocked", "blocked"],
        );
        assertEqual(runner.prefillAttention.name, "blocked");
        assertThrows(() => pre.useChoice([]), /empty prefill attention choice/);
        assertThrows(
          () => pre.useChoice([{ tokens: 8, name: "nope" }]),
          /Cannot use the nope prefill attention/,
        );
        assertEqual(
          runner.prefillAttention.nameFor(12),
          "tiled br8",
          "a refused choice changes none",
        );
        // Every prefill attention pipeline the steps set, from here on.
        proto.setPipeline = function (this: GPUComputePassEncoder, p: GPUComputePipeline) {
          if (p.label.startsWith("paged_attention_prefill")) labels.push(p.label);
          return setPipeline.call(this, p);
        };
      });
    } finally {
      proto.setPipeline = setPipeline;
    }
    const kernel = (label: string) => `${label.split("/")[0]} ${label.match(/br\d+/)?.[0]}`;
    assertEqual(labels.map(kernel), [
      ...Array(2 * layers).fill("paged_attention_prefill_blocked br32"),
      ...Array(layers).fill("paged_attention_prefill_tiled br8"),
    ]);
    // `use` returns to one kernel for every length.
    await withTinyRunner(34, "gpu", prompt.slice(0, 20), 2, 24, (runner) => {
      const pre = runner.prefillAttention;
      pre.useChoice([{ tokens: 16, name: "tiled br8" }, { tokens: 48, name: "blocked" }]);
      pre.use("tiled");
      assertEqual([1, 48, 4096].map((t) => runner.prefillAttention.nameFor(t)), [
        "tiled",
        "tiled",
        "tiled",
      ]);
    });
  },
);

Deno.test(
  "ModelRunner decodes equal to the float64 reference with tuned gemv kernels: 4 rows, steps of 8, small tiles",
  GPU_TEST,
  async () => {
    // Every call site of the gpu profile's model runs gemv with 4 weight rows per invocation and
    // steps of 8 weights at M = 1 (decode), and the 16 x 32 small tile from M = 2 to 64 (the
    // prefill chunks of 8 tokens).
    const prompt = Array.from({ length: 20 }, (_, i) => (i * 29 + 3) % 500);
    await withTinyRunner(35, "gpu", prompt, 12, 8, (runner) => {
      for (const m of runner.matmuls) {
        const keys = m.ops.map((op) => shapeKey(op.shape));
        const all = (v: number) => Object.fromEntries(keys.map((k) => [k, v]));
        m.setTuning({
          tile: TILE,
          smallTile: { tile: TILE_CANDIDATES.find((t) => t.wy === 4 && t.wx === 8)!, maxRows: 64 },
          gemvMaxRows: all(1),
          gemvRows: all(4),
          gemvSteps: all(8),
        });
        for (const op of m.ops) {
          const { rows, cols, format, xForm } = op.shape;
          const stride = op.buffers.weight.rowStride;
          assertEqual(
            // K % 4 == 0 at every call site of this model: X read as vec4s too.
            m.choose(1, rows, cols, stride, undefined, format, xForm).key.endsWith("/rb4/ks8/x4"),
            true,
          );
          assertEqual(
            m.choose(8, rows, cols, stride, undefined, format, xForm).key.endsWith("t8x4k16m4n4"),
            true,
          );
        }
      }
    });
  },
);

Deno.test(
  "gpuPrefillCompiles() compiles the GPU prefill attention kernels inside error scopes",
  GPU_TEST,
  async () => {
    const qwen3 = { numHeads: 16, numKvHeads: 8, headDim: 128 };
    const gpu = await testContext({ kernelProfile: "gpu" });
    assertEqual(await gpuPrefillCompiles(gpu, qwen3, gpu.weightDtype), {
      variants: ["tiled", "blocked"],
      errors: [],
    });
    // GQA 64 fits neither kernel (at most 32 rows a workgroup): nothing to compile.
    assertEqual(
      await gpuPrefillCompiles(gpu, { numHeads: 64, numKvHeads: 1, headDim: 64 }, "f32"),
      { variants: [], errors: [] },
    );
    gpu.check();
    // Not added under the cpu profile.
    const cpu = await testContext({ kernelProfile: "cpu" });
    assertEqual(await gpuPrefillCompiles(cpu, qwen3, cpu.weightDtype), {
      variants: [],
      errors: [],
    });
  },
);

Deno.test(
  "ModelRunner decodes equal to the float64 reference with the fused decode attention off and on (gpu profile)",
  GPU_TEST,
  async () => {
    const prompt = [5, 17, 99, 3, 42, 8, 250, 11, 64, 7];
    for (const fused of [false, true]) {
      await withTinyRunner(41, "gpu", prompt, 10, 4, () => {}, fused);
    }
  },
);
