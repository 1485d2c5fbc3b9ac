/**
 * The prefill / decode benchmark's report: the JSON document (report.json, `--json`), its
 * Markdown and plain-text rendering, and the SVG charts of decode steps and the batch sweep.
 *
 * @module
 */

import { fmt, markdownTable, textTable } from "../batching/table.ts";
import { lineChart } from "../serve/report_svg.ts";
import type { BatchRow } from "./measure.ts";

/** One row of the roofline table. */
export interface RooflineRow {
  readonly model: string;
  readonly params_b: number;
  readonly weight_gb: number;
  readonly prefill_flop_per_byte: number;
  readonly decode_flop_per_byte: number;
  readonly prefill_ms_here: number;
  readonly prefill_bound_here: "compute" | "memory";
  readonly decode_ms_here: number;
  readonly decode_bound_here: "compute" | "memory";
  readonly decode_tok_s_here: number;
  readonly decode_ms_a100: number;
  readonly decode_tok_s_a100: number;
}

/** The JSON report (report.json, and `--json` output). */
export interface PrefillDecodeReport {
  readonly bench: "prefill-decode";
  readonly machine: string;
  readonly model: string;
  readonly weight_dtype: string;
  readonly prompt_len: number;
  readonly gen: number;
  readonly timing_method: string;
  readonly prefill_ms: number;
  readonly decode_ms: number;
  readonly decode_steps: number;
  readonly prefill_pct: number;
  readonly decode_pct: number;
  readonly decode_ms_per_step: {
    readonly mean: number;
    readonly p50: number;
    readonly min: number;
    readonly max: number;
  };
  readonly decode_pipelined_ms_per_step: number;
  readonly decode_step_ms: readonly number[];
  readonly intensity: {
    readonly counted: string;
    readonly prefill: {
      readonly flops: number;
      readonly bytes: number;
      readonly flop_per_byte: number;
    };
    readonly decode: {
      readonly context: number;
      readonly flops: number;
      readonly bytes: number;
      readonly flop_per_byte: number;
    };
  };
  readonly ceilings: {
    readonly copy_bandwidth_gb_s: number;
    readonly matmul_gflops: number;
    readonly matmul_source: string;
    readonly ridge_flop_per_byte: number;
    readonly a100: {
      readonly bandwidth_gb_s: number;
      readonly f16_gflops: number;
      readonly source: string;
    };
  };
  readonly roofline: {
    readonly shapes: string;
    readonly decode_context: number;
    readonly rows: readonly RooflineRow[];
  };
  readonly batch_sweep: {
    readonly model: string;
    readonly requests: number;
    readonly prompt_len: number;
    readonly output_len: readonly [number, number];
    readonly rows: readonly BatchRow[];
  } | null;
  readonly out_dir: string;
}

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

function sci(v: number): string {
  if (!Number.isFinite(v)) return "n/a";
  if (v >= 1e12) return `${(v / 1e12).toFixed(2)} T`;
  if (v >= 1e9) return `${(v / 1e9).toFixed(2)} G`;
  if (v >= 1e6) return `${(v / 1e6).toFixed(2)} M`;
  return v.toFixed(0);
}

/** The report as Markdown (report.md) and plain text (console). */
export function render(r: PrefillDecodeReport): { markdown: string; text: string } {
  const phaseHeader = ["phase", "steps", "ms", "% of total"];
  const phaseRows = [
    ["prefill", "1", fmt(r.prefill_ms), fmt(r.prefill_pct)],
    ["decode", String(r.decode_steps), fmt(r.decode_ms), fmt(r.decode_pct)],
  ];
  const d = r.decode_ms_per_step;
  const stepLine = `decode ms/step, awaited: mean ${fmt(d.mean, 2)}, p50 ${fmt(d.p50, 2)}, ` +
    `min ${fmt(d.min, 2)}, max ${fmt(d.max, 2)}; pipelined: ${
      fmt(r.decode_pipelined_ms_per_step, 2)
    } ms/step`;
  const intHeader = ["step", "new tokens", "FLOPs", "bytes", "FLOP/byte"];
  const i = r.intensity;
  const intRows = [
    [
      "prefill",
      String(r.prompt_len),
      sci(i.prefill.flops),
      sci(i.prefill.bytes),
      fmt(i.prefill.flop_per_byte, 2),
    ],
    [
      `decode (context ${i.decode.context})`,
      "1",
      sci(i.decode.flops),
      sci(i.decode.bytes),
      fmt(i.decode.flop_per_byte, 2),
    ],
  ];
  const c = r.ceilings;
  const ceil =
    `ceilings measured in this run: copy bandwidth ${fmt(c.copy_bandwidth_gb_s)} GB/s, ` +
    `matmul ${fmt(c.matmul_gflops)} GFLOP/s (${c.matmul_source}); ridge point ${
      fmt(c.ridge_flop_per_byte, 2)
    } FLOP/byte. Counted: ${i.counted}`;
  const roofHeader = [
    "model",
    "params (B)",
    "weights (GB)",
    "prefill FLOP/B",
    "decode FLOP/B",
    "prefill ms here",
    "decode ms/token here",
    "tok/s here",
    "decode ms A100",
    "tok/s A100",
  ];
  const roofRows = r.roofline.rows.map((x) => [
    x.model,
    fmt(x.params_b, 2),
    fmt(x.weight_gb, 1),
    fmt(x.prefill_flop_per_byte, 1),
    fmt(x.decode_flop_per_byte, 2),
    `${fmt(x.prefill_ms_here, 0)} (${x.prefill_bound_here})`,
    `${fmt(x.decode_ms_here, 1)} (${x.decode_bound_here})`,
    fmt(x.decode_tok_s_here, 2),
    fmt(x.decode_ms_a100, 2),
    fmt(x.decode_tok_s_a100, 0),
  ]);
  const roofNote =
    `roofline (time >= max(FLOPs / peak, bytes / bandwidth)), prefill of ${r.prompt_len} ` +
    `tokens, decode at context ${r.roofline.decode_context}, batch 1; shapes: ${r.roofline.shapes}; ` +
    `A100: ${c.a100.bandwidth_gb_s} GB/s, ${
      c.a100.f16_gflops / 1000
    } TFLOP/s f16 (${c.a100.source})`;
  const batchHeader = [
    "batching",
    "batch",
    "out tok/s",
    "mean latency ms",
    "p95 ms",
    "mean TTFT ms",
  ];
  const sw = r.batch_sweep;
  const bRows = (sw?.rows ?? []).map((b) => [
    b.scheduler === "static" ? "naive static" : "continuous",
    String(b.batchSize),
    fmt(b.outputTokensPerS),
    fmt(b.meanLatencyMs, 0),
    fmt(b.p95LatencyMs, 0),
    fmt(b.meanTtftMs, 0),
  ]);
  const sweepNote = sw === null
    ? "batch sweep: skipped"
    : `batch sweep: ${sw.model}, ${sw.requests} ` +
      `requests at once (prompt ${sw.prompt_len}, outputs uniform ${
        sw.output_len.join("..")
      }), WebGPU ` +
      "executor, pipelined; naive static = a batch runs until its longest request ends; latency = " +
      "arrival (t = 0) to last token";
  const head = [
    `model: ${r.model}, weights ${r.weight_dtype}; prompt ${r.prompt_len} tokens, ${r.gen} generated`,
    r.machine,
    `timing: ${r.timing_method}`,
  ];
  const markdown = [
    "# Prefill vs decode (003)",
    "",
    ...head.map((l) => `${l}  `),
    "",
    "## Prefill vs decode time",
    "",
    markdownTable(phaseHeader, phaseRows),
    "",
    stepLine,
    "",
    "![decode steps](decode_steps.svg)",
    "",
    "## Arithmetic intensity (this model's shapes and dtype)",
    "",
    markdownTable(intHeader, intRows),
    "",
    ceil,
    "",
    "## Roofline",
    "",
    roofNote,
    "",
    markdownTable(roofHeader, roofRows),
    "",
    "## Batch size: throughput vs latency",
    "",
    sweepNote,
    "",
    markdownTable(batchHeader, bRows),
    "",
    "![throughput](batch_throughput.svg) ![latency](batch_latency.svg)",
    "",
  ].join("\n");
  const text = [
    ...head,
    textTable(phaseHeader, phaseRows),
    stepLine,
    textTable(intHeader, intRows),
    ceil,
    roofNote,
    textTable(roofHeader, roofRows),
    sweepNote,
    textTable(batchHeader, bRows),
  ].join("\n");
  return { markdown, text };
}
