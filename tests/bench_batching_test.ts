import assert from "node:assert/strict";
import { z } from "zod";
import { runBatchingBench } from "../bench/batching.ts";
import { fitLinear } from "../bench/batching/fit.ts";
import { fitLatency, shapePairs } from "../bench/batching/calibrate.ts";
import {
  attendedPairs,
  MockExecutor,
  type MockLatency,
  mockStepMs,
} from "../engine/executors/mock_executor.ts";
import type { SchedulerOutput } from "../scheduler/scheduler_output.ts";
import { kvUtilization } from "../bench/batching/kv_utilization.ts";
import { runHarness, VirtualTimeline } from "../bench/batching/harness.ts";
import { type RunSummary, summarizeRun } from "../bench/batching/run_summary.ts";
import { baselineBatchSize, makeScheduler } from "../bench/batching/scheduler_choice.ts";
import { makeWorkload } from "../bench/batching/workload.ts";
import { GPU_TEST } from "./support/gpu.ts";

const close = (a: number, b: number, what: string) =>
  assert.ok(Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b)), `${what}: ${a} != ${b}`);

Deno.test("fitLinear() recovers coefficients by least squares on points worked out by hand", () => {
  const exact = fitLinear([[1, 0], [1, 1], [1, 2]], [1, 3, 5]);
  close(exact.coef[0]!, 1, "intercept");
  close(exact.coef[1]!, 2, "slope");
  close(exact.r2, 1, "r2");
  // mean x 1.5, mean y 1; Sxx 5, Sxy 3 -> slope 0.6, intercept 0.1; residuals -0.1 0.3 -0.3 0.1
  // -> R^2 1 - 0.2 / 2 = 0.9.
  const noisy = fitLinear([[1, 0], [1, 1], [1, 2], [1, 3]], [0, 1, 1, 2]);
  close(noisy.coef[0]!, 0.1, "intercept");
  close(noisy.coef[1]!, 0.6, "slope");
  close(noisy.r2, 0.9, "r2");
  // Four unknowns, exact data: y = 2 - x1 + 0.5 x2 + 3 x3 (a pivot is needed: row 0 starts 0).
  const rows = [[0, 1, 2, 3], [1, 0, 0, 1], [1, 5, 1, 0], [1, 2, 7, 2], [1, 1, 1, 1]];
  const y = rows.map(([c, a, b, d]) => 2 * c! - a! + 0.5 * b! + 3 * d!);
  const four = fitLinear(rows, y);
  [2, -1, 0.5, 3].forEach((want, j) => close(four.coef[j]!, want, `coef ${j}`));
  assert.throws(() => fitLinear([[1, 2]], [1]), /2 coefficients to 1 row/);
  assert.throws(() => fitLinear([[1, 2], [1, 2], [1, 2]], [1, 2, 3]), /linear combination/);
  assert.throws(() => fitLinear([[1, 2], [1, NaN]], [1, 2]), /row 1 is not 2 finite numbers/);
});

/** A step of chunks (positionStart, numTokens); only the fields the latency model reads. */
function stepOf(chunks: readonly [number, number][]): SchedulerOutput {
  const scheduled = chunks.map(([positionStart, numTokens], i) => ({
    requestId: `r${i}`,
    positionStart,
    numTokens,
  }));
  return {
    step: 1,
    scheduled,
    totalTokens: chunks.reduce((n, [, t]) => n + t, 0),
  } as unknown as SchedulerOutput;
}

Deno.test("mockStepMs() adds the per-token, per-sequence and per-attended-pair costs", () => {
  // A prefill of 4 tokens from 0 attends 1 + 2 + 3 + 4 = 10 pairs; 3 tokens from 5 attend
  // 6 + 7 + 8 = 21; a decode at position 99 attends 100.
  const step = stepOf([[0, 4], [5, 3], [99, 1]]);
  assert.equal(attendedPairs(step), 131);
  const latency = { baseMs: 2, perTokenMs: 0.5, perSeqMs: 0.25, perKiloPairMs: 10 };
  close(mockStepMs(latency, step), 2 + 0.5 * 8 + 0.25 * 3 + 10 * 0.131, "step ms");
  close(mockStepMs({ baseMs: 2, perTokenMs: 0.5 }, step), 6, "linear model");
  assert.equal(mockStepMs(latency, stepOf([])), 0);
  // The calibration counts a step shape's pairs the same way.
  assert.equal(shapePairs({ seqs: 2, queryLen: 3, contextLen: 8 }), 2 * 21);
  assert.equal(shapePairs({ seqs: 5, queryLen: 1, contextLen: 100 }), 500);
});

Deno.test("fitLatency() recovers a latency model from exact step times", () => {
  const model = { baseMs: 2.5, perTokenMs: 0.03, perSeqMs: 0.02, perKiloPairMs: 0.1 };
  const shapes = [
    { seqs: 1, queryLen: 1, contextLen: 32 },
    { seqs: 64, queryLen: 1, contextLen: 256 },
    { seqs: 16, queryLen: 1, contextLen: 512 },
    { seqs: 1, queryLen: 256, contextLen: 256 },
    { seqs: 1, queryLen: 64, contextLen: 960 },
  ];
  const measured = shapes.map((shape) => ({
    shape,
    ms: model.baseMs + model.perTokenMs * shape.seqs * shape.queryLen +
      model.perSeqMs * shape.seqs + (model.perKiloPairMs * shapePairs(shape)) / 1000,
  }));
  const { fit, points } = fitLatency(measured);
  for (const k of ["baseMs", "perTokenMs", "perSeqMs", "perKiloPairMs"] as const) {
    assert.ok(Math.abs(fit[k] - model[k]) < 1e-9, `${k}: ${fit[k]} != ${model[k]}`);
  }
  for (const p of points) assert.ok(Math.abs(p.fittedMs - p.ms) < 1e-9);
});

Deno.test("kvUtilization() takes used / allocated at the step of peak allocation", () => {
  const u = kvUtilization([
    { allocated: 32, used: 10 },
    { allocated: 64, used: 40 },
    { allocated: 64, used: 50 }, // the same peak, better used: this one counts
    { allocated: 48, used: 48 },
    { allocated: 0, used: 0 }, // skipped
  ]);
  assert.equal(u.peakAllocated, 64);
  close(u.peakUtilization, 50 / 64, "peak utilisation");
  close(u.meanUtilization, (10 / 32 + 40 / 64 + 50 / 64 + 1) / 4, "mean utilisation");
  assert.deepEqual(kvUtilization([]), { peakAllocated: 0, peakUtilization: 0, meanUtilization: 0 });
  assert.throws(() => kvUtilization([{ allocated: 16, used: 17 }]), /17 slots used of 16/);
});

Deno.test("baselineBatchSize() fits whole max_model_len reservations into the KV budget", () => {
  assert.equal(baselineBatchSize(16384, 1024, 16), 16);
  assert.equal(baselineBatchSize(16384, 1000, 16), 16); // 1008-slot reservations
  assert.equal(baselineBatchSize(16384, 1100, 16), 14); // 1104-slot reservations
  assert.equal(baselineBatchSize(1000, 1024, 16), 0);
});

/** One request (3 prompt tokens, 3 output tokens) alone through `kind` in simulated time. */
async function runOneRequest(
  kind: "continuous" | "static" | "dynamic",
  latency: MockLatency,
): Promise<RunSummary> {
  const timeline = new VirtualTimeline();
  const executor = new MockExecutor({ latency, clock: "virtual", virtualClock: timeline });
  const scheduler = makeScheduler({
    kind,
    kvTokens: 256,
    blockSize: 16,
    maxModelLen: 64,
    maxNumSeqs: 4,
    maxNumBatchedTokens: 64,
    batchWaitMs: 0,
  }, () => timeline.now());
  const run = await runHarness({
    scheduler,
    executor,
    timeline,
    requests: [{ requestId: "r", promptTokenIds: [5, 6, 7], outputLen: 3, arrivalMs: 0 }],
    maxInFlight: 4,
    settle: (s) => executor.settle(s),
  });
  return summarizeRun(run);
}

Deno.test("runHarness() times one request in simulated time exactly (prefill then 2 decodes)", async () => {
  for (const kind of ["continuous", "static", "dynamic"] as const) {
    const s = await runOneRequest(kind, { baseMs: 8, perTokenMs: 0.05 });
    // Step 1: 3 prompt tokens, 8.15 ms; steps 2 and 3: one token each, 8.05 ms.
    close(s.ttft_ms.p50, 8.15, `${kind} TTFT`);
    close(s.e2e_ms.p50, 8.15 + 2 * 8.05, `${kind} E2E`);
    assert.equal(s.output_tokens, 3);
    assert.equal(s.steps, 3);
    // Context after the last step: 3 prompt + 2 fed tokens = 5 of 16 paged / 64 reserved slots.
    close(s.kv_peak_utilization, kind === "continuous" ? 5 / 16 : 5 / 64, `${kind} KV`);
  }
});

Deno.test("runHarness() charges the per-sequence and attended-pair costs in simulated time", async () => {
  const latency = { baseMs: 8, perTokenMs: 0.05, perSeqMs: 0.5, perKiloPairMs: 100 };
  const s = await runOneRequest("continuous", latency);
  // Step 1: 3 tokens, 1 sequence, 1 + 2 + 3 = 6 pairs; steps 2, 3: 1 token attending 4, 5.
  const first = 8 + 0.15 + 0.5 + 0.6;
  close(s.ttft_ms.p50, first, "TTFT");
  close(s.e2e_ms.p50, first + (8 + 0.05 + 0.5 + 0.4) + (8 + 0.05 + 0.5 + 0.5), "E2E");
});

Deno.test("runHarness() with swap preemption charges each swap-out and finishes every request", async () => {
  const durations: number[] = [];
  let swaps = 0;
  for (const swapOutMs of [0, 100]) {
    const timeline = new VirtualTimeline();
    const executor = new MockExecutor({
      latency: { baseMs: 1, perTokenMs: 0.01 },
      clock: "virtual",
      virtualClock: timeline,
      swapOutMs,
    });
    // 6 blocks of 16 slots for 3 requests that each grow to 48 tokens (3 blocks): some must be
    // swapped out while the others finish.
    const scheduler = makeScheduler({
      kind: "continuous",
      kvTokens: 96,
      blockSize: 16,
      maxModelLen: 64,
      maxNumSeqs: 4,
      maxNumBatchedTokens: 64,
      preemptionMode: "swap",
      swapBlocks: 16,
    }, () => timeline.now());
    const requests = [0, 1, 2].map((i) => ({
      requestId: `r${i}`,
      promptTokenIds: Array.from({ length: 16 }, (_, t) => 1 + t + i),
      outputLen: 32,
      arrivalMs: 0,
    }));
    const run = await runHarness({
      scheduler,
      executor,
      timeline,
      requests,
      maxInFlight: 1,
      settle: (s) => executor.settle(s),
    });
    assert.equal(run.requests.length, 3);
    for (const r of run.requests) assert.equal(r.outputTokens, 32);
    assert.equal(scheduler.stats().numSwapped, 0);
    swaps = run.preemptions;
    durations.push(run.durationMs);
  }
  assert.ok(swaps > 0, "the pool is too small: requests must have been swapped out");
  // The same schedule either way; every swapped-out request adds 100 ms.
  close(durations[1]! - durations[0]!, 100 * swaps, "swap-out time");
});

Deno.test("makeWorkload() is deterministic in the seed and respects the ranges", () => {
  const spec = {
    requests: 50,
    seed: 7,
    promptLen: [16, 256] as const,
    outputLen: [16, 512] as const,
    vocabSize: 1000,
    arrival: { kind: "poisson", ratePerS: 10 } as const,
  };
  const a = makeWorkload(spec);
  assert.deepEqual(a, makeWorkload(spec));
  assert.notDeepEqual(a, makeWorkload({ ...spec, seed: 8 }));
  for (const r of a) {
    assert.ok(r.promptTokenIds.length >= 16 && r.promptTokenIds.length <= 256);
    assert.ok(r.outputLen >= 16 && r.outputLen <= 512);
  }
  assert.ok(a.every((r, i) => i === 0 || r.arrivalMs >= a[i - 1]!.arrivalMs));
});

const Quantiles = z.object({ p50: z.number(), p99: z.number() });
const Result = z.object({
  scheduler: z.enum(["continuous", "static", "dynamic"]),
  output_tokens_per_s: z.number().positive(),
  requests_per_s: z.number().positive(),
  ttft_ms: Quantiles,
  e2e_ms: Quantiles,
  kv_peak_utilization: z.number().gt(0).lte(1),
  requests: z.number(),
});
const CompareView = z.object({
  executor: z.enum(["mock", "webgpu"]),
  baseline_batch_size: z.number(),
  results: z.array(Result).length(3),
  goals: z.object({ continuous_over_static_output_tokens: z.number().nullable() }),
});

async function bench(argv: string[]): Promise<{ code: number; out: string[]; err: string[] }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runBatchingBench(argv, { log: (l) => out.push(l), err: (l) => err.push(l) });
  return { code, out, err };
}

const SMALL = [
  "--requests",
  "16",
  "--prompt-len",
  "4:24",
  "--output-len",
  "2:24",
  "--max-model-len",
  "64",
  "--kv-slots",
  "512",
];

Deno.test("bench:batching --json (mock) prints one JSON object with every scheduler's figures and writes md/json/svg", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const { code, out } = await bench(["--json", ...SMALL, "--out-dir", dir]);
    assert.equal(code, 0);
    assert.equal(out.length, 1);
    const report = CompareView.parse(JSON.parse(out[0]!));
    assert.equal(report.executor, "mock");
    assert.equal(report.baseline_batch_size, 8);
    assert.deepEqual(report.results.map((r) => r.scheduler), ["static", "dynamic", "continuous"]);
    for (const r of report.results) assert.equal(r.requests, 16);
    // The same report as files: Markdown table, JSON with the completion curves, SVG chart.
    const md = await Deno.readTextFile(`${dir}/batching.md`);
    assert.match(md, /\| continuous \|/);
    assert.match(md, /!\[requests finished over time\]\(batching_completion\.svg\)/);
    const saved = JSON.parse(await Deno.readTextFile(`${dir}/batching.json`));
    for (const r of saved.results) {
      assert.equal(r.completion_curve.at(-1).finished, 16);
      assert.deepEqual(r.completion_curve[0], { t_s: 0, finished: 0 });
    }
    const svg = await Deno.readTextFile(`${dir}/batching_completion.svg`);
    assert.match(svg, /^<svg[^>]*>/);
    assert.match(svg, /requests finished/);
    assert.match(svg, /<\/svg>\s*$/);
    const text = await bench([...SMALL, "--out-dir", dir]);
    assert.equal(text.code, 0);
    assert.match(text.out.join("\n"), /continuous \/ static output tokens\/s/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("bench:batching rejects bad flags with exit status 2", async () => {
  const r = await bench(["--executor", "cuda"]);
  assert.equal(r.code, 2);
  assert.match(r.err.join("\n"), /^error: --executor must be mock or webgpu/);
  assert.equal((await bench(["--max-model-len", "100"])).code, 2); // 256 + 512 > 100
  const mode = await bench(["--preemption-mode", "drop"]);
  assert.equal(mode.code, 2);
  assert.match(mode.err.join("\n"), /^error: --preemption-mode must be recompute or swap/);
  const format = await bench(["--executor", "webgpu", "--quantization", "int3"]);
  assert.equal(format.code, 2);
  assert.match(format.err.join("\n"), /^error: --quantization expects none, int8 or int4/);
  // The mock executor alone has no weights: the flag would be ignored, so it is refused.
  const mock = await bench(["--quantization", "int4"]);
  assert.equal(mock.code, 2);
  assert.match(mock.err.join("\n"), /^error: --quantization applies to the WebGPU runner/);
  const profile = await bench(["--kernel-profile", "gpu"]);
  assert.equal(profile.code, 2);
  assert.match(profile.err.join("\n"), /^error: --kernel-profile applies to the WebGPU runner/);
  const model = await bench(["--model", "/tmp/none"]);
  assert.equal(model.code, 2);
  assert.match(model.err.join("\n"), /^error: --model applies to the WebGPU runner/);
});

Deno.test("bench:batching --sweep writes the Markdown table, JSON and SVG charts", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const { code, out } = await bench(["--sweep", "--json", "--requests", "16", "--out-dir", dir]);
    assert.equal(code, 0);
    const report = z.object({ results: z.array(Result) }).parse(JSON.parse(out[0]!));
    assert.equal(report.results.length, 3 + 9 + 4);
    const md = await Deno.readTextFile(`${dir}/sweep.md`);
    assert.match(md, /\| dynamic \| 8 \| 50 \|/);
    for (const f of ["sweep_latency.svg", "sweep_throughput.svg"]) {
      const svg = await Deno.readTextFile(`${dir}/${f}`);
      assert.ok(svg.startsWith("<svg") && svg.trimEnd().endsWith("</svg>"), f);
    }
    z.object({ results: z.array(Result) }).parse(
      JSON.parse(await Deno.readTextFile(`${dir}/sweep.json`)),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name:
    "bench:batching --executor webgpu runs the tiny model with int8 weights and measures the decode rates",
  ...GPU_TEST,
  fn: async () => {
    const dir = await Deno.makeTempDir();
    const { code, out } = await bench([
      "--executor",
      "webgpu",
      "--quantization",
      "int8",
      "--json",
      ...SMALL.slice(2),
      "--requests",
      "4",
      "--max-num-seqs",
      "8",
      "--max-num-batched-tokens",
      "64",
      "--out-dir",
      dir,
    ]);
    await Deno.remove(dir, { recursive: true });
    assert.equal(code, 0);
    const report = CompareView.extend({
      decode_rate: z.object({
        one_readback_per_step_steps_per_s: z.number().positive(),
        pipelined_steps_per_s: z.number().positive(),
      }),
      quantization: z.literal("int8"),
      weight_device_bytes: z.number().positive(),
      weight_unquantized_bytes: z.number().positive(),
    }).parse(JSON.parse(out[0]!));
    assert.equal(report.executor, "webgpu");
    // int8: a byte and a 32nd of an f16 scale per weight against 2 (f16) or 4 (f32) bytes.
    assert.ok(report.weight_device_bytes < 0.6 * report.weight_unquantized_bytes);
    for (const r of report.results) assert.equal(r.requests, 4);
  },
});

Deno.test({
  name: "bench:batching --calibrate fits the mock latency to WebGPU step times",
  ...GPU_TEST,
  fn: async () => {
    const { code, out } = await bench([
      "--calibrate",
      "--json",
      "--max-num-seqs",
      "16",
      "--max-num-batched-tokens",
      "64",
      "--max-model-len",
      "1024",
    ]);
    assert.equal(code, 0);
    const cal = z.object({
      fit: z.object({
        base_ms: z.number(),
        per_token_ms: z.number(),
        per_seq_ms: z.number(),
        per_kpair_ms: z.number(),
        r2: z.number(),
      }),
      swap_out_ms: z.number().positive(),
      points: z.array(
        z.object({ seqs: z.number(), tokens: z.number(), pairs: z.number(), ms: z.number() }),
      ),
    }).parse(JSON.parse(out[0]!));
    // The default shapes within 16 sequences and 64 tokens: decodes of 1 and 16 sequences at
    // contexts 32, 256, 512, and 64-token prefills over contexts 64 and 960.
    assert.deepEqual(cal.points.map((p) => [p.seqs, p.tokens, p.pairs]), [
      [1, 1, 32],
      [1, 1, 256],
      [1, 1, 512],
      [16, 16, 512],
      [16, 16, 4096],
      [16, 16, 8192],
      [1, 64, 2080],
      [1, 64, 896 * 64 + 2080],
    ]);
    for (const p of cal.points) assert.ok(p.ms > 0);
    // Too few shapes to tell the terms apart: a one-line error, exit status 1.
    const narrow = await bench([
      "--calibrate",
      "--max-num-seqs",
      "1",
      "--max-num-batched-tokens",
      "1",
    ]);
    assert.equal(narrow.code, 1);
    assert.match(narrow.err.join("\n"), /Cannot calibrate from the 3 step shapes/);
  },
});
