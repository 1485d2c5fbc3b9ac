import assert from "node:assert/strict";
import { defaultVocabRange } from "../bench/serve/server_models.ts";
import { arrivalTimesMs, parseRange, planRequests, Rng } from "../bench/serve/workload.ts";

/** Mean and coefficient of variation (std / mean) of the gaps between `times`. */
function gapStats(times: readonly number[]): { mean: number; cv: number } {
  const gaps = times.slice(1).map((t, i) => t - times[i]!);
  const mean = gaps.reduce((s, g) => s + g, 0) / gaps.length;
  const variance = gaps.reduce((s, g) => s + (g - mean) ** 2, 0) / gaps.length;
  return { mean, cv: Math.sqrt(variance) / mean };
}

Deno.test("arrivalTimesMs() with burstiness 1 is a Poisson process: mean gap 1/rate, CV 1", () => {
  const seed = 20240601;
  const times = arrivalTimesMs(4001, 50, 1, new Rng(seed));
  assert.equal(times[0], 0, "the first request is sent at once");
  assert.ok(times.every((t, i) => i === 0 || t >= times[i - 1]!), "times never decrease");
  const { mean, cv } = gapStats(times);
  // 4000 exponential gaps of mean 20 ms: the sample mean's standard error is 20/sqrt(4000)
  // = 0.32 ms (1.6%), so a 5% tolerance is about 3 standard errors; the CV of an exponential
  // is exactly 1 (tolerance 0.08).
  assert.ok(Math.abs(mean - 20) < 1, `mean gap ${mean} ms, expected 20 (seed ${seed})`);
  assert.ok(Math.abs(cv - 1) < 0.08, `gap CV ${cv}, expected 1 (seed ${seed})`);
});

Deno.test("arrivalTimesMs() burstiness sets the gamma shape: CV 1/sqrt(b), same mean", () => {
  const seed = 7;
  for (const [b, cvExpected] of [[4, 0.5], [0.25, 2]] as const) {
    const { mean, cv } = gapStats(arrivalTimesMs(4001, 10, b, new Rng(seed)));
    // Mean gap 100 ms for 10 req/s whatever the shape; CV of gamma(b) gaps = 1/sqrt(b).
    assert.ok(Math.abs(mean - 100) < 100 * 0.08, `b=${b}: mean gap ${mean} (seed ${seed})`);
    assert.ok(
      Math.abs(cv - cvExpected) < 0.15 * cvExpected,
      `b=${b}: gap CV ${cv}, expected ${cvExpected} (seed ${seed})`,
    );
  }
  assert.deepEqual(arrivalTimesMs(3, Infinity, 1, new Rng(1)), [0, 0, 0]);
  assert.throws(() => arrivalTimesMs(3, 0, 1, new Rng(1)), RangeError);
});

Deno.test("planRequests() draws lengths in range, token ids in the vocab range, deterministically", () => {
  const options = {
    count: 200,
    inputLen: { min: 3, max: 9 },
    outputLen: { min: 5, max: 6 },
    promptKind: "tokens" as const,
    vocab: { min: 10, max: 20 },
  };
  const a = planRequests(options, new Rng(42));
  assert.deepEqual(planRequests(options, new Rng(42)), a, "same seed, same workload");
  assert.notDeepEqual(planRequests(options, new Rng(43)), a, "another seed, another workload");
  const lens = new Set<number>();
  for (const r of a) {
    assert.ok(Array.isArray(r.prompt));
    assert.equal(r.prompt.length, r.promptTokens);
    lens.add(r.promptTokens);
    assert.ok(r.promptTokens >= 3 && r.promptTokens <= 9);
    assert.ok(r.maxTokens === 5 || r.maxTokens === 6);
    for (const id of r.prompt) assert.ok(Number.isInteger(id) && id >= 10 && id <= 20, `id ${id}`);
  }
  assert.equal(lens.size, 7, "every length 3..9 occurs in 200 draws");
  const words = planRequests({ ...options, promptKind: "words" }, new Rng(1));
  for (const r of words) {
    assert.equal(typeof r.prompt, "string");
    assert.equal(String(r.prompt).split(" ").length, r.promptTokens);
  }
});

Deno.test("parseRange() accepts N and A:B and rejects anything else with a RangeError", () => {
  assert.deepEqual(parseRange("128", "--input-len"), { min: 128, max: 128 });
  assert.deepEqual(parseRange("100:1024", "--input-len"), { min: 100, max: 1024 });
  assert.throws(() => parseRange("9:3", "--input-len"), /--input-len range 9:3 is empty/);
  assert.throws(() => parseRange("0", "--output-len"), /--output-len must be at least 1, got 0/);
  assert.throws(() => parseRange("1.5", "--input-len"), RangeError);
  assert.throws(() => parseRange("a:b", "--input-len"), /must be N or A:B/);
});

Deno.test("defaultVocabRange() draws prompt ids from the served vocabulary when it is known", () => {
  assert.deepEqual(defaultVocabRange(null), [100, 5000]);
  assert.deepEqual(defaultVocabRange(151936), [100, 5000]);
  assert.deepEqual(defaultVocabRange(512), [100, 511]);
  assert.deepEqual(defaultVocabRange(64), [0, 63]);
});
