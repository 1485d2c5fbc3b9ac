import assert from "node:assert/strict";
import {
  levelMetrics,
  meetsSlo,
  percentile,
  type RequestResult,
  summarize,
  tpotMs,
} from "../bench/serve/metrics.ts";
import { parsePreemptions } from "../bench/serve/server_counters.ts";
import { analyze } from "../bench/serve/analysis.ts";
import type { LevelReport } from "../bench/serve/report.ts";

/** Asserts |a - b| <= 1e-9 * max(1, |b|). */
function near(actual: number | null | undefined, expected: number, what: string): void {
  assert.ok(
    actual !== null && actual !== undefined &&
      Math.abs(actual - expected) <= 1e-9 * Math.max(1, Math.abs(expected)),
    `${what}: got ${actual}, expected ${expected}`,
  );
}

function req(over: Partial<RequestResult> & { index: number }): RequestResult {
  return {
    ok: true,
    startMs: 0,
    ttftMs: 0,
    e2eMs: 0,
    itlMs: [],
    promptTokens: 0,
    outputTokens: 0,
    usageReported: true,
    ...over,
  };
}

// Three successful requests and one failure, over a 4000 ms level:
// r0: TTFT 100, E2E 1000, 10 tokens, 9 gaps of 100 -> TPOT (1000 - 100) / (10 - 1) = 100
// r1: TTFT 200, E2E 2200, 5 tokens, 4 gaps of 500 -> TPOT (2200 - 200) / (5 - 1) = 500
// r2: TTFT 300, E2E 300, 1 token, no gaps        -> TPOT undefined
// r3: failed ("HTTP 500: boom")
const LEVEL: RequestResult[] = [
  req({
    index: 0,
    ttftMs: 100,
    e2eMs: 1000,
    outputTokens: 10,
    promptTokens: 50,
    itlMs: Array(9).fill(100),
  }),
  req({
    index: 1,
    ttftMs: 200,
    e2eMs: 2200,
    outputTokens: 5,
    promptTokens: 30,
    itlMs: Array(4).fill(500),
  }),
  req({ index: 2, ttftMs: 300, e2eMs: 300, outputTokens: 1, promptTokens: 20 }),
  req({ index: 3, ok: false, error: "HTTP 500: boom", ttftMs: null, e2eMs: 5 }),
];

Deno.test("percentile() interpolates linearly between order statistics like numpy", () => {
  const x = [10, 20, 30, 40];
  // rank = p/100 * (n - 1) with n = 4:
  near(percentile(x, 0), 10, "p0"); // rank 0
  near(percentile(x, 50), 25, "p50"); // rank 1.5 -> 20 + 0.5 * 10
  near(percentile(x, 95), 38.5, "p95"); // rank 2.85 -> 30 + 0.85 * 10
  near(percentile(x, 99), 39.7, "p99"); // rank 2.97 -> 30 + 0.97 * 10
  near(percentile(x, 100), 40, "p100"); // rank 3
  near(percentile([7], 95), 7, "single sample");
  assert.throws(() => percentile([], 50), RangeError);
  assert.throws(() => percentile(x, 101), RangeError);
});

Deno.test("summarize() gives min, mean, p50, p95, p99 and max of unsorted samples", () => {
  const s = summarize([300, 100, 200])!;
  // sorted [100, 200, 300]; mean 200; p95 rank 1.9 -> 200 + 0.9 * 100; p99 rank 1.98.
  assert.equal(s.count, 3);
  near(s.min, 100, "min");
  near(s.mean, 200, "mean");
  near(s.p50, 200, "p50");
  near(s.p95, 290, "p95");
  near(s.p99, 298, "p99");
  near(s.max, 300, "max");
  assert.equal(summarize([]), null);
});

Deno.test("tpotMs() is (E2E - TTFT) / (output tokens - 1), undefined below 2 tokens", () => {
  near(tpotMs(LEVEL[0]!), 100, "r0");
  near(tpotMs(LEVEL[1]!), 500, "r1");
  assert.equal(tpotMs(LEVEL[2]!), null);
  assert.equal(tpotMs(LEVEL[3]!), null);
});

Deno.test("levelMetrics() computes throughput, TTFT, TPOT, ITL and E2E from fixed timings", () => {
  const m = levelMetrics(LEVEL, 4000);
  assert.equal(m.totalRequests, 4);
  assert.equal(m.successful, 3);
  assert.equal(m.failed, 1);
  near(m.durationS, 4, "duration");
  near(m.requestThroughput, 0.75, "req/s"); // 3 ok / 4 s
  assert.equal(m.totalOutputTokens, 16); // 10 + 5 + 1
  assert.equal(m.totalInputTokens, 100); // 50 + 30 + 20
  near(m.outputThroughput, 4, "output tok/s"); // 16 / 4
  near(m.totalThroughput, 29, "total tok/s"); // (100 + 16) / 4
  // TTFT [100, 200, 300] (the failure has none).
  near(m.ttftMs?.p50, 200, "TTFT p50");
  near(m.ttftMs?.p95, 290, "TTFT p95");
  // TPOT [100, 500]: p50 rank 0.5 -> 300; p95 rank 0.95 -> 100 + 0.95 * 400 = 480; p99 -> 496.
  assert.equal(m.tpotMs?.count, 2);
  near(m.tpotMs?.p50, 300, "TPOT p50");
  near(m.tpotMs?.p95, 480, "TPOT p95");
  near(m.tpotMs?.p99, 496, "TPOT p99");
  // ITL pooled: nine gaps of 100 and four of 500 (13 samples, ranks 0..12).
  // mean (900 + 2000) / 13; p50 rank 6 -> 100; p95 rank 11.4 -> between two 500s -> 500.
  assert.equal(m.itlMs?.count, 13);
  near(m.itlMs?.mean, 2900 / 13, "ITL mean");
  near(m.itlMs?.p50, 100, "ITL p50");
  near(m.itlMs?.p95, 500, "ITL p95");
  // Rank 8.4 falls between the last 100 (index 8) and the first 500: 100 + 0.4 * 400 = 260.
  near(percentile([...Array(9).fill(100), ...Array(4).fill(500)], 70), 260, "ITL p70");
  // E2E [300, 1000, 2200]: mean 3500 / 3; p95 rank 1.9 -> 1000 + 0.9 * 1200 = 2080.
  near(m.e2eMs?.mean, 3500 / 3, "E2E mean");
  near(m.e2eMs?.p50, 1000, "E2E p50");
  near(m.e2eMs?.p95, 2080, "E2E p95");
  assert.deepEqual(m.errors, [{ message: "HTTP 500: boom", count: 1 }]);
  assert.equal(m.goodput, null); // no SLO given
  assert.throws(() => levelMetrics(LEVEL, 0), RangeError);
});

Deno.test("levelMetrics() goodput counts successful requests meeting every SLO per second", () => {
  // TTFT <= 250 and TPOT <= 200: r0 (100, 100) meets both; r1 misses TPOT (500);
  // r2 misses TTFT (300); r3 failed. 1 request / 4 s = 0.25.
  const both = levelMetrics(LEVEL, 4000, { ttftMs: 250, tpotMs: 200 });
  assert.equal(both.goodRequests, 1);
  near(both.goodput, 0.25, "goodput TTFT+TPOT");
  // TTFT <= 300 only: r0, r1, r2 -> 3 / 4 s.
  near(levelMetrics(LEVEL, 4000, { ttftMs: 300 }).goodput, 0.75, "goodput TTFT");
  // TPOT <= 200 only: r0 meets; r1 misses; r2 has no TPOT and counts as meeting -> 2 / 4 s.
  near(levelMetrics(LEVEL, 4000, { tpotMs: 200 }).goodput, 0.5, "goodput TPOT");
  assert.equal(meetsSlo(LEVEL[3]!, {}), false);
});

/** A level whose numbers are taken from seed 002 (RTX 4090, max_num_seqs 50). */
function level(
  c: number,
  outputTput: number,
  ttftP50: number,
  ttftP95: number,
  tpot: number,
  preemptions: number | null = null,
) {
  const base = levelMetrics([req({ index: 0, ttftMs: 1, e2eMs: 2, outputTokens: 2 })], 1000);
  const report: LevelReport = {
    label: `concurrency ${c}`,
    concurrency: c,
    requestRate: null,
    startedAt: "2025-01-01T00:00:00.000Z",
    metrics: {
      ...base,
      outputThroughput: outputTput,
      ttftMs: { ...base.ttftMs!, p50: ttftP50, p95: ttftP95, p99: ttftP95 },
      tpotMs: { ...base.tpotMs!, p50: tpot },
    },
    preemptions,
    requests: [],
  };
  return report;
}

Deno.test("analyze() reports queueing when TTFT p95 explodes while throughput stalls", () => {
  const levels = [
    level(1, 272.56, 13.91, 21.42, 3.6),
    level(4, 1000.78, 15.56, 63.59, 3.9),
    level(32, 3359.33, 35.18, 126.38, 9.5),
    level(64, 3758.67, 147.73, 15390.44, 12.9),
  ];
  const obs = analyze(levels, {});
  const text = obs.join("\n");
  // 3758.67 / 3359.33 = 1.12 and 15390.44 / 126.38 = 121.8.
  assert.match(
    text,
    /TTFT p95 grows 122x from concurrency 32 to concurrency 64 \(126\.4 -> 15390\.4 ms\) while output throughput grows 1\.1x: requests are queueing\./,
  );
  // 1000.78 / 272.56 = 3.67 >= 0.8 * 4: near-linear.
  assert.match(text, /scales almost linearly from concurrency 1 to concurrency 4: 3\.7x for 4\.0x/);
  // 3359.33 / 1000.78 = 3.36 for 8x: 42% efficiency.
  assert.match(
    text,
    /grows 3\.4x from concurrency 4 to concurrency 32 for 8\.0x the concurrency \(42% scaling efficiency\)/,
  );
  assert.match(text, /Peak output throughput is 3758\.7 tok\/s/);
  // 90% of 3758.67 = 3382.8: first reached at concurrency 64 (the last): no saturation line.
  assert.doesNotMatch(text, /reaches 90% of its peak/);
  // TPOT 3.6 -> 12.9 ms = 3.6x.
  assert.match(text, /TPOT p50 rises 3\.6x from concurrency 1 to concurrency 64/);
  // TTFT p99/p50 at 64: 15390.44 / 147.73 = 104x.
  assert.match(text, /At concurrency 64, TTFT p99 is 104x its p50/);
});

Deno.test("analyze() reports saturation and flat throughput without claiming queueing", () => {
  const levels = [
    level(1, 100, 10, 12, 10),
    level(2, 195, 10, 12, 10.2),
    level(4, 200, 11, 13, 10.5),
  ];
  const text = analyze(levels, {}).join("\n");
  assert.doesNotMatch(text, /queueing/);
  assert.match(
    text,
    /stays flat from concurrency 2 to concurrency 4 \(1\.0x\): the server is saturated/,
  );
  assert.match(text, /reaches 90% of its peak at concurrency 2/);
  assert.match(text, /TPOT p50 stays within 1\.1x/);
  assert.match(text, /All 3 requests succeeded/);
});

Deno.test("analyze() names each level where the server preempted requests, and no other", () => {
  const levels = [
    level(1, 100, 10, 12, 10, 0),
    level(16, 900, 20, 30, 12, null),
    level(64, 1400, 600, 4000, 27, 72),
  ];
  const obs = analyze(levels, {}).filter((o) => o.includes("preempted"));
  assert.deepEqual(obs, [
    "The server preempted requests 72 times at concurrency 64 (vllm:num_preemptions_total): " +
    "its KV cache does not hold this load at once, so these figures include recomputed or " +
    "swapped work (a larger KV cache, e.g. the server's --kv-cache-memory, measures the engine " +
    "alone).",
  ]);
});

Deno.test("parsePreemptions() sums vllm:num_preemptions_total over label sets, null without it", () => {
  const text = [
    "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
    "# TYPE vllm:num_preemptions_total counter",
    'vllm:num_preemptions_total{model_name="a"} 3.0',
    'vllm:num_preemptions_total{model_name="b",engine="0"} 4',
    'vllm:num_preemptions_total_created{model_name="a"} 1.7e9',
    "vllm:num_requests_running 2",
  ].join("\n");
  assert.equal(parsePreemptions(text), 7);
  assert.equal(parsePreemptions("vllm:num_preemptions_total 5\n"), 5);
  assert.equal(parsePreemptions("vllm:num_requests_running 2\n"), null);
  assert.equal(parsePreemptions(""), null);
});
