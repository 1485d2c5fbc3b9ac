/**
 * `deno task bench:prefill-decode`: the prefill / decode bottleneck analysis (experiment 003)
 * on this engine.
 *
 * 1. Prefill vs decode: one prompt of `--prompt-len` tokens prefilled in one step, then
 *    `--gen` tokens generated (the first by the prefill step, the rest by decode steps fed from
 *    the GPU). Each step is submitted and awaited on its own and timed on the GPU with
 *    timestamp queries on its compute pass (host wall time, ~10 ms readback floor included,
 *    where the adapter lacks `timestamp-query`); the same generation is also run pipelined
 *    (the runner's maxInFlight steps in flight) to give the host-side step time.
 * 2. Arithmetic intensity (FLOPs, bytes, FLOP/byte) of that prefill and of a decode step,
 *    from the model's real shapes and weight dtype (bench/lib/roofline.ts says what is counted).
 * 3. Roofline for Qwen3-0.6B and LLaMA-2 7B / 13B / 70B (f16 weights and KV) at this adapter's
 *    measured copy bandwidth and measured matmul GFLOP/s (the engine's Matmul kernel, M = 256,
 *    1024 x 1024, GPU timestamps), beside an A100's datasheet figures.
 * 4. Batch sizes 1, 2, 4, 8, 16: naive static batching (a batch runs until its longest request
 *    finishes) and continuous batching (max_num_seqs = batch size), the same requests through
 *    the WebGPU executor: output throughput and mean / p95 latency.
 *
 * Model (`--model`): a directory, `tiny` (the generated tiny-qwen3), or `qwen3-0.6b` (default:
 * Qwen3-0.6B shapes with random f16 weights generated into a temporary folder, deleted after).
 * The batch sweep uses the tiny model unless `--batch-model main`.
 *
 * Writes report.md, report.json, decode_steps.svg, batch_throughput.svg and batch_latency.svg
 * to `--out-dir` (default bench/results/prefill-decode-<time>/, git-ignored); `--json` prints
 * the JSON report instead of the tables.
 *
 * @module
 */

import { resolveModelDir } from "../cli/engine_flags.ts";
import { makeModel } from "../tools/make_model.ts";
import { describeMachine, measureCopyBandwidth } from "./support.ts";
import { loadRunner } from "./batching/runner_timing.ts";
import {
  decodeCost,
  type ModelShape,
  type Precision,
  prefillCost,
  rooflineMs,
  STANDARD_SHAPES,
  totalParams,
} from "./lib/roofline.ts";
import {
  type BatchRow,
  batchSweep,
  measureMatmulGflops,
  measurePhases,
  type PhaseTiming,
  reloadForSweep,
  shapeOf,
  SWEEP_PROMPT,
  sweepOutputLen,
} from "./prefill_decode/measure.ts";
import { type BenchIo, reportUsage, runMain, UsageError } from "./bench_io.ts";
import { type Options, parsePrefillDecodeArgs } from "./prefill_decode/options.ts";
import {
  batchCharts,
  decodeChart,
  type PrefillDecodeReport,
  render,
  type RooflineRow,
} from "./prefill_decode/report.ts";

/** A100 SXM 80 GB datasheet figures, for comparison (not measured). */
const A100 = { bandwidthGBs: 2039, f16Gflops: 312_000 } as const;

/** Runs the benchmark with `argv`; returns the exit status. */
export async function runPrefillDecodeBench(
  argv: string[],
  io: BenchIo = { log: (l) => console.log(l), err: (l) => console.error(l) },
): Promise<number> {
  let o: Options;
  try {
    o = parsePrefillDecodeArgs(argv);
  } catch (error) {
    if (error instanceof UsageError) return reportUsage(error, io, "bench:prefill-decode");
    throw error;
  }
  let tempDir: string | null = null;
  try {
    let modelDir: string;
    let modelNote: string;
    if (o.model === "qwen3-0.6b") {
      tempDir = await Deno.makeTempDir({ prefix: "prefill-decode-qwen3-" });
      await makeModel({ out: tempDir, preset: "qwen3-0.6b", dtype: "f16", seed: 0 });
      modelDir = tempDir;
      modelNote =
        `qwen3-0.6b preset (Qwen3-0.6B shapes, random f16 weights generated into a temp dir)`;
    } else if (o.model === "tiny") {
      modelDir = await resolveModelDir(undefined);
      modelNote = "tiny-qwen3 (random weights)";
    } else {
      modelDir = await resolveModelDir(o.model);
      modelNote = modelDir;
    }
    const blockSize = 16;
    const maxModelLen = Math.ceil((o.promptLen + o.gen + 1) / blockSize) * blockSize;
    if (!o.json) io.err(`loading ${modelNote} ...`);
    const runner = await loadRunner(
      modelDir,
      {
        maxTokens: Math.max(o.promptLen, 64),
        maxSeqs: 16,
        maxModelLen,
        numKvBlocks: maxModelLen / blockSize,
      },
      blockSize,
      o.kernelProfile,
      o.quantization,
    );
    const ctx = runner.ctx;
    let machine: string;
    let phases: PhaseTiming;
    let bandwidth: number;
    let peak: number;
    let shape: ModelShape;
    const weightDtype = ctx.weightDtype;
    try {
      machine = describeMachine(ctx);
      if (!o.json) io.err("measuring prefill and decode ...");
      phases = await measurePhases(runner, o);
      if (!o.json) io.err("measuring bandwidth and matmul peak ...");
      bandwidth = await measureCopyBandwidth(ctx);
      peak = await measureMatmulGflops(runner);
      shape = shapeOf(runner, modelNote);
    } finally {
      runner.destroy();
      ctx.destroy();
    }
    let batchRows: BatchRow[] | null = null;
    if (o.batchSweep) {
      if (!o.json) io.err("batch-size sweep ...");
      const dir = o.batchModel === "main" ? modelDir : await resolveModelDir(undefined);
      const sweepRunner = await reloadForSweep(dir, o, blockSize);
      try {
        batchRows = await batchSweep(sweepRunner, o);
      } finally {
        const c = sweepRunner.ctx;
        sweepRunner.destroy();
        c.destroy();
      }
    }
    const stepMs = phases.decodeStepMs;
    const decodeMs = stepMs.reduce((a, b) => a + b, 0);
    const total = phases.prefillMs + decodeMs;
    const sorted = [...stepMs].sort((a, b) => a - b);
    const bytes = weightDtype === "f16" ? 2 : 4;
    const precision: Precision = { weightBytes: bytes, kvBytes: bytes };
    const pre = prefillCost(shape, precision, o.promptLen);
    const midContext = o.promptLen + Math.floor(o.gen / 2);
    const dec = decodeCost(shape, precision, midContext);
    const f16: Precision = { weightBytes: 2, kvBytes: 2 };
    const rows: RooflineRow[] = STANDARD_SHAPES.map((m) => {
      const p = prefillCost(m, f16, o.promptLen);
      const d = decodeCost(m, f16, midContext);
      const here = rooflineMs(d, peak, bandwidth);
      const a100 = rooflineMs(d, A100.f16Gflops, A100.bandwidthGBs);
      const preHere = rooflineMs(p, peak, bandwidth);
      return {
        model: m.name,
        params_b: totalParams(m) / 1e9,
        weight_gb: (totalParams(m) * 2) / 1e9,
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
    const outDir = o.outDir ??
      `bench/results/prefill-decode-${new Date().toISOString().replace(/[:.]/g, "-")}`;
    const report: PrefillDecodeReport = {
      bench: "prefill-decode",
      machine,
      model: modelNote,
      weight_dtype: weightDtype,
      prompt_len: o.promptLen,
      gen: o.gen,
      timing_method: (ctx.hasTimestamps
        ? "GPU time of each step's compute pass (timestamp-query), each step submitted and " +
          "awaited on its own"
        : "host wall time per step, each step submitted and awaited (maxInFlight 1, Deno's " +
          "~10 ms readback floor included: this adapter has no timestamp-query)") +
        "; pipelined = host wall time of the same generation with steps kept in flight, " +
        "total / steps",
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
      intensity: {
        counted: "linear layers, attention, LM head on the sampled row; weights read once per " +
          "step, KV read and written; not norms, RoPE, activations",
        prefill: { flops: pre.flops, bytes: pre.bytes, flop_per_byte: pre.flops / pre.bytes },
        decode: {
          context: midContext,
          flops: dec.flops,
          bytes: dec.bytes,
          flop_per_byte: dec.flops / dec.bytes,
        },
      },
      ceilings: {
        copy_bandwidth_gb_s: bandwidth,
        matmul_gflops: peak,
        matmul_source: `engine Matmul kernel, M=256 N=K=1024, ${weightDtype} weights, GPU ` +
          "timestamps (bench/support.ts timeGpu)",
        ridge_flop_per_byte: peak / bandwidth,
        a100: {
          bandwidth_gb_s: A100.bandwidthGBs,
          f16_gflops: A100.f16Gflops,
          source: "NVIDIA A100 SXM 80GB datasheet",
        },
      },
      roofline: {
        shapes: "Qwen3-0.6B (28 layers, hidden 1024, 16/8 heads x 128, MLP 3072, vocab 151936, " +
          "tied); LLaMA-2 7B (32, 4096, 32/32, 11008, 32000), 13B (40, 5120, 40/40, 13824), " +
          "70B (80, 8192, 64/8, 28672); f16 weights and KV",
        decode_context: midContext,
        rows,
      },
      batch_sweep: batchRows === null ? null : {
        model: o.batchModel === "main" ? modelNote : "tiny-qwen3 (random weights)",
        requests: o.batchRequests,
        prompt_len: SWEEP_PROMPT,
        output_len: sweepOutputLen(o),
        rows: batchRows,
      },
      out_dir: outDir,
    };
    await Deno.mkdir(outDir, { recursive: true });
    const rendered = render(report);
    await Deno.writeTextFile(`${outDir}/report.md`, rendered.markdown);
    await Deno.writeTextFile(`${outDir}/report.json`, JSON.stringify(report, null, 2));
    await Deno.writeTextFile(`${outDir}/decode_steps.svg`, decodeChart(stepMs));
    const charts = batchCharts(batchRows ?? []);
    await Deno.writeTextFile(`${outDir}/batch_throughput.svg`, charts.throughput);
    await Deno.writeTextFile(`${outDir}/batch_latency.svg`, charts.latency);
    if (o.json) {
      io.log(JSON.stringify(report));
    } else {
      io.log(rendered.text);
      io.log(`wrote ${outDir}/report.md, report.json, decode_steps.svg, batch_*.svg`);
    }
    return 0;
  } finally {
    if (tempDir !== null) await Deno.remove(tempDir, { recursive: true });
  }
}

if (import.meta.main) Deno.exit(await runMain(() => runPrefillDecodeBench(Deno.args)));
