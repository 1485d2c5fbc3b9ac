/**
 * What the batching comparison (bench/batching/compare.ts) reports: the figures against their
 * goals, the result table, the Markdown / JSON / SVG files and the console summary.
 *
 * @module
 */

import { type BenchIo, resultsDir } from "../bench_io.ts";
import type { Options } from "./options.ts";
import { latencyText, type SchedulerResult } from "./scheduler_run.ts";
import { fmt, markdownTable, textTable } from "./table.ts";
import { lineChart } from "../lib/line_chart.ts";

/** The run's settings and executor facts, as written at the top of the JSON. */
export type ComparisonMeta = Record<string, unknown>;

/** Continuous vs static throughput and the KV utilisations, beside their goals. */
export interface Goals {
  readonly continuous_over_static_output_tokens: number | null;
  readonly continuous_over_static_goal: number;
  readonly paged_kv_peak_utilization: number | null;
  readonly paged_kv_peak_utilization_goal: number;
  readonly static_kv_peak_utilization: number | null;
}

/** The goals of the comparison and how far `results` get. */
export function goals(results: readonly SchedulerResult[]): Goals {
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

/** batching.md: the workload, the result table, the goals line and the chart. */
function comparisonMarkdown(o: Options, results: readonly SchedulerResult[], g: Goals): string {
  return [
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
}

/** Writes the comparison as Markdown, JSON and an SVG chart; returns the output folder. */
export async function writeComparison(
  o: Options,
  meta: ComparisonMeta,
  results: readonly SchedulerResult[],
  g: Goals,
): Promise<string> {
  const outDir = o.outDir ?? resultsDir("batching");
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
  await Deno.writeTextFile(`${outDir}/batching.md`, comparisonMarkdown(o, results, g));
  await Deno.writeTextFile(
    `${outDir}/batching.json`,
    JSON.stringify({ ...meta, results, goals: g }, null, 2),
  );
  await Deno.writeTextFile(`${outDir}/batching_completion.svg`, svg);
  return outDir;
}

/** The console summary: the files, the workload, the executor, the table and the goals. */
export function printComparison(
  o: Options,
  meta: ComparisonMeta,
  results: readonly SchedulerResult[],
  g: Goals,
  outDir: string,
  io: BenchIo,
): void {
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
    io.log(
      `executor: webgpu, model ${String(meta.model)} (weights ${String(meta.weight_dtype)}, ` +
        `quantization ${String(meta.quantization)}); ${String(meta.machine)}`,
    );
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
}
