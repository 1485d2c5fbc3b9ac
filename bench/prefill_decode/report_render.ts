/**
 * The prefill / decode report as Markdown (report.md) and plain text (console): the same four
 * sections, prefill vs decode time, arithmetic intensity, roofline, batch size, each a table and
 * a line or two of context.
 *
 * @module
 */

import { fmt, markdownTable, textTable } from "../batching/table.ts";
import type { PrefillDecodeReport } from "./report.ts";

/** A table's header and rows, rendered as Markdown or text. */
interface Table {
  readonly header: readonly string[];
  readonly rows: readonly (readonly string[])[];
}

function sci(v: number): string {
  if (!Number.isFinite(v)) return "n/a";
  if (v >= 1e12) return `${(v / 1e12).toFixed(2)} T`;
  if (v >= 1e9) return `${(v / 1e9).toFixed(2)} G`;
  if (v >= 1e6) return `${(v / 1e6).toFixed(2)} M`;
  return v.toFixed(0);
}

function phaseTable(r: PrefillDecodeReport): Table {
  return {
    header: ["phase", "steps", "ms", "% of total"],
    rows: [
      ["prefill", "1", fmt(r.prefill_ms), fmt(r.prefill_pct)],
      ["decode", String(r.decode_steps), fmt(r.decode_ms), fmt(r.decode_pct)],
    ],
  };
}

function stepLine(r: PrefillDecodeReport): string {
  const d = r.decode_ms_per_step;
  return `decode ms/step, awaited: mean ${fmt(d.mean, 2)}, p50 ${fmt(d.p50, 2)}, ` +
    `min ${fmt(d.min, 2)}, max ${fmt(d.max, 2)}; pipelined: ${
      fmt(r.decode_pipelined_ms_per_step, 2)
    } ms/step`;
}

function intensityTable(r: PrefillDecodeReport): Table {
  const i = r.intensity;
  return {
    header: ["step", "new tokens", "FLOPs", "bytes", "FLOP/byte"],
    rows: [
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
    ],
  };
}

function ceilingsLine(r: PrefillDecodeReport): string {
  const c = r.ceilings;
  return `ceilings measured in this run: copy bandwidth ${fmt(c.copy_bandwidth_gb_s)} GB/s, ` +
    `matmul ${fmt(c.matmul_gflops)} GFLOP/s (${c.matmul_source}); ridge point ${
      fmt(c.ridge_flop_per_byte, 2)
    } FLOP/byte. Counted: ${r.intensity.counted}`;
}

function rooflineTable(r: PrefillDecodeReport): Table {
  return {
    header: [
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
    ],
    rows: r.roofline.rows.map((x) => [
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
    ]),
  };
}

function rooflineNote(r: PrefillDecodeReport): string {
  const a100 = r.ceilings.a100;
  return `roofline (time >= max(FLOPs / peak, bytes / bandwidth)), prefill of ${r.prompt_len} ` +
    `tokens, decode at context ${r.roofline.decode_context}, batch 1; shapes: ${r.roofline.shapes}; ` +
    `A100: ${a100.bandwidth_gb_s} GB/s, ${a100.f16_gflops / 1000} TFLOP/s f16 (${a100.source})`;
}

function batchTable(r: PrefillDecodeReport): Table {
  return {
    header: ["batching", "batch", "out tok/s", "mean latency ms", "p95 ms", "mean TTFT ms"],
    rows: (r.batch_sweep?.rows ?? []).map((b) => [
      b.scheduler === "static" ? "naive static" : "continuous",
      String(b.batchSize),
      fmt(b.outputTokensPerS),
      fmt(b.meanLatencyMs, 0),
      fmt(b.p95LatencyMs, 0),
      fmt(b.meanTtftMs, 0),
    ]),
  };
}

function sweepNote(r: PrefillDecodeReport): string {
  const sw = r.batch_sweep;
  return sw === null ? "batch sweep: skipped" : `batch sweep: ${sw.model}, ${sw.requests} ` +
    `requests at once (prompt ${sw.prompt_len}, outputs uniform ${
      sw.output_len.join("..")
    }), WebGPU ` +
    "executor, pipelined; naive static = a batch runs until its longest request ends; latency = " +
    "arrival (t = 0) to last token";
}

/** The report as Markdown (report.md) and plain text (console). */
export function render(r: PrefillDecodeReport): { markdown: string; text: string } {
  const md = (t: Table) => markdownTable(t.header, t.rows);
  const txt = (t: Table) => textTable(t.header, t.rows);
  const [phases, intensity, roofline, batches] = [
    phaseTable(r),
    intensityTable(r),
    rooflineTable(r),
    batchTable(r),
  ];
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
    md(phases),
    "",
    stepLine(r),
    "",
    "![decode steps](decode_steps.svg)",
    "",
    "## Arithmetic intensity (this model's shapes and dtype)",
    "",
    md(intensity),
    "",
    ceilingsLine(r),
    "",
    "## Roofline",
    "",
    rooflineNote(r),
    "",
    md(roofline),
    "",
    "## Batch size: throughput vs latency",
    "",
    sweepNote(r),
    "",
    md(batches),
    "",
    "![throughput](batch_throughput.svg) ![latency](batch_latency.svg)",
    "",
  ].join("\n");
  const text = [
    ...head,
    txt(phases),
    stepLine(r),
    txt(intensity),
    ceilingsLine(r),
    rooflineNote(r),
    txt(roofline),
    sweepNote(r),
    txt(batches),
  ].join("\n");
  return { markdown, text };
}
