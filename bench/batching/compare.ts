/**
 * The batching benchmark's main comparison: one workload through the static, dynamic and
 * continuous schedulers on the mock or WebGPU executor, written as Markdown, JSON and an SVG
 * chart; also the pieces the sweep shares (one scheduler run, the mock backend, the workload).
 *
 * @module
 */

import { resolveModelDir } from "../../cli/engine_flags.ts";
import { MockExecutor, type MockLatency } from "../../engine/executors/mock_executor.ts";
import { WebGpuExecutor } from "../../engine/executors/webgpu_executor.ts";
import type { Executor } from "../../engine/executors/executor.ts";
import type { ModelRunner } from "../../engine/model_runner.ts";
import { describeMachine } from "../support.ts";
import {
  baselineBatchSize,
  makeScheduler,
  runHarness,
  type RunSummary,
  type SchedulerChoice,
  SimulatedExecutor,
  summarizeRun,
  type Timeline,
  VirtualTimeline,
  WallTimeline,
} from "./harness.ts";
import { type BenchIo, DEFAULT_MOCK_LATENCY, type Options } from "./options.ts";
import { loadRunner, measureDecodeRate } from "./runner_timing.ts";
import { fmt, markdownTable, textTable } from "./table.ts";
import { type Arrival, makeWorkload, type WorkloadRequest } from "./workload.ts";
import { lineChart } from "../serve/report_svg.ts";

/** The result of one scheduler on the workload (a JSON `results` entry). */
export interface SchedulerResult extends RunSummary {
  readonly scheduler: "continuous" | "static" | "dynamic";
  /** Static / dynamic batch size, continuous max_num_seqs. */
  readonly batch_size: number;
  /** Dynamic only: wait window, ms. */
  readonly batch_wait_ms: number | null;
  /** Decode steps (every request decodes one token) per second of the run. */
  readonly steps_per_s: number;
  /** Requests finished by time t (s from the first arrival), at most 64 points: the chart. */
  readonly completion_curve: readonly { readonly t_s: number; readonly finished: number }[];
}

/** Requests finished over time, sampled at (at most) 64 evenly spaced finish events. */
function completionCurve(
  requests: readonly { readonly arrivalMs: number; readonly finishMs: number }[],
): { t_s: number; finished: number }[] {
  if (requests.length === 0) return [];
  const t0 = Math.min(...requests.map((r) => r.arrivalMs));
  const ends = requests.map((r) => (r.finishMs - t0) / 1000).sort((a, b) => a - b);
  const stride = Math.max(1, Math.ceil(ends.length / 64));
  const curve = [{ t_s: 0, finished: 0 }];
  for (let i = stride - 1; i < ends.length; i += stride) {
    curve.push({ t_s: ends[i]!, finished: i + 1 });
  }
  if (curve.at(-1)!.finished !== ends.length) {
    curve.push({ t_s: ends.at(-1)!, finished: ends.length });
  }
  return curve;
}

/** Makes the executor and timeline of one run. */
type Backend = () => {
  executor: Executor;
  timeline: Timeline;
  settle?: (step: number) => void;
};

/** Writes the comparison as Markdown, JSON and an SVG chart to the output folder. */
async function writeComparison(
  o: Options,
  meta: Record<string, unknown>,
  results: readonly SchedulerResult[],
  g: ReturnType<typeof goals>,
): Promise<string> {
  const outDir = o.outDir ??
    `bench/results/batching-${new Date().toISOString().replace(/[:.]/g, "-")}`;
  await Deno.mkdir(outDir, { recursive: true });
  const svg = lineChart({
    title: `Requests finished over time (${o.executor} executor)`,
    xLabel: "time since the burst arrived (s)",
    yLabel: "requests finished",
    series: results.map((r) => ({
      name: r.scheduler,
      points: r.completion_curve.map((p) => ({ x: p.t_s, y: p.finished })),
    })),
  });
  const md = [
    `# Static vs dynamic vs continuous batching (${o.executor} executor)`,
    "",
    `${o.requests} requests, prompts ${o.promptLen.join("..")}, outputs ${
      o.outputLen.join("..")
    } tokens, ` +
    `all at t = 0, seed ${o.seed}; KV budget ${o.kvSlots} token slots, max_model_len ${o.maxModelLen}.`,
    "",
    markdownTable(RESULT_HEADER, resultRows(results)),
    "",
    `continuous / static output tokens/s: ${
      fmt(g.continuous_over_static_output_tokens ?? NaN, 2)
    }x; ` +
    `paged KV utilisation at peak allocation ${
      fmt(g.paged_kv_peak_utilization ?? NaN, 3)
    } vs static ` +
    `contiguous ${fmt(g.static_kv_peak_utilization ?? NaN, 3)}.`,
    "",
    "![requests finished over time](batching_completion.svg)",
    "",
  ].join("\n");
  await Deno.writeTextFile(`${outDir}/batching.md`, md);
  await Deno.writeTextFile(
    `${outDir}/batching.json`,
    JSON.stringify({ ...meta, results, goals: g }, null, 2),
  );
  await Deno.writeTextFile(`${outDir}/batching_completion.svg`, svg);
  return outDir;
}

export async function runOne(
  choice: SchedulerChoice,
  requests: readonly WorkloadRequest[],
  backend: Backend,
  maxInFlight: number | undefined,
): Promise<SchedulerResult> {
  const { executor, timeline, settle } = backend();
  const scheduler = makeScheduler(choice, () => timeline.now());
  const run = await runHarness({
    scheduler,
    executor,
    timeline,
    requests,
    maxInFlight: maxInFlight ?? executor.maxInFlight,
    ...(settle !== undefined ? { settle } : {}),
  });
  const s = summarizeRun(run);
  const batch = choice.kind === "continuous" ? choice.maxNumSeqs : Math.min(
    choice.batchSize ?? Infinity,
    baselineBatchSize(choice.kvTokens, choice.maxModelLen, choice.blockSize),
  );
  return {
    scheduler: choice.kind,
    batch_size: batch,
    batch_wait_ms: choice.kind === "dynamic" ? choice.batchWaitMs ?? 10 : null,
    ...s,
    steps_per_s: s.duration_s > 0 ? s.steps / s.duration_s : 0,
    completion_curve: completionCurve(run.requests),
  };
}

export function mockBackend(o: Options): Backend {
  const latency = mockLatency(o);
  if (o.clock === "wall") {
    return () => ({ executor: new MockExecutor({ latency }), timeline: new WallTimeline() });
  }
  return () => {
    const timeline = new VirtualTimeline();
    const executor = new SimulatedExecutor(timeline, latency, undefined, o.swapOutMs);
    return { executor, timeline, settle: (step) => executor.settle(step) };
  };
}

function webgpuBackend(runner: ModelRunner, o: Options): Backend {
  const numSwapBlocks = o.preemptionMode === "swap" ? swapBlocks(o) : 0;
  return () => ({
    executor: new WebGpuExecutor(runner, { numSwapBlocks, seedSource: () => 0 }),
    timeline: new WallTimeline(),
  });
}

/** The mock latency model of the options. */
function mockLatency(o: Options): MockLatency {
  return {
    baseMs: o.baseMs,
    perTokenMs: o.perTokenMs,
    perSeqMs: o.perSeqMs,
    perKiloPairMs: o.perKiloPairMs,
  };
}

/** The mock latency model in words. */
export function latencyText(o: Options): string {
  return `${o.baseMs} + ${o.perTokenMs} ms x batched tokens + ${o.perSeqMs} ms x sequences + ` +
    `${o.perKiloPairMs} ms x 1000 attended pairs` +
    (o.preemptionMode === "swap" ? `; swap-out ${o.swapOutMs} ms` : "");
}

/** Host swap blocks of the swap space (whole blocks of `--block-size` token slots). */
function swapBlocks(o: Options): number {
  return Math.floor(o.swapSlots / o.blockSize);
}

function choices(o: Options): SchedulerChoice[] {
  const common = {
    kvTokens: o.kvSlots,
    blockSize: o.blockSize,
    maxModelLen: o.maxModelLen,
    maxNumSeqs: o.maxNumSeqs,
    maxNumBatchedTokens: o.maxNumBatchedTokens,
    preemptionMode: o.preemptionMode,
    swapBlocks: swapBlocks(o),
  };
  return [
    { kind: "static", ...common },
    { kind: "dynamic", ...common, batchWaitMs: o.batchWaitMs },
    { kind: "continuous", ...common },
  ];
}

export function workloadOf(o: Options, vocabSize: number, arrival: Arrival): WorkloadRequest[] {
  return makeWorkload({
    requests: o.requests,
    seed: o.seed,
    promptLen: o.promptLen,
    outputLen: o.outputLen,
    vocabSize,
    arrival,
  });
}

function resultRows(results: readonly SchedulerResult[]): string[][] {
  return results.map((r) => [
    r.scheduler,
    String(r.batch_size),
    r.batch_wait_ms === null ? "-" : fmt(r.batch_wait_ms, 0),
    fmt(r.output_tokens_per_s, 1),
    fmt(r.requests_per_s, 3),
    fmt(r.ttft_ms.p50, 0),
    fmt(r.ttft_ms.p99, 0),
    fmt(r.e2e_ms.p50, 0),
    fmt(r.e2e_ms.p99, 0),
    fmt(r.kv_peak_utilization, 3),
    fmt(r.kv_mean_utilization, 3),
    String(r.kv_peak_allocated_tokens),
    String(r.steps),
    String(r.batched_tokens),
    String(r.preemptions),
    fmt(r.scheduler_ms_per_step, 3),
  ]);
}

const RESULT_HEADER = [
  "scheduler",
  "batch",
  "wait ms",
  "out tok/s",
  "req/s",
  "TTFT p50 ms",
  "TTFT p99 ms",
  "E2E p50 ms",
  "E2E p99 ms",
  "KV util @peak",
  "KV util mean",
  "KV peak slots",
  "steps",
  "tokens run",
  "preempt",
  "sched ms/step",
];

function goals(results: readonly SchedulerResult[]) {
  const by = (k: string) => results.find((r) => r.scheduler === k && r.batch_wait_ms !== 0);
  const c = by("continuous");
  const s = by("static");
  return {
    continuous_over_static_output_tokens: c && s
      ? c.output_tokens_per_s / s.output_tokens_per_s
      : null,
    continuous_over_static_goal: 3,
    paged_kv_peak_utilization: c?.kv_peak_utilization ?? null,
    paged_kv_peak_utilization_goal: 0.95,
    static_kv_peak_utilization: s?.kv_peak_utilization ?? null,
  };
}

/** The main comparison (mock or webgpu). */
export async function runCompare(o: Options, io: BenchIo): Promise<number> {
  const meta: Record<string, unknown> = {
    bench: "batching",
    executor: o.executor,
    kv_slots: o.kvSlots,
    max_model_len: o.maxModelLen,
    block_size: o.blockSize,
    max_num_seqs: o.maxNumSeqs,
    max_num_batched_tokens: o.maxNumBatchedTokens,
    baseline_batch_size: baselineBatchSize(o.kvSlots, o.maxModelLen, o.blockSize),
    workload: {
      requests: o.requests,
      seed: o.seed,
      prompt_len: o.promptLen,
      output_len: o.outputLen,
      arrival: "all at t = 0",
    },
  };
  let results: SchedulerResult[] = [];
  if (o.executor === "mock") {
    const calibrated = o.baseMs === DEFAULT_MOCK_LATENCY.baseMs &&
      o.perTokenMs === DEFAULT_MOCK_LATENCY.perTokenMs &&
      o.perSeqMs === DEFAULT_MOCK_LATENCY.perSeqMs &&
      o.perKiloPairMs === DEFAULT_MOCK_LATENCY.perKiloPairMs &&
      o.swapOutMs === DEFAULT_MOCK_LATENCY.swapOutMs;
    meta.latency_model = {
      base_ms: o.baseMs,
      per_token_ms: o.perTokenMs,
      per_seq_ms: o.perSeqMs,
      per_kpair_ms: o.perKiloPairMs,
      swap_out_ms: o.swapOutMs,
      source: calibrated ? DEFAULT_MOCK_LATENCY.source : "command line",
      clock: o.clock === "virtual" ? "simulated (virtual time)" : "wall clock (MockExecutor)",
    };
    meta.machine = null;
    const requests = workloadOf(o, 50_000, { kind: "burst" });
    for (const c of choices(o)) {
      results.push(await runOne(c, requests, mockBackend(o), o.maxInFlight));
    }
  } else {
    const dir = await resolveModelDir(o.model);
    const runner = await loadRunner(dir, {
      maxTokens: o.maxNumBatchedTokens,
      maxSeqs: o.maxNumSeqs,
      maxModelLen: o.maxModelLen,
      numKvBlocks: Math.floor(o.kvSlots / o.blockSize),
    }, o.blockSize);
    try {
      meta.machine = describeMachine(runner.ctx);
      meta.model = dir;
      meta.weight_dtype = runner.ctx.weightDtype;
      meta.latency_model = null;
      const rate = await measureDecodeRate(runner, 1, Math.min(128, o.maxModelLen), 64);
      meta.decode_rate = {
        seqs: rate.seqs,
        steps: rate.steps,
        one_readback_per_step_steps_per_s: rate.syncStepsPerS,
        pipelined_steps_per_s: rate.pipelinedStepsPerS,
        ratio: rate.pipelinedStepsPerS / rate.syncStepsPerS,
        goal_ratio: 3,
        max_in_flight: rate.maxInFlight,
      };
      const requests = workloadOf(o, runner.config.vocabSize, { kind: "burst" });
      // Warm-up (shader compilation on first use): a few short requests, not measured.
      const warm = requests.slice(0, 4).map((r) => ({ ...r, outputLen: Math.min(r.outputLen, 4) }));
      await runOne(choices(o)[2]!, warm, webgpuBackend(runner, o), o.maxInFlight);
      await runOne(choices(o)[0]!, warm, webgpuBackend(runner, o), o.maxInFlight);
      results = [];
      for (const c of choices(o)) {
        if (!o.json) io.err(`running ${c.kind} on the WebGPU executor ...`);
        results.push(await runOne(c, requests, webgpuBackend(runner, o), o.maxInFlight));
      }
    } finally {
      const ctx = runner.ctx;
      runner.destroy();
      ctx.destroy();
    }
  }
  const g = goals(results);
  const outDir = await writeComparison(o, meta, results, g);
  if (o.json) {
    io.log(JSON.stringify({ ...meta, results, goals: g }));
    return 0;
  }
  io.log(`wrote ${outDir}/batching.md, batching.json, batching_completion.svg`);
  io.log(
    `batching: ${o.requests} requests, prompts ${o.promptLen.join("..")}, outputs ${
      o.outputLen.join("..")
    } tokens (ignore_eos), all at t = 0, seed ${o.seed}`,
  );
  io.log(
    `KV budget ${o.kvSlots} token slots, max_model_len ${o.maxModelLen}: static/dynamic batch ${meta.baseline_batch_size}, continuous max_num_seqs ${o.maxNumSeqs} (paged, block ${o.blockSize})`,
  );
  if (o.executor === "mock") {
    io.log(
      `executor: mock, step = ${latencyText(o)} (${JSON.stringify(meta.latency_model)})`,
    );
  } else {
    io.log(`executor: webgpu, model ${String(meta.model)}; ${String(meta.machine)}`);
  }
  io.log(textTable(RESULT_HEADER, resultRows(results)));
  io.log(
    `continuous / static output tokens/s: ${
      fmt(g.continuous_over_static_output_tokens ?? NaN, 2)
    }x (goal >= 3x); ` +
      `paged KV utilisation at peak allocation ${
        fmt(g.paged_kv_peak_utilization ?? NaN, 3)
      } (goal >= 0.95) vs static contiguous ${fmt(g.static_kv_peak_utilization ?? NaN, 3)}`,
  );
  if (meta.decode_rate !== undefined) {
    const d = meta.decode_rate as Record<string, number>;
    io.log(
      `decode steps/s (1 sequence): one readback per step ${
        fmt(d.one_readback_per_step_steps_per_s ?? NaN)
      }, ` +
        `pipelined (${d.max_in_flight} in flight) ${fmt(d.pipelined_steps_per_s ?? NaN)}: ${
          fmt(d.ratio ?? NaN, 2)
        }x (goal >= 3x)`,
    );
  }
  return 0;
}
