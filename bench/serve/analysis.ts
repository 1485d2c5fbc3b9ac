/**
 * The rule-based analysis of a serving-benchmark sweep: the observations of the report, each
 * derived from the measured numbers of the levels by a stated rule; nothing is canned.
 *
 * @module
 */

import type { Slo } from "./metrics.ts";
import { type LevelReport, num } from "./report.ts";

/** "12x", "1.1x", "0.53x". */
export function ratioText(r: number): string {
  if (!Number.isFinite(r)) return "inf x";
  if (r >= 10) return `${r.toFixed(0)}x`;
  if (r >= 1) return `${r.toFixed(1)}x`;
  return `${r.toFixed(2)}x`;
}

function pct(v: number): string {
  return `${(v * 100).toFixed(0)}%`;
}

/** Rule 1: peak output throughput and where it was reached. */
function peakThroughput(ok: readonly LevelReport[]): string[] {
  if (ok.length === 0) return [];
  const peak = ok.reduce((
    a,
    b,
  ) => (b.metrics.outputThroughput > a.metrics.outputThroughput ? b : a));
  return [
    `Peak output throughput is ${num(peak.metrics.outputThroughput)} tok/s ` +
    `(${num(peak.metrics.requestThroughput)} req/s) at ${peak.label}.`,
  ];
}

/** Rule 2 for one step from level `a` to level `b` (both with successful requests). */
function scalingStep(a: LevelReport, b: LevelReport, loadName: string): string {
  const load = (l: LevelReport) => l.requestRate ?? l.concurrency ?? NaN;
  const L = load(b) / load(a);
  const T = b.metrics.outputThroughput / a.metrics.outputThroughput;
  const fa = a.metrics.ttftMs?.p95;
  const fb = b.metrics.ttftMs?.p95;
  const F = fa !== undefined && fb !== undefined && fa > 0 ? fb / fa : NaN;
  const span = `from ${a.label} to ${b.label}`;
  if (F >= 3 && T < 1.25) {
    return `TTFT p95 grows ${ratioText(F)} ${span} (${num(fa)} -> ${num(fb)} ms) while output ` +
      `throughput grows ${ratioText(T)}: requests are queueing.`;
  }
  if (Number.isFinite(L) && T >= 0.8 * L) {
    return `Output throughput scales almost linearly ${span}: ${ratioText(T)} for ${
      ratioText(L)
    } ` +
      `${loadName}.`;
  }
  if (T < 0.95) {
    return `Output throughput drops ${span} (${num(a.metrics.outputThroughput)} -> ` +
      `${num(b.metrics.outputThroughput)} tok/s): more load makes the server slower.`;
  }
  if (T < 1.1) {
    return `Output throughput stays flat ${span} (${ratioText(T)}): the server is saturated.`;
  }
  return `Output throughput grows ${ratioText(T)} ${span} for ${ratioText(L)} ${loadName} ` +
    `(${pct(T / L)} scaling efficiency)` +
    (F >= 3 ? `, while TTFT p95 grows ${ratioText(F)}: requests start to queue.` : ".");
}

/** Rule 2: each step between consecutive levels that both had successful requests. */
function scaling(levels: readonly LevelReport[]): string[] {
  const loadName = levels[0]!.requestRate !== null ? "the request rate" : "the concurrency";
  const out: string[] = [];
  for (let i = 1; i < levels.length; i++) {
    const a = levels[i - 1]!;
    const b = levels[i]!;
    if (a.metrics.successful === 0 || b.metrics.successful === 0) continue;
    out.push(scalingStep(a, b, loadName));
  }
  return out;
}

/** Rule 3: the first level reaching 90% of the peak throughput, when later levels exist. */
function saturation(levels: readonly LevelReport[], ok: readonly LevelReport[]): string[] {
  const peak = Math.max(...ok.map((l) => l.metrics.outputThroughput));
  const idx = levels.findIndex((l) => l.metrics.outputThroughput >= 0.9 * peak);
  const sat = levels[idx]!;
  const last = levels[levels.length - 1]!;
  if (idx >= levels.length - 1 || last.metrics.successful === 0) return [];
  return [
    `Throughput reaches 90% of its peak at ${sat.label}; beyond it, E2E latency p50 goes ` +
    `${num(sat.metrics.e2eMs?.p50)} -> ${num(last.metrics.e2eMs?.p50)} ms ` +
    `(${ratioText((last.metrics.e2eMs?.p50 ?? NaN) / (sat.metrics.e2eMs?.p50 ?? NaN))}) ` +
    `by ${last.label}.`,
  ];
}

/** Rule 4: TPOT p50 from the first to the last successful level. */
function tpotTrend(ok: readonly LevelReport[]): string[] {
  const first = ok[0]!;
  const end = ok[ok.length - 1]!;
  const t0 = first.metrics.tpotMs?.p50;
  const t1 = end.metrics.tpotMs?.p50;
  if (t0 === undefined || t1 === undefined || !(t0 > 0)) return [];
  const r = t1 / t0;
  if (r >= 1.5) {
    return [
      `TPOT p50 rises ${ratioText(r)} from ${first.label} to ${end.label} ` +
      `(${num(t0)} -> ${num(t1)} ms): each decode step slows as the batch grows.`,
    ];
  }
  if (r <= 1.2) {
    return [
      `TPOT p50 stays within ${ratioText(r)} from ${first.label} to ${end.label} ` +
      `(${num(t0)} -> ${num(t1)} ms): per-token latency barely depends on the load here.`,
    ];
  }
  return [];
}

/** Rule 5: the level with the largest TTFT p99 / p50 ratio, when it is >= 5. */
function ttftTail(ok: readonly LevelReport[]): string[] {
  let tail: { level: LevelReport; r: number } | undefined;
  for (const l of ok) {
    const t = l.metrics.ttftMs;
    if (t === null || !(t.p50 > 0)) continue;
    const r = t.p99 / t.p50;
    if (tail === undefined || r > tail.r) tail = { level: l, r };
  }
  if (tail === undefined || !(tail.r >= 5)) return [];
  const t = tail.level.metrics.ttftMs!;
  return [
    `At ${tail.level.label}, TTFT p99 is ${ratioText(tail.r)} its p50 (${num(t.p99)} vs ` +
    `${num(t.p50)} ms): some requests wait far longer than the typical one.`,
  ];
}

/** Rule 6: failures per level, or that every request succeeded. */
function failures(levels: readonly LevelReport[]): string[] {
  const failing = levels.filter((l) => l.metrics.failed > 0);
  if (failing.length === 0) {
    const total = levels.reduce((s, l) => s + l.metrics.totalRequests, 0);
    return [`All ${total} requests succeeded.`];
  }
  return failing.map((l) => {
    const top = l.metrics.errors[0];
    return `${l.metrics.failed} of ${l.metrics.totalRequests} requests failed at ${l.label}` +
      (top ? ` (most common: "${top.message}", ${top.count}x).` : ".");
  });
}

/** Rule 7: with SLOs, the best goodput and the levels where < 90% met the SLOs. */
function goodput(ok: readonly LevelReport[], slo: Slo): string[] {
  if (slo.ttftMs === undefined && slo.tpotMs === undefined) return [];
  const withGood = ok.filter((l) => l.metrics.goodput !== null);
  if (withGood.length === 0) return [];
  const best = withGood.reduce((a, b) => (b.metrics.goodput! > a.metrics.goodput! ? b : a));
  const missing = withGood.filter((l) => l.metrics.goodRequests! < 0.9 * l.metrics.successful);
  return [
    `Best goodput is ${num(best.metrics.goodput)} req/s at ${best.label} ` +
    `(${best.metrics.goodRequests} of ${best.metrics.totalRequests} requests within SLO).`,
    ...missing.map((l) =>
      `At ${l.label} only ${pct(l.metrics.goodRequests! / l.metrics.successful)} of ` +
      `successful requests meet the SLOs.`
    ),
  ];
}

/** Rule 8: a warning when the server sent no usage chunk. */
function usageWarning(ok: readonly LevelReport[]): string[] {
  if (!ok.some((l) => !l.metrics.usageReported)) return [];
  return [
    "The server sent no usage chunk for some requests: their output lengths count streamed " +
    "chunks, which undercounts tokens when a chunk carries several.",
  ];
}

/** Rule 9: the levels where the server preempted requests (its `/metrics` says how many). */
function preemptions(levels: readonly LevelReport[]): string[] {
  return levels.filter((l) => (l.preemptions ?? 0) > 0).map((l) =>
    `The server preempted requests ${l.preemptions} times at ${l.label} ` +
    `(vllm:num_preemptions_total): its KV cache does not hold this load at once, so these ` +
    `figures include recomputed or swapped work (a larger KV cache, e.g. the server's ` +
    `--kv-cache-memory, measures the engine alone).`
  );
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
 * 9. The levels where the server reported preemptions.
 */
export function analyze(levels: readonly LevelReport[], slo: Slo): string[] {
  if (levels.length === 0) return [];
  const ok = levels.filter((l) => l.metrics.successful > 0);
  return [
    ...peakThroughput(ok),
    ...scaling(levels),
    ...(ok.length > 1 ? [...saturation(levels, ok), ...tpotTrend(ok)] : []),
    ...ttftTail(ok),
    ...failures(levels),
    ...goodput(ok, slo),
    ...usageWarning(ok),
    ...preemptions(levels),
  ];
}
