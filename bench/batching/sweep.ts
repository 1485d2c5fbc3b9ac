/**
 * `deno task bench:batching --sweep`: the 004 experiment. Static and dynamic batch sizes and wait
 * windows and continuous max_num_seqs on the mock executor with Poisson arrivals, written as
 * Markdown, JSON and two SVG charts.
 *
 * @module
 */

import type { SchedulerChoice } from "./scheduler_choice.ts";
import {
  latencyText,
  mockBackend,
  runOne,
  schedulerLimits,
  type SchedulerResult,
  workloadOf,
} from "./scheduler_run.ts";
import { type BenchIo, resultsDir } from "../bench_io.ts";
import type { Options } from "./options.ts";
import { fmt, markdownTable, textTable } from "./table.ts";
import { lineChart } from "../lib/line_chart.ts";

/**
 * The runs of the sweep: static batch 1, 4, 8; dynamic 1, 4, 8 at each wait window 0, 10,
 * 50 ms; continuous max_num_seqs 1, 4, 8 and `--max-num-seqs`.
 */
function sweepChoices(o: Options): SchedulerChoice[] {
  const common = schedulerLimits(o);
  const runs: SchedulerChoice[] = [];
  for (const b of [1, 4, 8]) runs.push({ kind: "static", ...common, batchSize: b });
  for (const w of [0, 10, 50]) {
    for (const b of [1, 4, 8]) {
      runs.push({ kind: "dynamic", ...common, batchSize: b, batchWaitMs: w });
    }
  }
  for (const b of [1, 4, 8, o.maxNumSeqs]) {
    runs.push({ kind: "continuous", ...common, maxNumSeqs: b });
  }
  return runs;
}

const HEADER = [
  "scheduler",
  "batch",
  "wait ms",
  "avg latency ms",
  "p95 latency ms",
  "avg TTFT ms",
  "out tok/s",
  "req/s",
];

function sweepRows(results: readonly SchedulerResult[]): string[][] {
  return results.map((r) => [
    r.scheduler,
    String(r.batch_size),
    r.batch_wait_ms === null ? "-" : String(r.batch_wait_ms),
    fmt(r.e2e_ms.mean, 0),
    fmt(r.e2e_ms.p95, 0),
    fmt(r.ttft_ms.mean, 0),
    fmt(r.output_tokens_per_s, 1),
    fmt(r.requests_per_s, 3),
  ]);
}

/**
 * sweep_latency.svg and sweep_throughput.svg: a line per scheduler (per wait window for
 * dynamic) over the batch size; continuous at a `--max-num-seqs` above 8 is left out.
 */
function sweepCharts(
  o: Options,
  results: readonly SchedulerResult[],
): { latency: string; throughput: string } {
  const label = (r: SchedulerResult) =>
    r.scheduler === "dynamic" ? `dynamic, wait ${r.batch_wait_ms} ms` : r.scheduler;
  const series = new Map<string, SchedulerResult[]>();
  for (const r of results) {
    if (r.scheduler === "continuous" && r.batch_size === o.maxNumSeqs && o.maxNumSeqs > 8) continue;
    const k = label(r);
    series.set(k, [...(series.get(k) ?? []), r]);
  }
  const chart = (title: string, yLabel: string, y: (r: SchedulerResult) => number) =>
    lineChart({
      title,
      xLabel: "batch size (continuous: max_num_seqs)",
      yLabel,
      xLog: true,
      series: [...series].map(([name, rs]) => ({
        name,
        points: rs.map((r) => ({ x: r.batch_size, y: y(r) })),
        dashed: name === "static",
      })),
    });
  return {
    latency: chart(
      "Average request latency (mock executor)",
      "avg E2E latency (ms)",
      (r) => r.e2e_ms.mean,
    ),
    throughput: chart(
      "Output throughput (mock executor)",
      "output tokens/s",
      (r) => r.output_tokens_per_s,
    ),
  };
}

/** The sweep's settings, as written at the top of the JSON. */
function sweepMeta(o: Options) {
  return {
    bench: "batching-sweep",
    executor: "mock",
    latency_model: {
      base_ms: o.baseMs,
      per_token_ms: o.perTokenMs,
      per_seq_ms: o.perSeqMs,
      per_kpair_ms: o.perKiloPairMs,
      clock: o.clock,
    },
    workload: {
      requests: o.requests,
      seed: o.seed,
      prompt_len: o.promptLen,
      output_len: o.outputLen,
      arrival: `Poisson, ${o.rate} req/s`,
    },
    kv_slots: o.kvSlots,
    max_model_len: o.maxModelLen,
  };
}

/** sweep.md: the setting (lines 3-5, also printed), the table and the charts. */
function sweepMarkdown(o: Options, rows: readonly string[][]): string {
  return [
    "# Batching sweep (004): static vs dynamic vs continuous",
    "",
    `Mock executor, step = ${latencyText(o)} (${o.clock} clock). ` +
    `${o.requests} requests, Poisson arrivals at ${o.rate} req/s, prompts ${
      o.promptLen.join("..")
    }, ` +
    `outputs ${o.outputLen.join("..")} tokens, seed ${o.seed}; KV ${o.kvSlots} slots, ` +
    `max_model_len ${o.maxModelLen}. Latency = arrival to last token.`,
    "",
    markdownTable(HEADER, rows),
    "",
    "![latency](sweep_latency.svg)",
    "",
    "![throughput](sweep_throughput.svg)",
    "",
  ].join("\n");
}

/** `--sweep`: the 004 experiment. */
export async function runSweep(o: Options, io: BenchIo): Promise<number> {
  const requests = workloadOf(o, 50_000, { kind: "poisson", ratePerS: o.rate });
  const results: SchedulerResult[] = [];
  for (const c of sweepChoices(o)) {
    results.push(await runOne(c, requests, mockBackend(o), o.maxInFlight));
  }
  const outDir = o.outDir ?? resultsDir("batching");
  await Deno.mkdir(outDir, { recursive: true });
  const rows = sweepRows(results);
  const charts = sweepCharts(o, results);
  const meta = sweepMeta(o);
  const md = sweepMarkdown(o, rows);
  await Deno.writeTextFile(`${outDir}/sweep.md`, md);
  await Deno.writeTextFile(`${outDir}/sweep.json`, JSON.stringify({ ...meta, results }, null, 2));
  await Deno.writeTextFile(`${outDir}/sweep_latency.svg`, charts.latency);
  await Deno.writeTextFile(`${outDir}/sweep_throughput.svg`, charts.throughput);
  if (o.json) {
    io.log(JSON.stringify({ ...meta, out_dir: outDir, results }));
  } else {
    io.log(md.split("\n").slice(2, 5).join("\n"));
    io.log(textTable(HEADER, rows));
    io.log(`wrote ${outDir}/sweep.md, sweep.json, sweep_latency.svg, sweep_throughput.svg`);
  }
  return 0;
}
