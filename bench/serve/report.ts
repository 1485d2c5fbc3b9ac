/**
 * The serving-benchmark report: the JSON document written by `bench/serve.ts` (and rendered to
 * Markdown and SVG), plus the rule-based analysis across levels. Every observation is derived
 * from the measured numbers by a stated rule; nothing is canned.
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
  /** Rule-based observations across levels (see {@linkcode analyze}). */
  readonly observations: readonly string[];
}

/** "12x", "1.1x", "0.53x". */
export function ratioText(r: number): string {
  if (!Number.isFinite(r)) return "inf x";
  if (r >= 10) return `${r.toFixed(0)}x`;
  if (r >= 1) return `${r.toFixed(1)}x`;
  return `${r.toFixed(2)}x`;
}

/** A number with sensible precision for reports: 3 significant figures, at most 2 decimals. */
export function num(v: number | null | undefined): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return "-";
  const a = Math.abs(v);
  if (a >= 100) return v.toFixed(1);
  if (a >= 10) return v.toFixed(2);
  return v.toFixed(a === 0 ? 0 : 2);
}

function pct(v: number): string {
  return `${(v * 100).toFixed(0)}%`;
}

/**
 * Observations across levels, each produced by one rule on the numbers (in this order):
 *
 * 1. Peak output throughput and where it was reached.
 * 2. For each step between consecutive levels, with load ratio `L` (concurrency or rate),
 *    output-throughput ratio `T` and TTFT-p95 ratio `F`:
 *    `F >= 3` and `T < 1.25` -> queueing; else `T >= 0.8 L` -> near-linear scaling;
 *    `T < 0.95` -> throughput drops; `T < 1.1` -> flat (saturated); else sublinear, with the
 *    scaling efficiency `T / L` (and "requests start to queue" when `F >= 3`).
 * 3. Saturation: the first level reaching 90% of the peak throughput, when later levels exist,
 *    with how E2E p50 grew after it.
 * 4. TPOT p50 from the first to the last level: `>= 1.5x` rises; `<= 1.2x` nearly flat.
 * 5. The level with the largest TTFT p99 / p50 ratio, when it is >= 5.
 * 6. Failures per level (or that all requests succeeded).
 * 7. With SLOs: the level with the best goodput, and levels where < 90% of successful requests
 *    met the SLOs.
 * 8. A warning when the server sent no usage chunk (token counts are streamed chunks).
 */
export function analyze(levels: readonly LevelReport[], slo: Slo): string[] {
  const out: string[] = [];
  if (levels.length === 0) return out;
  const ok = levels.filter((l) => l.metrics.successful > 0);
  if (ok.length > 0) {
    const peak = ok.reduce((
      a,
      b,
    ) => (b.metrics.outputThroughput > a.metrics.outputThroughput ? b : a));
    out.push(
      `Peak output throughput is ${num(peak.metrics.outputThroughput)} tok/s ` +
        `(${num(peak.metrics.requestThroughput)} req/s) at ${peak.label}.`,
    );
  }
  const load = (l: LevelReport) => l.requestRate ?? l.concurrency ?? NaN;
  const loadName = levels[0]!.requestRate !== null ? "the request rate" : "the concurrency";
  for (let i = 1; i < levels.length; i++) {
    const a = levels[i - 1]!;
    const b = levels[i]!;
    if (a.metrics.successful === 0 || b.metrics.successful === 0) continue;
    const L = load(b) / load(a);
    const T = b.metrics.outputThroughput / a.metrics.outputThroughput;
    const fa = a.metrics.ttftMs?.p95;
    const fb = b.metrics.ttftMs?.p95;
    const F = fa !== undefined && fb !== undefined && fa > 0 ? fb / fa : NaN;
    const span = `from ${a.label} to ${b.label}`;
    if (F >= 3 && T < 1.25) {
      out.push(
        `TTFT p95 grows ${ratioText(F)} ${span} (${num(fa)} -> ${num(fb)} ms) while output ` +
          `throughput grows ${ratioText(T)}: requests are queueing.`,
      );
    } else if (Number.isFinite(L) && T >= 0.8 * L) {
      out.push(
        `Output throughput scales almost linearly ${span}: ${ratioText(T)} for ${ratioText(L)} ` +
          `${loadName}.`,
      );
    } else if (T < 0.95) {
      out.push(
        `Output throughput drops ${span} (${num(a.metrics.outputThroughput)} -> ` +
          `${num(b.metrics.outputThroughput)} tok/s): more load makes the server slower.`,
      );
    } else if (T < 1.1) {
      out.push(
        `Output throughput stays flat ${span} (${ratioText(T)}): the server is saturated.`,
      );
    } else {
      out.push(
        `Output throughput grows ${ratioText(T)} ${span} for ${ratioText(L)} ${loadName} ` +
          `(${pct(T / L)} scaling efficiency)` +
          (F >= 3 ? `, while TTFT p95 grows ${ratioText(F)}: requests start to queue.` : "."),
      );
    }
  }
  if (ok.length > 1) {
    const peak = Math.max(...ok.map((l) => l.metrics.outputThroughput));
    const idx = levels.findIndex((l) => l.metrics.outputThroughput >= 0.9 * peak);
    const sat = levels[idx]!;
    const last = levels[levels.length - 1]!;
    if (idx < levels.length - 1 && last.metrics.successful > 0) {
      out.push(
        `Throughput reaches 90% of its peak at ${sat.label}; beyond it, E2E latency p50 goes ` +
          `${num(sat.metrics.e2eMs?.p50)} -> ${num(last.metrics.e2eMs?.p50)} ms ` +
          `(${ratioText((last.metrics.e2eMs?.p50 ?? NaN) / (sat.metrics.e2eMs?.p50 ?? NaN))}) ` +
          `by ${last.label}.`,
      );
    }
    const first = ok[0]!;
    const end = ok[ok.length - 1]!;
    const t0 = first.metrics.tpotMs?.p50;
    const t1 = end.metrics.tpotMs?.p50;
    if (t0 !== undefined && t1 !== undefined && t0 > 0) {
      const r = t1 / t0;
      if (r >= 1.5) {
        out.push(
          `TPOT p50 rises ${ratioText(r)} from ${first.label} to ${end.label} ` +
            `(${num(t0)} -> ${num(t1)} ms): each decode step slows as the batch grows.`,
        );
      } else if (r <= 1.2) {
        out.push(
          `TPOT p50 stays within ${ratioText(r)} from ${first.label} to ${end.label} ` +
            `(${num(t0)} -> ${num(t1)} ms): per-token latency barely depends on the load here.`,
        );
      }
    }
  }
  let tail: { level: LevelReport; r: number } | undefined;
  for (const l of ok) {
    const t = l.metrics.ttftMs;
    if (t === null || !(t.p50 > 0)) continue;
    const r = t.p99 / t.p50;
    if (tail === undefined || r > tail.r) tail = { level: l, r };
  }
  if (tail !== undefined && tail.r >= 5) {
    const t = tail.level.metrics.ttftMs!;
    out.push(
      `At ${tail.level.label}, TTFT p99 is ${ratioText(tail.r)} its p50 (${num(t.p99)} vs ` +
        `${num(t.p50)} ms): some requests wait far longer than the typical one.`,
    );
  }
  const failing = levels.filter((l) => l.metrics.failed > 0);
  if (failing.length === 0) {
    const total = levels.reduce((s, l) => s + l.metrics.totalRequests, 0);
    out.push(`All ${total} requests succeeded.`);
  }
  for (const l of failing) {
    const top = l.metrics.errors[0];
    out.push(
      `${l.metrics.failed} of ${l.metrics.totalRequests} requests failed at ${l.label}` +
        (top ? ` (most common: "${top.message}", ${top.count}x).` : "."),
    );
  }
  if (slo.ttftMs !== undefined || slo.tpotMs !== undefined) {
    const withGood = ok.filter((l) => l.metrics.goodput !== null);
    if (withGood.length > 0) {
      const best = withGood.reduce((a, b) => (b.metrics.goodput! > a.metrics.goodput! ? b : a));
      out.push(
        `Best goodput is ${num(best.metrics.goodput)} req/s at ${best.label} ` +
          `(${best.metrics.goodRequests} of ${best.metrics.totalRequests} requests within SLO).`,
      );
      const missing = withGood.filter((l) => l.metrics.goodRequests! < 0.9 * l.metrics.successful);
      for (const l of missing) {
        out.push(
          `At ${l.label} only ${pct(l.metrics.goodRequests! / l.metrics.successful)} of ` +
            `successful requests meet the SLOs.`,
        );
      }
    }
  }
  if (ok.some((l) => !l.metrics.usageReported)) {
    out.push(
      "The server sent no usage chunk for some requests: their output lengths count streamed " +
        "streamed chunks, which undercounts tokens when a chunk carries several.",
    );
  }
  return out;
}
