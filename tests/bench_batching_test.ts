import assert from "node:assert/strict";
import { z } from "zod";
import { runBatchingBench } from "../bench/batching.ts";
import { fitLine } from "../bench/batching/fit.ts";
import { kvUtilization } from "../bench/batching/kv_utilization.ts";
import {
  baselineBatchSize,
  makeScheduler,
  runHarness,
  SimulatedExecutor,
  summarizeRun,
  VirtualTimeline,
} from "../bench/batching/harness.ts";
import { makeWorkload } from "../bench/batching/workload.ts";
import { GPU_TEST } from "./support/gpu.ts";

const close = (a: number, b: number, what: string) =>
  assert.ok(Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b)), `${what}: ${a} != ${b}`);

Deno.test("fitLine() recovers a + b x by least squares on points worked out by hand", () => {
  const exact = fitLine([{ x: 0, y: 1 }, { x: 1, y: 3 }, { x: 2, y: 5 }]);
  close(exact.a, 1, "a");
  close(exact.b, 2, "b");
  close(exact.r2, 1, "r2");
  // mean x 1.5, mean y 1; Sxx 5, Sxy 3 -> b 0.6, a 0.1; residuals -0.1 0.3 -0.3 0.1 -> R^2 0.9.
  const noisy = fitLine([{ x: 0, y: 0 }, { x: 1, y: 1 }, { x: 2, y: 1 }, { x: 3, y: 2 }]);
  close(noisy.a, 0.1, "a");
  close(noisy.b, 0.6, "b");
  close(noisy.r2, 0.9, "r2");
  assert.throws(() => fitLine([{ x: 1, y: 1 }]), RangeError);
  assert.throws(() => fitLine([{ x: 2, y: 1 }, { x: 2, y: 3 }]), /all 2 points have x = 2/);
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

Deno.test("runHarness() times one request in simulated time exactly (prefill then 2 decodes)", async () => {
  for (const kind of ["continuous", "static", "dynamic"] as const) {
    const timeline = new VirtualTimeline();
    const executor = new SimulatedExecutor(timeline, { baseMs: 8, perTokenMs: 0.05 });
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
    const s = summarizeRun(run);
    // Step 1: 3 prompt tokens, 8.15 ms; steps 2 and 3: one token each, 8.05 ms.
    close(s.ttft_ms.p50, 8.15, `${kind} TTFT`);
    close(s.e2e_ms.p50, 8.15 + 2 * 8.05, `${kind} E2E`);
    assert.equal(s.output_tokens, 3);
    assert.equal(s.steps, 3);
    // Context after the last step: 3 prompt + 2 fed tokens = 5 of 16 paged / 64 reserved slots.
    close(s.kv_peak_utilization, kind === "continuous" ? 5 / 16 : 5 / 64, `${kind} KV`);
  }
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
  name: "bench:batching --executor webgpu runs the tiny model and measures the decode rates",
  ...GPU_TEST,
  fn: async () => {
    const dir = await Deno.makeTempDir();
    const { code, out } = await bench([
      "--executor",
      "webgpu",
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
    }).parse(JSON.parse(out[0]!));
    assert.equal(report.executor, "webgpu");
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
      "4",
      "--max-num-batched-tokens",
      "64",
      "--max-model-len",
      "1024",
    ]);
    assert.equal(code, 0);
    const cal = z.object({
      fit: z.object({ base_ms: z.number(), per_token_ms: z.number(), r2: z.number() }),
      points: z.array(z.object({ tokens: z.number(), ms: z.number().positive() })),
    }).parse(JSON.parse(out[0]!));
    assert.deepEqual(cal.points.map((p) => p.tokens), [1, 4, 64]);
  },
});
