/**
 * The serving report's three SVG charts (throughput and TTFT against the load, latency against
 * throughput), drawn with bench/lib/line_chart.ts, and the file names they are written under.
 *
 * @module
 */

import { lineChart } from "../lib/line_chart.ts";
import type { BenchReport } from "./report.ts";

/** File names of the charts written beside the report (and linked from report.md). */
export const CHART_FILES = {
  throughput: "throughput_vs_concurrency.svg",
  ttft: "ttft_vs_concurrency.svg",
  latency: "latency_vs_throughput.svg",
} as const;

/** The report's three charts, keyed by file name. */
export function reportCharts(report: BenchReport): Map<string, string> {
  const rate = report.config.mode === "rate";
  const levels = report.levels.filter((l) => l.metrics.successful > 0);
  const load = (l: (typeof levels)[number]) => (rate ? l.requestRate : l.concurrency) ?? NaN;
  const xLabel = rate ? "Request rate (req/s)" : "Concurrency (requests in flight)";
  const xs = levels.map(load).filter((x) => x > 0 && Number.isFinite(x));
  const xLog = xs.length > 1 && Math.max(...xs) / Math.min(...xs) >= 8;
  const where = rate ? "request rate" : "concurrency";
  const tag = (l: (typeof levels)[number]) => (rate ? `${l.requestRate}/s` : `c=${l.concurrency}`);
  const charts = new Map<string, string>();
  charts.set(
    CHART_FILES.throughput,
    lineChart({
      title: `Throughput vs ${where}`,
      xLabel,
      yLabel: "Throughput (tokens/s)",
      xLog,
      series: [
        {
          name: "output tok/s",
          points: levels.map((l) => ({ x: load(l), y: l.metrics.outputThroughput })),
        },
        {
          name: "total tok/s",
          dashed: true,
          points: levels.map((l) => ({ x: load(l), y: l.metrics.totalThroughput })),
        },
      ],
    }),
  );
  charts.set(
    CHART_FILES.ttft,
    lineChart({
      title: `Time to first token vs ${where}`,
      xLabel,
      yLabel: "TTFT (ms)",
      xLog,
      series: [
        {
          name: "TTFT p50",
          points: levels.map((l) => ({ x: load(l), y: l.metrics.ttftMs?.p50 ?? NaN })),
        },
        {
          name: "TTFT p95",
          dashed: true,
          points: levels.map((l) => ({ x: load(l), y: l.metrics.ttftMs?.p95 ?? NaN })),
        },
      ],
    }),
  );
  charts.set(
    CHART_FILES.latency,
    lineChart({
      title: "Latency vs throughput",
      xLabel: "Output throughput (tokens/s)",
      yLabel: "E2E latency (ms)",
      series: [
        {
          name: "E2E p50",
          points: levels.map((l) => ({
            x: l.metrics.outputThroughput,
            y: l.metrics.e2eMs?.p50 ?? NaN,
            label: tag(l),
          })),
        },
        {
          name: "E2E p95",
          dashed: true,
          points: levels.map((l) => ({
            x: l.metrics.outputThroughput,
            y: l.metrics.e2eMs?.p95 ?? NaN,
          })),
        },
      ],
    }),
  );
  return charts;
}
