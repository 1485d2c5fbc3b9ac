/**
 * The batching benchmark's main comparison: one workload through the static, dynamic and
 * continuous schedulers on the mock or WebGPU executor, written as Markdown, JSON and an SVG
 * chart. One scheduler run, the backends and the workload are in bench/batching/scheduler_run.ts.
 *
 * @module
 */

import { resolveModelDir } from "../../cli/engine_flags.ts";
import { describeMachine } from "../support.ts";
import { baselineBatchSize, type SchedulerChoice } from "./scheduler_choice.ts";
import type { BenchIo } from "../bench_io.ts";
import { DEFAULT_MOCK_LATENCY, type Options } from "./options.ts";
import { loadRunner, measureDecodeRate } from "./runner_timing.ts";
import {
  latencyText,
  mockBackend,
  runOne,
  type SchedulerResult,
  swapBlocks,
  webgpuBackend,
  workloadOf,
} from "./scheduler_run.ts";
import { fmt, markdownTable, textTable } from "./table.ts";
import { lineChart } from "../serve/report_svg.ts";

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
    const runner = await loadRunner(
      dir,
      {
        maxTokens: o.maxNumBatchedTokens,
        maxSeqs: o.maxNumSeqs,
        maxModelLen: o.maxModelLen,
        numKvBlocks: Math.floor(o.kvSlots / o.blockSize),
      },
      o.blockSize,
      o.kernelProfile,
    );
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
