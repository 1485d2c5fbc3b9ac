import { AssertionError } from "node:assert";
import { deepStrictEqual as assertEquals, throws as assertThrows } from "node:assert/strict";
import {
  packSampleParams,
  Sample,
  SAMPLE_PARAMS_BYTES,
  type SampleParams,
  type SampleVariant,
} from "../kernels/sample.ts";
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
import { Rng, testSeed } from "./support/random.ts";
import {
  argmaxRef,
  chiSquareCritical001,
  chiSquareRef,
  filteredDistributionRef,
  logSoftmaxAtRef,
  type SampleRefParams,
  topPBreakpointsRef,
} from "./reference/sample.ts";

const QWEN_VOCAB = 151936;
/** Logprob tolerance: |got - ref| <= 1e-4 * max(1, |ref|) (absolute below 1, else relative). */
const LOGPROB_TOL = 1e-4;

/** Both compiled shapes: the CPU-adapter one and the GPU one (see sampleVariantFor). */
const VARIANTS: SampleVariant[] = [{ workgroup: 16, buckets: 128 }, {
  workgroup: 128,
  buckets: 16,
}];
const tag = (v: SampleVariant) => `wg${v.workgroup}/nb${v.buckets}`;

/**
 * Runs `sample` on `rows` (each `vocab` logits) with per-row params; returns tokens, logprobs
 * (`params.length` each, poisoned where not written). With `row0` > 0 the logits hold the rows
 * of `params` from `row0` on only, as a later sub-batch of the sampler computes them.
 */
async function runSample(
  ctx: GpuContext,
  logits: Float32Array,
  vocab: number,
  params: SampleParams[],
  variant: SampleVariant,
  row0 = 0,
): Promise<{ tokens: Uint32Array; logprobs: Float32Array }> {
  const numSeqs = params.length;
  const arena = new ParamArena(ctx, 2);
  const logitsBuf = upload(ctx, logits, "logits");
  const paramsBuf = upload(ctx, new Uint32Array(packSampleParams(params)), "sample params");
  const tokensBuf = poisonedU32(ctx, numSeqs, "tokens");
  const logprobsBuf = poisonedF32(ctx, numSeqs, "logprobs");
  try {
    const op = new Sample(ctx, variant).bind(arena, {
      logits: whole(logitsBuf),
      params: whole(paramsBuf),
      tokens: whole(tokensBuf),
      logprobs: whole(logprobsBuf),
    });
    await runPass(ctx, arena, (pass) => op.encode(pass, numSeqs - row0, vocab, row0));
    return {
      tokens: await readU32(ctx, tokensBuf, numSeqs),
      logprobs: await readF32(ctx, logprobsBuf, numSeqs),
    };
  } finally {
    for (const b of [logitsBuf, paramsBuf, tokensBuf, logprobsBuf]) b.destroy();
    arena.destroy();
  }
}

function assertLogprob(got: number, row: ArrayLike<number>, token: number, context: string) {
  const want = logSoftmaxAtRef(row, token);
  if (!(Math.abs(got - want) <= LOGPROB_TOL * Math.max(1, Math.abs(want)))) {
    throw new AssertionError({
      message: `${context}: logprob of token ${token} is ${got}, expected ${want}`,
    });
  }
}

function rowOf(logits: Float32Array, vocab: number, s: number): Float32Array {
  return logits.subarray(s * vocab, (s + 1) * vocab);
}

Deno.test(
  "sample() greedy rows equal the argmax over 151936 logits, lowest index on ties",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("sample greedy");
    const v = QWEN_VOCAB;
    const rows = 7;
    const logits = new Float32Array(rows * v);
    // 0: normal logits.
    logits.set(rng.normals(v, 3), 0);
    // 1: a maximum repeated at three indices, the lowest in another thread's stride.
    const r1 = rng.normals(v, 3);
    const hi = 40;
    const tieIdx = [rng.int(1000, 50000), rng.int(50001, 100000), v - 1];
    for (const i of tieIdx) r1[i] = hi;
    logits.set(r1, v);
    // 2: very negative logits with -Infinity entries.
    const r2 = rng.array(v, -6e4, -5e4);
    for (let j = 0; j < 50; j++) r2[rng.int(0, v - 1)] = -Infinity;
    logits.set(r2, 2 * v);
    // 3: all equal -> token 0.
    logits.fill(1.5, 3 * v, 4 * v);
    // 4: the maximum in the tail (last index).
    const r4 = rng.normals(v, 2);
    r4[v - 1] = 20;
    logits.set(r4, 4 * v);
    // 5: the maximum at index 0 tied with the last index; a huge range of values.
    const r5 = rng.array(v, -1e30, 10);
    r5[0] = 11;
    r5[v - 1] = 11;
    logits.set(r5, 5 * v);
    // 6: a sharp distribution (logprob close to 0).
    const r6 = rng.normals(v, 1);
    r6[rng.int(0, v - 1)] = 60;
    logits.set(r6, 6 * v);

    for (const variant of VARIANTS) {
      const { tokens, logprobs } = await runSample(ctx, logits, v, Array(rows).fill({}), variant);
      const context = `seed ${seed} ${tag(variant)}`;
      for (let s = 0; s < rows; s++) {
        const row = rowOf(logits, v, s);
        assertEquals(tokens[s], argmaxRef(row), `${context} row ${s}: greedy token`);
        assertLogprob(logprobs[s]!, row, tokens[s]!, `${context} row ${s}`);
      }
      assertEquals(tokens[1], Math.min(...tieIdx), `${context}: lowest tied index`);
      assertEquals(tokens[3], 0, `${context}: all-equal row`);
    }
  },
);

Deno.test(
  "sample() mixes greedy and random rows in one batch over 151936 logits",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("sample mixed");
    const v = QWEN_VOCAB;
    const params: SampleParams[] = [
      {},
      { temperature: 1, topK: 1, seed: rng.int(0, 2 ** 32 - 1) },
      { temperature: 0.8, topK: 50, seed: rng.int(0, 2 ** 32 - 1), counter: 3 },
      { temperature: 1, topP: 0.9, seed: rng.int(0, 2 ** 32 - 1) },
      { temperature: 1, minP: 0.1, seed: rng.int(0, 2 ** 32 - 1) },
      { temperature: 0 },
      { temperature: 0.5, topK: 20, topP: 0.5, seed: rng.int(0, 2 ** 32 - 1) },
      { temperature: 2, seed: rng.int(0, 2 ** 32 - 1), counter: 99 },
      { temperature: 0.7, topK: 1000, topP: 0.95, minP: 0.02, seed: rng.int(0, 2 ** 32 - 1) },
    ];
    const logits = new Float32Array(params.length * v);
    for (let s = 0; s < params.length; s++) {
      const row = rng.normals(v, 2.5);
      for (let j = 0; j < 20; j++) row[rng.int(0, v - 1)] = rng.uniform(8, 14);
      logits.set(row, s * v);
    }
    for (const variant of VARIANTS) {
      const { tokens, logprobs } = await runSample(ctx, logits, v, params, variant);
      for (let s = 0; s < params.length; s++) {
        const p = params[s]!;
        const row = rowOf(logits, v, s);
        const context = `seed ${seed} ${tag(variant)} row ${s} ${JSON.stringify(p)}`;
        const token = tokens[s]!;
        if (!(token < v)) throw new AssertionError({ message: `${context}: token ${token}` });
        if ((p.temperature ?? 0) === 0) {
          assertEquals(token, argmaxRef(row), `${context}: greedy`);
        } else {
          const ref: SampleRefParams = { ...p, temperature: p.temperature ?? 0 };
          const prob = filteredDistributionRef(row, ref)[token]!;
          if (!(prob > 0)) {
            throw new AssertionError({ message: `${context}: drew filtered-out token ${token}` });
          }
        }
        if (p.topK === 1) assertEquals(token, argmaxRef(row), `${context}: top-k 1`);
        assertLogprob(logprobs[s]!, row, token, context);
      }
    }
  },
);

Deno.test(
  "sample() is reproducible for a seed and counter and varies with the counter",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("sample reproducible");
    const v = 1000;
    const rows = 96;
    const base = rng.array(v, -1, 1);
    const logits = new Float32Array(rows * v);
    for (let s = 0; s < rows; s++) logits.set(base, s * v);
    const streamSeed = rng.int(0, 2 ** 32 - 1);
    const params: SampleParams[] = [];
    // 0..31: same seed and counter; 32..63: counters 0..31; 64..95: seeds differ, counter 5.
    for (let s = 0; s < 32; s++) params.push({ temperature: 1, seed: streamSeed, counter: 7 });
    for (let s = 0; s < 32; s++) {
      params.push({ temperature: 1, topP: 0.9, seed: streamSeed, counter: s });
    }
    for (let s = 0; s < 32; s++) {
      params.push({ temperature: 1, seed: (streamSeed + s + 1) >>> 0, counter: 5 });
    }
    const a = await runSample(ctx, logits, v, params, VARIANTS[0]!);
    const b = await runSample(ctx, logits, v, params, VARIANTS[1]!);
    // The draw does not depend on the compiled shape either.
    assertEquals(Array.from(a.tokens), Array.from(b.tokens), `seed ${seed}: two runs differ`);
    for (let s = 1; s < 32; s++) {
      assertEquals(a.tokens[s], a.tokens[0], `seed ${seed} row ${s}: same seed and counter`);
    }
    const distinct = (from: number) => new Set(a.tokens.subarray(from, from + 32)).size;
    // 32 draws from ~900 near-uniform tokens: fewer than 24 distinct has probability < 1e-9.
    for (const from of [32, 64]) {
      if (distinct(from) < 24) {
        throw new AssertionError({
          message: `seed ${seed} rows ${from}..${from + 31}: only ${
            distinct(from)
          } distinct tokens`,
        });
      }
    }
  },
);

/** Fixed logits with repeated values (ties at filter cuts) for the goodness-of-fit tests. */
function fitLogits(vocab: number): Float32Array {
  const rng = new Rng(0x51e1d);
  return Float32Array.from(rng.normals(vocab, 1.6), (x) => Math.round(x * 4) / 4);
}

/** Distinct values of `row`, descending. */
function distinctDesc(row: ArrayLike<number>): number[] {
  return [...new Set(Array.from(row))].sort((a, b) => b - a);
}

Deno.test(
  "sample() draws follow the filtered softmax (chi-square, p = 0.001, fixed seed) for temperature, top-k, top-p and min-p",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const v = 40;
    const draws = 20000;
    const row = fitLogits(v);
    const values = distinctDesc(row);
    const sorted = Array.from(row).sort((a, b) => b - a);
    // top-k whose k-th value is tied with the (k+1)-th: every tied token is kept.
    let tieK = 5;
    while (sorted[tieK - 1] !== sorted[tieK]) tieK++;
    // min-p cut half-way between the (i+1)-th and (i+2)-th distinct values at temperature t.
    const minPFor = (t: number, i: number) =>
      Math.exp(((values[i]! + values[i + 1]!) / 2 - values[0]!) / t);
    // top-p half-way between two breakpoints of the (filtered) distribution.
    const topPFor = (survivors: number[], t: number, i: number) => {
      const bp = topPBreakpointsRef(survivors, t);
      return (bp[i]! + bp[i + 1]!) / 2;
    };
    const cases: SampleRefParams[] = [
      { temperature: 0.8 },
      { temperature: 1.2, topK: tieK },
      { temperature: 1, topP: topPFor(Array.from(row), 1, 4) },
      { temperature: 0.7, minP: minPFor(0.7, 6) },
    ];
    {
      // min-p, then top-k, then top-p on what survives both.
      const t = 1.5;
      const minP = minPFor(t, 12);
      const survivors = filteredDistributionRef(row, { temperature: t, minP, topK: 10 });
      const kept = Array.from(row).filter((_, i) => survivors[i]! > 0);
      cases.push({ temperature: t, minP, topK: 10, topP: topPFor(kept, t, 3) });
    }
    const logits = new Float32Array(draws * v);
    for (let s = 0; s < draws; s++) logits.set(row, s * v);
    for (const c of cases) {
      // One compiled shape here; the next test shows the other one draws the same tokens.
      for (const variant of [VARIANTS[0]!]) {
        const params = Array.from(
          { length: draws },
          (_, s) => ({ ...c, seed: 0x5eed, counter: s }),
        );
        const { tokens, logprobs } = await runSample(ctx, logits, v, params, variant);
        const expected = filteredDistributionRef(row, c);
        const counts = new Array<number>(v).fill(0);
        for (const t of tokens) {
          if (!(t < v)) throw new AssertionError({ message: `${JSON.stringify(c)}: token ${t}` });
          counts[t]!++;
        }
        const context = `fixed seed 0x5eed ${tag(variant)} ${JSON.stringify(c)}`;
        for (let i = 0; i < v; i++) {
          if (expected[i] === 0 && counts[i]! > 0) {
            throw new AssertionError({
              message: `${context}: filtered-out token ${i} drawn ${counts[i]} times`,
            });
          }
        }
        const { statistic, dof } = chiSquareRef(counts, expected);
        const critical = chiSquareCritical001(dof);
        if (!(statistic < critical)) {
          throw new AssertionError({
            message: `${context}: chi-square ${statistic.toFixed(2)} >= ${
              critical.toFixed(2)
            } (dof ${dof}); counts ${counts}`,
          });
        }
        for (let s = 0; s < draws; s += 997) assertLogprob(logprobs[s]!, row, tokens[s]!, context);
      }
    }
  },
);

Deno.test(
  "sample() draws the same tokens with the CPU-adapter and GPU kernel shapes",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("sample variants agree");
    const v = 40;
    const rows = 2000;
    const row = fitLogits(v);
    const logits = new Float32Array(rows * v);
    for (let s = 0; s < rows; s++) logits.set(row, s * v);
    const params = Array.from({ length: rows }, (_, s): SampleParams => ({
      temperature: rng.uniform(0.3, 2),
      topK: rng.int(0, 12),
      topP: rng.next() < 0.5 ? 1 : rng.uniform(0.05, 1),
      minP: rng.next() < 0.5 ? 0 : rng.uniform(0, 0.5),
      seed: rng.int(0, 2 ** 32 - 1),
      counter: s,
    }));
    const a = await runSample(ctx, logits, v, params, VARIANTS[0]!);
    const b = await runSample(ctx, logits, v, params, VARIANTS[1]!);
    for (let s = 0; s < rows; s++) {
      const context = `seed ${seed} row ${s} ${JSON.stringify(params[s])}`;
      assertEquals(a.tokens[s], b.tokens[s], `${context}: shapes disagree`);
      const ref: SampleRefParams = { ...params[s]!, temperature: params[s]!.temperature ?? 0 };
      if (!(filteredDistributionRef(row, ref)[a.tokens[s]!]! > 0)) {
        throw new AssertionError({ message: `${context}: drew filtered-out ${a.tokens[s]}` });
      }
    }
  },
);

/** Rank of `row[target]`: 1 + the number of logits strictly greater than it (float64). */
function rankRef(row: ArrayLike<number>, target: number): number {
  let rank = 1;
  for (let i = 0; i < row.length; i++) if (row[i]! > row[target]!) rank++;
  return rank;
}

Deno.test(
  "sample() returns the target's rank and logprob when a row is forced, beside sampled rows",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("sample forced");
    for (const v of [1, 7, 1000, 4099]) {
      const rows: Float32Array[] = [];
      const params: SampleParams[] = [];
      /** Rank the case forces by construction (checked on top of the reference). */
      const expectRank: (number | undefined)[] = [];
      const add = (row: Float32Array, p: SampleParams, rank?: number) => {
        rows.push(row);
        params.push(p);
        expectRank.push(rank);
      };
      const fresh = () => rng.normals(v, 3);
      const pick = () => rng.int(0, v - 1);
      /** Up to `n` distinct random indices other than `t`. */
      const others = (t: number, n: number) =>
        rng.permutation(v).filter((i) => i !== t).slice(0, n);
      const u32 = () => rng.int(0, 2 ** 32 - 1);
      {
        add(fresh(), { target: pick() });
      }
      {
        // Ties with the target's logit: only strictly greater logits count.
        const r = fresh();
        const t = pick();
        for (const i of others(t, 5)) r[i] = r[t]!;
        add(r, { target: t });
      }
      {
        // The maximum, tied with other indices (some lower): rank 1.
        const r = fresh();
        const t = pick();
        r[t] = Math.max(...r) + 1;
        for (const i of others(t, 2)) r[i] = r[t]!;
        add(r, { target: t }, 1);
      }
      {
        // The minimum, tied with other indices: rank = vocab - ties + 1.
        const r = fresh();
        const t = pick();
        r[t] = Math.min(...r) - 1;
        const ties = others(t, 3);
        for (const i of ties) r[i] = r[t]!;
        add(r, { target: t }, v - (ties.length + 1) + 1);
      }
      {
        // -inf logits elsewhere (never counted), the target the smallest finite logit.
        const r = fresh();
        const t = pick();
        const dead = others(t, Math.floor(v / 8) + 1);
        for (const i of dead) r[i] = -Infinity;
        r[t] = -20;
        add(r, { target: t }, v - dead.length);
      }
      {
        // A -inf target: logprob -inf, rank 1 + the finite logits (vocab 1: an all -inf row).
        const r = fresh();
        const t = pick();
        r[t] = -Infinity;
        add(r, { target: t }, v);
      }
      {
        // The sampling fields are ignored (top-k 1 would otherwise give the argmax).
        add(fresh(), {
          target: pick(),
          temperature: 0.7,
          topK: 1,
          topP: 0.5,
          minP: 0.5,
          seed: u32(),
          counter: 9,
        });
      }
      // Out-of-range targets: rank 0, logprob -inf, no read.
      add(fresh(), { target: v }, 0);
      add(fresh(), { target: 0xfffffffe }, 0);
      // Sampled rows in the same dispatch.
      add(fresh(), {});
      add(fresh(), { temperature: 0 });
      add(fresh(), { temperature: 1, seed: u32(), counter: rng.int(0, 100) });
      add(fresh(), { temperature: 0.8, topK: 5, topP: 0.9, seed: u32(), counter: 1 });

      // Interleave forced and sampled rows.
      const order = rng.permutation(rows.length);
      const logits = new Float32Array(rows.length * v);
      order.forEach((from, s) => logits.set(rows[from]!, s * v));
      const batch = order.map((from) => params[from]!);
      const sampledRows = batch.flatMap((p, s) => p.target === undefined ? [s] : []);
      const sampledLogits = new Float32Array(sampledRows.length * v);
      sampledRows.forEach((s, j) => sampledLogits.set(rowOf(logits, v, s), j * v));

      for (const variant of VARIANTS) {
        const { tokens, logprobs } = await runSample(ctx, logits, v, batch, variant);
        // The sampled rows alone: the forced rows beside them must not change them.
        const alone = await runSample(
          ctx,
          sampledLogits,
          v,
          sampledRows.map((s) => batch[s]!),
          variant,
        );
        for (let s = 0; s < batch.length; s++) {
          const p = batch[s]!;
          const row = rowOf(logits, v, s);
          const context = `seed ${seed} ${tag(variant)} vocab ${v} row ${s} ${JSON.stringify(p)}`;
          const token = tokens[s]!;
          if (p.target === undefined) {
            const j = sampledRows.indexOf(s);
            assertEquals(
              [token, logprobs[s]],
              [alone.tokens[j], alone.logprobs[j]],
              `${context}: differs from the same row sampled without forced rows`,
            );
            if (!(token < v)) throw new AssertionError({ message: `${context}: token ${token}` });
            if ((p.temperature ?? 0) === 0) {
              assertEquals(token, argmaxRef(row), `${context}: greedy`);
            } else {
              const ref: SampleRefParams = { ...p, temperature: p.temperature ?? 0 };
              if (!(filteredDistributionRef(row, ref)[token]! > 0)) {
                throw new AssertionError({ message: `${context}: drew filtered-out ${token}` });
              }
            }
            assertLogprob(logprobs[s]!, row, token, context);
            continue;
          }
          const forced = expectRank[order[s]!];
          if (p.target >= v) {
            assertEquals([token, logprobs[s]], [0, -Infinity], `${context}: out of range`);
            continue;
          }
          assertEquals(token, rankRef(row, p.target), `${context}: rank`);
          if (forced !== undefined) assertEquals(token, forced, `${context}: constructed rank`);
          if (row[p.target] === -Infinity) {
            assertEquals(logprobs[s], -Infinity, `${context}: logprob of a -inf target`);
          } else {
            // Tolerance LOGPROB_TOL: 1e-4 absolute (relative beyond |ref| = 1).
            assertLogprob(logprobs[s]!, row, p.target, context);
          }
        }
      }
    }
  },
);

Deno.test(
  "sample() with row0 reads record row0 + s and writes token and logprob row0 + s for logits row s",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("sample row0");
    const vocab = 777;
    const row0 = 5;
    const n = 6;
    const logits = rng.normals(n * vocab, 3);
    // Records 0..4 belong to an earlier sub-batch (forced rows: a kernel reading them for
    // logits rows 0.. would return ranks); records 5.. alternate greedy and forced.
    const targets = Array.from({ length: n }, () => rng.int(0, vocab - 1));
    const params: SampleParams[] = [
      ...Array.from({ length: row0 }, () => ({ target: 0 })),
      ...targets.map((target, s) => (s % 2 === 0 ? { temperature: 0 } : { target })),
    ];
    for (const v of VARIANTS) {
      const got = await runSample(ctx, logits, vocab, params, v, row0);
      const context = `seed ${seed} ${tag(v)}`;
      for (let r = 0; r < row0; r++) {
        if (got.tokens[r] !== 0xdeadbeef || !Number.isNaN(got.logprobs[r])) {
          throw new AssertionError({ message: `${context}: row ${r} written` });
        }
      }
      for (let s = 0; s < n; s++) {
        const row = rowOf(logits, vocab, s);
        const token = got.tokens[row0 + s]!;
        if (s % 2 === 0) {
          assertEquals(token, argmaxRef(row), `${context} row ${s}`);
          assertLogprob(got.logprobs[row0 + s]!, row, token, `${context} row ${s}`);
        } else {
          const t = targets[s]!;
          const rank = 1 + Array.from(row).filter((l) => l > row[t]!).length;
          assertEquals(token, rank, `${context} row ${s} rank`);
          assertLogprob(got.logprobs[row0 + s]!, row, t, `${context} row ${s}`);
        }
      }
    }
  },
);

Deno.test("packSampleParams() writes the documented layout and rejects bad values", () => {
  const bytes = packSampleParams([
    {},
    { temperature: 0.5, topK: 40, topP: 0.9, minP: 0.05, seed: 0xfffffffe, counter: 12 },
    { target: 0 },
    { temperature: 0.7, seed: 3, target: 0xfffffffe },
    { target: 151935 },
  ]);
  assertEquals(SAMPLE_PARAMS_BYTES, 28);
  assertEquals(bytes.byteLength, 5 * SAMPLE_PARAMS_BYTES);
  const f32 = new Float32Array(bytes);
  const u32 = new Uint32Array(bytes);
  const record = (s: number) => {
    const w = s * 7;
    return [f32[w], u32[w + 1], f32[w + 2], f32[w + 3], u32[w + 4], u32[w + 5], u32[w + 6]];
  };
  assertEquals(record(0), [0, 0, 1, 0, 0, 0, 0xffffffff]);
  assertEquals(
    record(1),
    [0.5, 40, Math.fround(0.9), Math.fround(0.05), 0xfffffffe, 12, 0xffffffff],
  );
  assertEquals(record(2), [0, 0, 1, 0, 0, 0, 0]);
  assertEquals(record(3), [0.7, 0, 1, 0, 3, 0, 0xfffffffe].map((x, i) => i ? x : Math.fround(x)));
  assertEquals(record(4), [0, 0, 1, 0, 0, 0, 151935]);
  for (const target of [-1, 1.5, 0xffffffff, 2 ** 32, NaN]) {
    assertThrows(
      () => packSampleParams([{}, { target }]),
      (e: unknown) =>
        e instanceof RangeError &&
        e.message === `Cannot pack sampling parameters: sequence 1 has target ${target}`,
    );
  }
  assertThrows(() => packSampleParams([{ topP: 0 }]), RangeError);
  assertThrows(() => packSampleParams([{ minP: 1.5 }]), RangeError);
  assertThrows(() => packSampleParams([{ temperature: -1 }]), RangeError);
  assertThrows(() => packSampleParams([{ topK: 2.5 }]), RangeError);
  assertThrows(() => packSampleParams([{ seed: 2 ** 32 }]), RangeError);
  assertThrows(() => packSampleParams([{}, {}], new ArrayBuffer(2 * 28 - 4)), RangeError);
});
