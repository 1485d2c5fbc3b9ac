/**
 * The figures reported per scheduler: {@linkcode summarizeRun} turns a harness
 * {@linkcode RunRecord} into a {@linkcode RunSummary} (throughputs, latency quantiles, KV
 * utilisation).
 *
 * @module
 */

import { percentile } from "../serve/metrics.ts";
import type { RunRecord } from "./harness.ts";
import { kvUtilization } from "./kv_utilization.ts";

/** p50 / p95 / p99 / mean of a metric, ms. */
export interface Quantiles {
  readonly mean: number;
  readonly p50: number;
  readonly p95: number;
  readonly p99: number;
}

/** The figures reported per scheduler (JSON field names). */
export interface RunSummary {
  readonly output_tokens_per_s: number;
  readonly requests_per_s: number;
  readonly ttft_ms: Quantiles;
  readonly e2e_ms: Quantiles;
  /** used / allocated KV slots at the step of peak allocation (see kv_utilization.ts). */
  readonly kv_peak_utilization: number;
  /** Mean over steps of used / allocated KV slots. */
  readonly kv_mean_utilization: number;
  /** Peak KV token slots allocated (paged) or reserved (contiguous). */
  readonly kv_peak_allocated_tokens: number;
  readonly requests: number;
  readonly output_tokens: number;
  readonly steps: number;
  /** Tokens computed over all steps (prompts, recomputation after preemption, decodes). */
  readonly batched_tokens: number;
  readonly preemptions: number;
  readonly duration_s: number;
  /** Host wall ms per executed step spent in the scheduler (schedule + updateFromOutput). */
  readonly scheduler_ms_per_step: number;
}

function quantiles(values: readonly number[]): Quantiles {
  if (values.length === 0) return { mean: NaN, p50: NaN, p95: NaN, p99: NaN };
  const s = [...values].sort((a, b) => a - b);
  return {
    mean: s.reduce((a, b) => a + b, 0) / s.length,
    p50: percentile(s, 50),
    p95: percentile(s, 95),
    p99: percentile(s, 99),
  };
}

/** Throughputs, latency quantiles and KV utilisation of a run. */
export function summarizeRun(run: RunRecord): RunSummary {
  const outputTokens = run.requests.reduce((n, r) => n + r.outputTokens, 0);
  const seconds = run.durationMs / 1000;
  const kv = kvUtilization(run.steps.map((s) => s.kv));
  return {
    output_tokens_per_s: seconds > 0 ? outputTokens / seconds : 0,
    requests_per_s: seconds > 0 ? run.requests.length / seconds : 0,
    ttft_ms: quantiles(run.requests.map((r) => r.firstTokenMs - r.arrivalMs)),
    e2e_ms: quantiles(run.requests.map((r) => r.finishMs - r.arrivalMs)),
    kv_peak_utilization: kv.peakUtilization,
    kv_mean_utilization: kv.meanUtilization,
    kv_peak_allocated_tokens: kv.peakAllocated,
    requests: run.requests.length,
    output_tokens: outputTokens,
    steps: run.steps.length,
    batched_tokens: run.steps.reduce((n, s) => n + s.tokens, 0),
    preemptions: run.preemptions,
    duration_s: seconds,
    scheduler_ms_per_step: run.steps.length > 0 ? run.schedulerMs / run.steps.length : 0,
  };
}
