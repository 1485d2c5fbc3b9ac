/**
 * The serving benchmark's sweep: the uncounted warm-up requests, then every load level of the
 * {@linkcode BenchConfig} in turn (fresh prompts per level, run by runner.ts), each recorded as a
 * {@linkcode LevelReport} and summed up in one line.
 *
 * @module
 */

import { type LevelMetrics, levelMetrics, tpotMs } from "./metrics.ts";
import { ProgressBar, type SyncWriter } from "./progress.ts";
import { type BenchConfig, type LevelReport, num } from "./report.ts";
import { type ClientConfig, type LevelPlan, type LevelRun, runLevel } from "./runner.ts";
import { preemptionsTotal } from "./server_counters.ts";
import { streamCompletion } from "./sse_client.ts";
import { arrivalTimesMs, type PlannedRequest, planRequests, Rng } from "./workload.ts";

/** Where the sweep reports: summary lines, and the progress bar (null: none). */
export interface SweepIo {
  readonly log: (line: string) => void;
  readonly progress: SyncWriter | null;
}

/** One level to run, with its label and (open loop) its arrival rate. */
interface Level {
  readonly label: string;
  readonly plan: LevelPlan;
  readonly rate: number | null;
}

/** Level `i` of `config` over `requests`; open-loop arrival times are drawn from `rng`. */
function levelAt(
  config: BenchConfig,
  i: number,
  requests: readonly PlannedRequest[],
  rng: Rng,
): Level {
  if (config.mode === "concurrency") {
    const c = config.concurrency[i]!;
    return { label: `concurrency ${c}`, plan: { concurrency: c, requests }, rate: null };
  }
  const rate = config.requestRates[i]!;
  const cap = config.concurrency[0] ?? null;
  return {
    label: `rate ${Number.isFinite(rate) ? rate : "inf"} req/s` +
      (cap === null ? "" : ` (cap ${cap})`),
    plan: {
      concurrency: cap,
      requests,
      arrivalsMs: arrivalTimesMs(requests.length, rate, config.burstiness, rng),
    },
    rate,
  };
}

/** The report of a level that ran. */
function levelReport(
  level: Level,
  run: LevelRun,
  metrics: LevelMetrics,
  preemptions: number | null,
): LevelReport {
  return {
    label: level.label,
    concurrency: level.plan.concurrency,
    requestRate: level.rate,
    startedAt: run.startedAt.toISOString(),
    metrics,
    preemptions,
    requests: run.results.map((r) => ({
      index: r.index,
      ok: r.ok,
      ...(r.error === undefined ? {} : { error: r.error }),
      startMs: r.startMs,
      ttftMs: r.ttftMs,
      tpotMs: tpotMs(r),
      e2eMs: r.e2eMs,
      promptTokens: r.promptTokens,
      outputTokens: r.outputTokens,
    })),
  };
}

/** The one-line summary of a level. */
function levelLine(label: string, metrics: LevelMetrics, preemptions: number | null): string {
  return `${label}: ${metrics.successful}/${metrics.totalRequests} ok, ` +
    `${num(metrics.requestThroughput)} req/s, ${num(metrics.outputThroughput)} output tok/s, ` +
    `TTFT p50 ${num(metrics.ttftMs?.p50)} ms p95 ${num(metrics.ttftMs?.p95)} ms, ` +
    `TPOT p50 ${num(metrics.tpotMs?.p50)} ms, E2E p50 ${num(metrics.e2eMs?.p50)} ms` +
    (preemptions === null ? "" : `, ${preemptions} preemptions (server /metrics)`) +
    (metrics.errors[0] ? ` (first error: ${metrics.errors[0].message})` : "");
}

/** Preemptions between two readings of the server's counter; null unless both exist. */
function preemptedBetween(before: number | null, after: number | null): number | null {
  return before === null || after === null ? null : after - before;
}

/**
 * Sends `config.warmupRequests` uncounted requests one by one (compiles pipelines, checks the
 * endpoint end to end), then runs every level; returns their reports. Prompts and arrival times
 * come from one generator seeded with `config.seed`.
 */
export async function runSweep(
  config: BenchConfig,
  client: ClientConfig,
  io: SweepIo,
): Promise<LevelReport[]> {
  const rng = new Rng(config.seed);
  const workload = {
    inputLen: config.inputLen,
    outputLen: config.outputLen,
    promptKind: config.promptKind,
    vocab: config.vocab,
  };
  for (const w of planRequests({ ...workload, count: config.warmupRequests }, rng)) {
    const r = await streamCompletion({
      ...client,
      prompt: w.prompt,
      promptTokens: w.promptTokens,
      maxTokens: w.maxTokens,
    });
    if (!r.ok) io.log(`warm-up request failed: ${r.error}`);
  }
  const levels: LevelReport[] = [];
  const count = config.mode === "concurrency"
    ? config.concurrency.length
    : config.requestRates.length;
  for (let i = 0; i < count; i++) {
    const n = config.requestsPerLevel[i]!;
    // Fresh prompts per level: identical prompts would hit the server's prefix cache.
    const level = levelAt(config, i, planRequests({ ...workload, count: n }, rng), rng);
    const bar = new ProgressBar(io.progress, level.label, n);
    const before = await preemptionsTotal(client.baseUrl);
    const run = await runLevel(level.plan, client, bar);
    bar.finish();
    const preempted = preemptedBetween(before, await preemptionsTotal(client.baseUrl));
    const metrics = levelMetrics(run.results, run.durationMs, config.slo);
    levels.push(levelReport(level, run, metrics, preempted));
    io.log(levelLine(level.label, metrics, preempted));
  }
  return levels;
}
