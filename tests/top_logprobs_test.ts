import { AssertionError } from "node:assert";
import { throws as assertThrows } from "node:assert/strict";
import { packTopLogprobCounts, TOP_LOGPROBS_MAX, TopLogprobs } from "../kernels/top_logprobs.ts";
import type { GpuContext } from "../gpu/context.ts";
import {
  GPU_TEST,
  ParamArena,
  poisonedF32,
  poisonedU32,
  readF32,
  readU32,
  runPass,
  testContext,
  upload,
  whole,
} from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { topLogprobsRef } from "./reference/logits_process.ts";

const QWEN_VOCAB = 151936;
/**
 * Logprob tolerance: |got - ref| <= 3e-5 * max(1, |ref|) (absolute below 1, else relative). The
 * kernel's log-sum-exp is an f32 sum over up to 151936 terms split among as few as 16
 * invocations (~9,500 terms each); 1.2e-5 was observed (seed 899929759, workgroup 16), so 1e-5
 * was too tight. A wrong normaliser (a skipped or doubled block of the row) is off by ~1e-4 or
 * more, well above this.
 */
const LOGPROB_TOL = 3e-5;
/** The CPU-adapter and GPU workgroup sizes, and one between. */
const WORKGROUPS = [16, 128, 32];

/**
 * Runs `top_logprobs` with poisoned outputs; returns ids and logprobs `[rows, k]` (`rows`:
 * `counts.length`). With `row0` > 0 the logits hold the last `rows - row0` rows only, as a later
 * sub-batch of the sampler computes them.
 */
async function runTop(
  ctx: GpuContext,
  logits: Float32Array,
  vocab: number,
  counts: number[],
  k: number,
  workgroup: number,
  row0 = 0,
): Promise<{ ids: Uint32Array; logprobs: Float32Array }> {
  const rows = counts.length;
  const arena = new ParamArena(ctx, 2);
  const logitsBuf = upload(ctx, logits, "logits");
  const countsBuf = upload(ctx, packTopLogprobCounts(counts), "counts");
  const idsBuf = poisonedU32(ctx, rows * k, "ids");
  const logprobsBuf = poisonedF32(ctx, rows * k, "logprobs");
  try {
    const op = new TopLogprobs(ctx, workgroup).bind(arena, {
      logits: whole(logitsBuf),
      counts: whole(countsBuf),
      ids: whole(idsBuf),
      logprobs: whole(logprobsBuf),
    });
    await runPass(ctx, arena, (pass) => op.encode(pass, rows - row0, vocab, k, row0));
    return {
      ids: await readU32(ctx, idsBuf, rows * k),
      logprobs: await readF32(ctx, logprobsBuf, rows * k),
    };
  } finally {
    for (const b of [logitsBuf, countsBuf, idsBuf, logprobsBuf]) b.destroy();
    arena.destroy();
  }
}

/** Checks every row: ids exact, logprobs within tolerance, entries past n still poisoned. */
function check(
  got: { ids: Uint32Array; logprobs: Float32Array },
  logits: Float32Array,
  vocab: number,
  counts: number[],
  k: number,
  context: string,
): void {
  counts.forEach((count, s) => {
    const n = Math.min(count, k, vocab);
    const want = topLogprobsRef(logits.subarray(s * vocab, (s + 1) * vocab), n);
    const ctx = `${context} row ${s} (n ${n})`;
    for (let j = 0; j < k; j++) {
      const id = got.ids[s * k + j]!;
      const lp = got.logprobs[s * k + j]!;
      if (j >= n) {
        if (id !== 0xdeadbeef || !Number.isNaN(lp)) {
          throw new AssertionError({ message: `${ctx}: entry ${j} written (${id}, ${lp})` });
        }
        continue;
      }
      const wantId = want.ids[j]!;
      const wantLp = want.logprobs[j]!;
      const lpOk = wantLp === -Infinity
        ? lp === -Infinity
        : Math.abs(lp - wantLp) <= LOGPROB_TOL * Math.max(1, Math.abs(wantLp));
      if (id !== wantId || !lpOk) {
        throw new AssertionError({
          message: `${ctx}: rank ${j} is (${id}, ${lp}), expected (${wantId}, ${wantLp})`,
        });
      }
    }
  });
}

Deno.test(
  "top_logprobs() matches the float64 reference over 151936 logits, ties by lower id",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("top_logprobs qwen");
    const v = QWEN_VOCAB;
    const counts = [20, 1, 0, 5, 20, 7, 20, 13, 20];
    const logits = new Float32Array(counts.length * v);
    for (let s = 0; s < counts.length; s++) logits.set(rng.normals(v, 3), s * v);
    // Row 4: the maximum at 4 ids, and 30 ids tied at a value ranked across the cut at 20.
    for (const i of [v - 1, 77, rng.int(0, v - 1), 0]) logits[4 * v + i] = 30;
    for (let j = 0; j < 30; j++) logits[4 * v + rng.int(0, v - 1)] = 25;
    // Row 5: very negative logits with -inf entries; row 6: all equal (ids 0..19, slow path).
    for (let i = 0; i < v; i++) logits[5 * v + i] = rng.uniform(-6e4, -5e4);
    for (let j = 0; j < 50; j++) logits[5 * v + rng.int(0, v - 1)] = -Infinity;
    logits.fill(-2.5, 6 * v, 7 * v);
    // Row 7: the top values in the last elements of the row (the tail of the strided loop).
    for (let j = 0; j < 13; j++) logits[7 * v + v - 1 - j] = 40 - j;
    // Row 8: increasing large values at every 16th id (all in one thread of a 16-wide
    // workgroup): more candidates than the list holds, the slow path at its worst.
    for (let i = 0; i < v; i += 16) logits[8 * v + i] = 10 + (10 * i) / v;
    for (const wg of WORKGROUPS) {
      const got = await runTop(ctx, logits, v, counts, TOP_LOGPROBS_MAX, wg);
      check(got, logits, v, counts, TOP_LOGPROBS_MAX, `seed ${seed} wg ${wg}`);
    }
  },
);

Deno.test(
  "top_logprobs() handles small vocabularies, k below the count and rows of -inf",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const [vocab, k] of [[7, 20], [100, 3], [1000, 20], [33, 11]] as const) {
      const { seed, rng } = testSeed(`top_logprobs ${vocab} ${k}`);
      const counts = [20, 0, 10, 2, 1, 20];
      const logits = new Float32Array(counts.length * vocab);
      for (let s = 0; s < counts.length; s++) {
        // Few distinct values: many ties everywhere.
        for (let i = 0; i < vocab; i++) logits[s * vocab + i] = rng.int(-3, 3) * 0.5;
      }
      // Row 3: one finite logit, the rest -inf (logprobs 0 and -inf).
      logits.fill(-Infinity, 3 * vocab, 4 * vocab);
      logits[3 * vocab + vocab - 1] = 1;
      for (const wg of WORKGROUPS) {
        const got = await runTop(ctx, logits, vocab, counts, k, wg);
        check(got, logits, vocab, counts, k, `seed ${seed} vocab ${vocab} k ${k} wg ${wg}`);
      }
    }
  },
);

Deno.test(
  "top_logprobs() with row0 reads counts and writes rows row0 + s for logits row s",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("top_logprobs row0");
    const vocab = 1000;
    const k = 6;
    // Rows 0..2 belong to an earlier sub-batch: their counts ask for entries, yet nothing may
    // be written there.
    const counts = [6, 6, 6, 4, 0, 6, 1];
    const row0 = 3;
    const logits = rng.normals((counts.length - row0) * vocab, 3);
    for (const wg of [16, 128]) {
      const got = await runTop(ctx, logits, vocab, counts, k, wg, row0);
      const context = `seed ${seed} wg ${wg}`;
      for (let i = 0; i < row0 * k; i++) {
        if (got.ids[i] !== 0xdeadbeef || !Number.isNaN(got.logprobs[i])) {
          throw new AssertionError({ message: `${context}: row ${Math.floor(i / k)} written` });
        }
      }
      check(
        { ids: got.ids.subarray(row0 * k), logprobs: got.logprobs.subarray(row0 * k) },
        logits,
        vocab,
        counts.slice(row0),
        k,
        context,
      );
    }
  },
);

Deno.test("top_logprobs() rejects invalid counts, k and workgroup sizes", GPU_TEST, async () => {
  const ctx = await testContext();
  assertThrows(() => packTopLogprobCounts([21]), RangeError);
  assertThrows(() => packTopLogprobCounts([1.5]), RangeError);
  assertThrows(() => new TopLogprobs(ctx, 24), RangeError);
  assertThrows(() => new TopLogprobs(ctx, 8), RangeError);
  assertThrows(() => new TopLogprobs(ctx, 256), RangeError);
  const arena = new ParamArena(ctx, 1);
  const buf = poisonedU32(ctx, 4);
  try {
    const op = new TopLogprobs(ctx, 16).bind(arena, {
      logits: whole(buf),
      counts: whole(buf),
      ids: whole(buf),
      logprobs: whole(buf),
    });
    const encoder = ctx.device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    assertThrows(() => op.encode(pass, 1, 4, 0), RangeError);
    assertThrows(() => op.encode(pass, 1, 4, 21), RangeError);
    assertThrows(() => op.encode(pass, 1, 0, 20), RangeError);
    assertThrows(() => op.encode(pass, 1, 4, 20, -1), RangeError);
    assertThrows(() => op.encode(pass, 1, 4, 20, 0.5), RangeError);
    pass.end();
    ctx.device.queue.submit([encoder.finish()]);
  } finally {
    buf.destroy();
    arena.destroy();
  }
});
