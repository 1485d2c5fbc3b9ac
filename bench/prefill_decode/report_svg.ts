/**
 * The prefill / decode benchmark's SVG charts: the time of each awaited decode step, and
 * throughput and latency by batch size from the batch sweep.
 *
 * @module
 */

import { lineChart } from "../lib/line_chart.ts";
import type { BatchRow } from "./measure.ts";

/** decode_steps.svg: each awaited decode step's ms and their mean. */
export function decodeChart(stepMs: readonly number[]): string {
  const mean = stepMs.reduce((a, b) => a + b, 0) / Math.max(1, stepMs.length);
  return lineChart({
    title: "Decode step time (each step awaited; GPU time where timestamp-query exists)",
    xLabel: "decode step",
    yLabel: "wall ms",
    series: [
      { name: "step", points: stepMs.map((y, i) => ({ x: i + 1, y })) },
      {
        name: `mean ${mean.toFixed(1)} ms`,
        points: [{ x: 1, y: mean }, { x: stepMs.length, y: mean }],
        dashed: true,
      },
    ],
  });
}

/** batch_throughput.svg and batch_latency.svg: static vs continuous by batch size. */
export function batchCharts(rows: readonly BatchRow[]): { throughput: string; latency: string } {
  const series = (y: (r: BatchRow) => number) =>
    (["static", "continuous"] as const).map((k) => ({
      name: k === "static" ? "naive static" : "continuous",
      points: rows.filter((r) => r.scheduler === k).map((r) => ({ x: r.batchSize, y: y(r) })),
      dashed: k === "static",
    }));
  return {
    throughput: lineChart({
      title: "Batch size vs throughput",
      xLabel: "batch size",
      yLabel: "output tokens/s",
      xLog: true,
      series: series((r) => r.outputTokensPerS),
    }),
    latency: lineChart({
      title: "Batch size vs latency",
      xLabel: "batch size",
      yLabel: "mean request latency (ms)",
      xLog: true,
      series: series((r) => r.meanLatencyMs),
    }),
  };
}
