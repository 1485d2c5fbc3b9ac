/**
 * The prefill / decode benchmark's report: the JSON document (report.json, `--json`) and how it
 * is worked out from the measurements (intensity, ceilings, roofline rows). Its Markdown and
 * plain-text rendering are in report_render.ts, its charts in report_svg.ts.
 *
 * @module
 */

import {
  decodeCost,
  type ModelShape,
  type Precision,
  prefillCost,
  rooflineMs,
  STANDARD_SHAPES,
  totalParams,
} from "../lib/roofline.ts";
import { type BatchRow, type PhaseTiming, SWEEP_PROMPT, sweepOutputLen } from "./measure.ts";
import type { Options } from "./options.ts";

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

/** A100 SXM 80 GB datasheet figures, for comparison (not measured). */
const A100 = { bandwidthGBs: 2039, f16Gflops: 312_000 } as const;

/** What one run measured, the input of {@linkcode buildReport}. */
export interface Measurements {
  readonly machine: string;
  /** The model as named in the report. */
  readonly model: string;
  readonly weightDtype: string;
  /** Whether the adapter timed steps with timestamp queries. */
  readonly hasTimestamps: boolean;
  readonly phases: PhaseTiming;
  /** Measured copy bandwidth, GB/s. */
  readonly bandwidthGBs: number;
  /** Measured matmul GFLOP/s. */
  readonly matmulGflops: number;
  readonly shape: ModelShape;
  /** The batch-size sweep; null when skipped. */
  readonly batchRows: BatchRow[] | null;
}

/** The step-time fields of the report: prefill vs decode, per-step statistics. */
function phaseFigures(phases: PhaseTiming) {
  const stepMs = phases.decodeStepMs;
  const decodeMs = stepMs.reduce((a, b) => a + b, 0);
  const total = phases.prefillMs + decodeMs;
  const sorted = [...stepMs].sort((a, b) => a - b);
  return {
    prefill_ms: phases.prefillMs,
    decode_ms: decodeMs,
    decode_steps: stepMs.length,
    prefill_pct: (100 * phases.prefillMs) / total,
    decode_pct: (100 * decodeMs) / total,
    decode_ms_per_step: {
      mean: decodeMs / stepMs.length,
      p50: sorted[Math.floor(sorted.length / 2)] ?? NaN,
      min: sorted[0] ?? NaN,
      max: sorted[sorted.length - 1] ?? NaN,
    },
    decode_pipelined_ms_per_step: phases.pipelinedDecodeStepMs,
    decode_step_ms: stepMs,
  };
}

/** How the step times were taken. */
function timingMethod(hasTimestamps: boolean): string {
  return (hasTimestamps
    ? "GPU time of each step's compute pass (timestamp-query), each step submitted and " +
      "awaited on its own"
    : "host wall time per step, each step submitted and awaited (maxInFlight 1, Deno's " +
      "~10 ms readback floor included: this adapter has no timestamp-query)") +
    "; pipelined = host wall time of the same generation with steps kept in flight, " +
    "total / steps";
}

/** Arithmetic intensity of this model's prefill and of a decode step at `midContext`. */
function intensity(
  m: Measurements,
  promptLen: number,
  midContext: number,
): PrefillDecodeReport["intensity"] {
  const bytes = m.weightDtype === "f16" ? 2 : 4;
  const precision: Precision = { weightBytes: bytes, kvBytes: bytes };
  const pre = prefillCost(m.shape, precision, promptLen);
  const dec = decodeCost(m.shape, precision, midContext);
  return {
    counted: "linear layers, attention, LM head on the sampled row; weights read once per " +
      "step, KV read and written; not norms, RoPE, activations",
    prefill: { flops: pre.flops, bytes: pre.bytes, flop_per_byte: pre.flops / pre.bytes },
    decode: {
      context: midContext,
      flops: dec.flops,
      bytes: dec.bytes,
      flop_per_byte: dec.flops / dec.bytes,
    },
  };
}

/** The measured ceilings, beside the A100's datasheet figures. */
function ceilings(m: Measurements): PrefillDecodeReport["ceilings"] {
  return {
    copy_bandwidth_gb_s: m.bandwidthGBs,
    matmul_gflops: m.matmulGflops,
    matmul_source: `engine Matmul kernel, M=256 N=K=1024, ${m.weightDtype} weights, GPU ` +
      "timestamps (bench/support.ts timeGpu)",
    ridge_flop_per_byte: m.matmulGflops / m.bandwidthGBs,
    a100: {
      bandwidth_gb_s: A100.bandwidthGBs,
      f16_gflops: A100.f16Gflops,
      source: "NVIDIA A100 SXM 80GB datasheet",
    },
  };
}

/** The roofline of every standard shape (f16) at this machine's ceilings and an A100's. */
function rooflineRows(
  m: Measurements,
  promptLen: number,
  midContext: number,
): RooflineRow[] {
  const f16: Precision = { weightBytes: 2, kvBytes: 2 };
  return STANDARD_SHAPES.map((s) => {
    const p = prefillCost(s, f16, promptLen);
    const d = decodeCost(s, f16, midContext);
    const here = rooflineMs(d, m.matmulGflops, m.bandwidthGBs);
    const a100 = rooflineMs(d, A100.f16Gflops, A100.bandwidthGBs);
    const preHere = rooflineMs(p, m.matmulGflops, m.bandwidthGBs);
    return {
      model: s.name,
      params_b: totalParams(s) / 1e9,
      weight_gb: (totalParams(s) * 2) / 1e9,
      prefill_flop_per_byte: p.flops / p.bytes,
      decode_flop_per_byte: d.flops / d.bytes,
      prefill_ms_here: preHere.ms,
      prefill_bound_here: preHere.bound,
      decode_ms_here: here.ms,
      decode_bound_here: here.bound,
      decode_tok_s_here: 1000 / here.ms,
      decode_ms_a100: a100.ms,
      decode_tok_s_a100: 1000 / a100.ms,
    };
  });
}

/** The report of a run with options `o` that measured `m` and writes to `outDir`. */
export function buildReport(o: Options, m: Measurements, outDir: string): PrefillDecodeReport {
  const midContext = o.promptLen + Math.floor(o.gen / 2);
  return {
    bench: "prefill-decode",
    machine: m.machine,
    model: m.model,
    weight_dtype: m.weightDtype,
    prompt_len: o.promptLen,
    gen: o.gen,
    timing_method: timingMethod(m.hasTimestamps),
    ...phaseFigures(m.phases),
    intensity: intensity(m, o.promptLen, midContext),
    ceilings: ceilings(m),
    roofline: {
      shapes: "Qwen3-0.6B (28 layers, hidden 1024, 16/8 heads x 128, MLP 3072, vocab 151936, " +
        "tied); LLaMA-2 7B (32, 4096, 32/32, 11008, 32000), 13B (40, 5120, 40/40, 13824), " +
        "70B (80, 8192, 64/8, 28672); f16 weights and KV",
      decode_context: midContext,
      rows: rooflineRows(m, o.promptLen, midContext),
    },
    batch_sweep: m.batchRows === null ? null : {
      model: o.batchModel === "main" ? m.model : "tiny-qwen3 (random weights)",
      requests: o.batchRequests,
      prompt_len: SWEEP_PROMPT,
      output_len: sweepOutputLen(o),
      rows: m.batchRows,
    },
    out_dir: outDir,
  };
}
