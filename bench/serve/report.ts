/**
 * The serving-benchmark report: the JSON document written by `bench/serve.ts` (rendered to
 * Markdown and SVG by report_markdown.ts and report_svg.ts; its observations come from
 * analysis.ts), and how its numbers are written.
 *
 * @module
 */

import type { LevelMetrics, Slo } from "./metrics.ts";
import type { IntRange, PromptKind } from "./workload.ts";

/** One request as stored in the JSON report (no per-token gaps, to keep the file small). */
export interface RequestRecord {
  readonly index: number;
  readonly ok: boolean;
  readonly error?: string;
  readonly startMs: number;
  readonly ttftMs: number | null;
  readonly tpotMs: number | null;
  readonly e2eMs: number;
  readonly promptTokens: number;
  readonly outputTokens: number;
}

/** One level of the sweep. */
export interface LevelReport {
  /** "concurrency 8" or "rate 4 req/s" (with "cap 8" when capped). */
  readonly label: string;
  /** Closed-loop concurrency, or the in-flight cap of an open-loop level; null = none. */
  readonly concurrency: number | null;
  /** Open-loop arrival rate (req/s); null for closed-loop levels. */
  readonly requestRate: number | null;
  /** ISO date-time the level started. */
  readonly startedAt: string;
  readonly metrics: LevelMetrics;
  /**
   * Requests the server preempted during the level, from its `/metrics` before and after
   * (bench/serve/server_counters.ts); null when it reports none.
   */
  readonly preemptions: number | null;
  readonly requests: readonly RequestRecord[];
}

/** The run's settings, as recorded in the report. */
export interface BenchConfig {
  /** "concurrency": closed-loop sweep; "rate": open-loop arrivals at `requestRates`. */
  readonly mode: "concurrency" | "rate";
  readonly concurrency: readonly number[];
  readonly requestRates: readonly number[];
  readonly burstiness: number;
  readonly requestsPerLevel: readonly number[];
  readonly inputLen: IntRange;
  readonly outputLen: IntRange;
  readonly promptKind: PromptKind;
  readonly vocab: IntRange;
  readonly ignoreEos: boolean;
  readonly temperature: number;
  readonly seed: number;
  readonly slo: Slo;
  readonly timeoutS: number;
  readonly warmupRequests: number;
}

/** The whole report (the `--json` file). */
export interface BenchReport {
  readonly schema: "webgpu-llm/bench-serve/1";
  /** The command line as typed (argv joined with shell quoting). */
  readonly command: string;
  /** ISO date-time the run started. */
  readonly date: string;
  /** Server base URL. */
  readonly url: string;
  /** `--model DIR` when the benchmark started the server itself; else null. */
  readonly modelDir: string | null;
  /** The `model` field sent with every request. */
  readonly servedModelName: string;
  /** Model ids listed by GET /v1/models. */
  readonly serverModels: readonly string[];
  /** The `server` response header of GET /v1/models, if any. */
  readonly serverHeader: string | null;
  readonly config: BenchConfig;
  readonly levels: readonly LevelReport[];
  /** Rule-based observations across levels (see analysis.ts). */
  readonly observations: readonly string[];
}

/** A number with sensible precision for reports: 3 significant figures, at most 2 decimals. */
export function num(v: number | null | undefined): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return "-";
  const a = Math.abs(v);
  if (a >= 100) return v.toFixed(1);
  if (a >= 10) return v.toFixed(2);
  return v.toFixed(a === 0 ? 0 : 2);
}
