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

import { parseArgs } from "node:util";
import { resolveModelDir } from "../cli/engine_flags.ts";
import { STORAGE_RW } from "../engine/gpu/context.ts";
import { ParamArena } from "../engine/gpu/params.ts";
import { GpuMatrix } from "../engine/gpu/tensor.ts";
import type { ForwardBatch } from "../engine/forward_batch.ts";
import { WebGpuExecutor } from "../engine/executors/webgpu_executor.ts";
import { GpuTimer } from "../engine/gpu/timer.ts";
import type { ModelRunner } from "../engine/model_runner.ts";
import { Matmul } from "../kernels/matmul.ts";
import { makeModel } from "../tools/make_model.ts";
import { describeMachine, measureCopyBandwidth, timeGpu } from "./support.ts";
import { makeScheduler, runHarness, summarizeRun, WallTimeline } from "./batching/harness.ts";
import { loadRunner, syntheticBatch } from "./batching/runner_timing.ts";
import { fmt, markdownTable, textTable } from "./batching/table.ts";
import { makeWorkload } from "./batching/workload.ts";
import {
  decodeCost,
  type ModelShape,
  type Precision,
  prefillCost,
  rooflineMs,
  STANDARD_SHAPES,
  totalParams,
} from "./lib/roofline.ts";
import { lineChart } from "./serve/report_svg.ts";

/** A100 SXM 80 GB datasheet figures, for comparison (not measured). */
const A100 = { bandwidthGBs: 2039, f16Gflops: 312_000 } as const;

const USAGE = `usage: deno task bench:prefill-decode [options]
  --model DIR|tiny|qwen3-0.6b  model (default qwen3-0.6b: random weights in a temp dir)
  --prompt-len N               prompt tokens (default 512)
  --gen N                      generated tokens (default 64)
  --batch-model tiny|main      model of the batch-size sweep (default tiny)
  --batch-sizes LIST           batch sizes (default 1,2,4,8,16)
  --batch-requests N           requests per batch-size run (default 16)
  --batch-gen N                mean output tokens in the sweep, outputs uniform N/4..2N (default 32)
  --no-batch-sweep             skip section 4
  --json                       print the JSON report instead of tables
  --out-dir DIR                default bench/results/prefill-decode-<time>/`;

/** Bad command-line input. */
export class UsageError extends Error {
  override name = "UsageError";
}

/** Where output goes (tests capture it). */
export interface BenchIo {
  log(line: string): void;
  err(line: string): void;
}

interface Options {
  model: string;
  promptLen: number;
  gen: number;
  batchModel: "tiny" | "main";
  batchSizes: number[];
  batchRequests: number;
  batchGen: number;
  batchSweep: boolean;
  json: boolean;
  outDir: string | undefined;
}

function int(flag: string, text: string, least: number): number {
  const v = Number(text);
  if (text.trim() === "" || !Number.isInteger(v) || v < least) {
    throw new UsageError(`--${flag} must be an integer >= ${least}, got '${text}'`);
  }
  return v;
}

/** Parses the command line (see USAGE). */
export function parsePrefillDecodeArgs(argv: string[]): Options {
  let v;
  try {
    ({ values: v } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        model: { type: "string", default: "qwen3-0.6b" },
        "prompt-len": { type: "string", default: "512" },
        gen: { type: "string", default: "64" },
        "batch-model": { type: "string", default: "tiny" },
        "batch-sizes": { type: "string", default: "1,2,4,8,16" },
        "batch-requests": { type: "string", default: "16" },
        "batch-gen": { type: "string", default: "32" },
        "no-batch-sweep": { type: "boolean", default: false },
        json: { type: "boolean", default: false },
        "out-dir": { type: "string" },
        help: { type: "boolean", default: false },
      },
    }));
  } catch (error) {
    throw new UsageError(error instanceof Error ? error.message : String(error));
  }
  if (v.help) throw new UsageError(USAGE);
  const bm = v["batch-model"];
  if (bm !== "tiny" && bm !== "main") {
    throw new UsageError(`--batch-model must be tiny or main, got '${bm}'`);
  }
  return {
    model: v.model,
    promptLen: int("prompt-len", v["prompt-len"], 1),
    gen: int("gen", v.gen, 2),
    batchModel: bm,
    batchSizes: v["batch-sizes"].split(",").map((s) => int("batch-sizes", s, 1)),
    batchRequests: int("batch-requests", v["batch-requests"], 1),
    batchGen: int("batch-gen", v["batch-gen"], 4),
    batchSweep: !v["no-batch-sweep"],
    json: v.json,
    outDir: v["out-dir"],
  };
}

/** Section 1's measurements. */
interface PhaseTiming {
  readonly prefillMs: number;
  /** ms of each decode step, awaited one by one (GPU timestamps, else wall time). */
  readonly decodeStepMs: readonly number[];
  /** Mean ms per decode step with steps pipelined. */
  readonly pipelinedDecodeStepMs: number;
}

/** The decode step after `prev` for the single sequence: its input is prev's sample. */
function decodeBatch(runner: ModelRunner, prevStep: number, position: number): ForwardBatch {
  const bs = runner.options.blockSize;
  const blocks = Math.ceil((position + 1) / bs);
  const blockTable = Array.from({ length: blocks }, (_, j) => j);
  return {
    inputIds: Uint32Array.of(runner.sampledRef(prevStep, 0)),
    positions: Uint32Array.of(position),
    slotMapping: Uint32Array.of(blockTable[Math.floor(position / bs)]! * bs + (position % bs)),
    seqs: [{
      queryLen: 1,
      contextLen: position + 1,
      blockTable,
      sample: { temperature: 0, seed: 0, counter: position + 1 },
    }],
  };
}

/**
 * Prefill then `gen - 1` decode steps, each awaited. Returns per-step ms: GPU time of the step's
 * compute pass from timestamp queries where the adapter has them, else host wall time.
 */
async function generate(
  runner: ModelRunner,
  promptLen: number,
  gen: number,
): Promise<{ prefillMs: number; stepMs: number[]; lastStep: number }> {
  const timer = runner.ctx.hasTimestamps ? new GpuTimer(runner.ctx, 1) : null;
  const timing = timer === null ? undefined : {
    descriptor: timer.passDescriptor(0),
    resolve: (encoder: GPUCommandEncoder) => timer.resolve(encoder, 1),
  };
  const run = async (batch: ForwardBatch) => {
    const t0 = performance.now();
    const h = runner.execute(batch, timing);
    await h.result;
    const ms = timer === null ? performance.now() - t0 : (await timer.read(1))[0]!;
    return { h, ms };
  };
  try {
    const prefill = syntheticBatch(runner, { seqs: 1, queryLen: promptLen, contextLen: promptLen });
    let { h, ms: prefillMs } = await run(prefill);
    const stepMs: number[] = [];
    for (let i = 1; i < gen; i++) {
      const r = await run(decodeBatch(runner, h.step, promptLen + i - 1));
      h = r.h;
      stepMs.push(r.ms);
    }
    return { prefillMs, stepMs, lastStep: h.step };
  } finally {
    timer?.destroy();
  }
}

/**
 * The same `gen - 1` decode steps again (same positions and contexts, over the KV the prefill
 * left), the runner's maxInFlight steps in flight, fed from step `from`'s sample. Returns the
 * mean ms per step.
 */
async function decodePipelined(
  runner: ModelRunner,
  from: number,
  promptLen: number,
  gen: number,
): Promise<number> {
  const queue: Promise<unknown>[] = [];
  let prev = from;
  const t0 = performance.now();
  for (let i = 1; i < gen; i++) {
    const h = runner.execute(decodeBatch(runner, prev, promptLen + i - 1));
    prev = h.step;
    queue.push(h.result);
    if (queue.length >= runner.maxInFlight) await queue.shift();
  }
  await Promise.all(queue);
  return (performance.now() - t0) / (gen - 1);
}

async function measurePhases(runner: ModelRunner, o: Options): Promise<PhaseTiming> {
  // Warm-up: compile every pipeline the measured steps use.
  await generate(runner, Math.min(o.promptLen, 32), 3);
  const sync = await generate(runner, o.promptLen, o.gen);
  let prefillMs = sync.prefillMs;
  let last = sync.lastStep;
  if (prefillMs < 2000) {
    // Short prefills: best of three (other processes on the CPU only ever add time).
    for (let i = 0; i < 2; i++) {
      const again = await generate(runner, o.promptLen, 2);
      prefillMs = Math.min(prefillMs, again.prefillMs);
      last = again.lastStep;
    }
  }
  return {
    prefillMs,
    decodeStepMs: sync.stepMs,
    pipelinedDecodeStepMs: await decodePipelined(runner, last, o.promptLen, o.gen),
  };
}

/** Matmul GFLOP/s of the engine's kernel (M = 256, N = K = 1024, the context's weight dtype). */
async function measureMatmulGflops(runner: ModelRunner): Promise<number> {
  const ctx = runner.ctx;
  const m = 256;
  const n = 1024;
  const k = 1024;
  const matmul = new Matmul(ctx, { dtype: ctx.weightDtype, bias: false });
  const weight = GpuMatrix.create(ctx, "peak.w", n, k, ctx.weightDtype, { padColsTo: 4 });
  const x = ctx.createBuffer("peak.x", m * k * 4, STORAGE_RW);
  const y = ctx.createBuffer("peak.y", m * n * 4, STORAGE_RW);
  const arena = new ParamArena(ctx, weight.parts.length);
  try {
    const op = matmul.bind(arena, { x: { buffer: x }, weight, y: { buffer: y } });
    const t = await timeGpu(ctx, (pass) => op.encode(pass, m), { arena, warmup: 1, repeats: 5 });
    return (2 * m * n * k) / (t.medianMs * 1e6);
  } finally {
    weight.destroy();
    x.destroy();
    y.destroy();
    arena.destroy();
  }
}

function shapeOf(runner: ModelRunner, name: string): ModelShape {
  const c = runner.config;
  return {
    name,
    layers: c.numLayers,
    hidden: c.hiddenSize,
    heads: c.numHeads,
    kvHeads: c.numKvHeads,
    headDim: c.headDim,
    intermediate: c.intermediateSize,
    vocab: c.vocabSize,
    gatedMlp: c.arch !== "GPT2LMHeadModel",
    tiedEmbeddings: c.tieWordEmbeddings,
  };
}

/** One batch-size run of section 4. */
interface BatchRow {
  readonly scheduler: "static" | "continuous";
  readonly batchSize: number;
  readonly outputTokensPerS: number;
  readonly meanLatencyMs: number;
  readonly p95LatencyMs: number;
  readonly meanTtftMs: number;
}

async function batchSweep(runner: ModelRunner, o: Options): Promise<BatchRow[]> {
  const maxB = Math.max(...o.batchSizes);
  const bs = runner.options.blockSize;
  const kvTokens = runner.options.numKvBlocks * bs;
  const requests = makeWorkload({
    requests: o.batchRequests,
    seed: 3,
    promptLen: [SWEEP_PROMPT, SWEEP_PROMPT],
    outputLen: sweepOutputLen(o),
    vocabSize: runner.config.vocabSize,
    arrival: { kind: "burst" },
  });
  const once = async (kind: "static" | "continuous", b: number, reqs: typeof requests) => {
    const timeline = new WallTimeline();
    const scheduler = makeScheduler({
      kind,
      kvTokens,
      blockSize: bs,
      maxModelLen: runner.options.maxModelLen,
      maxNumSeqs: b,
      maxNumBatchedTokens: runner.options.maxTokens,
      batchSize: Math.min(b, maxB),
    }, () => timeline.now());
    const executor = new WebGpuExecutor(runner, { numSwapBlocks: 0, seedSource: () => 0 });
    return summarizeRun(
      await runHarness({
        scheduler,
        executor,
        timeline,
        requests: reqs,
        maxInFlight: runner.maxInFlight,
      }),
    );
  };
  // Warm-up (pipeline compilation), not measured.
  await once("continuous", 2, requests.slice(0, 2).map((r) => ({ ...r, outputLen: 2 })));
  const rows: BatchRow[] = [];
  for (const b of o.batchSizes) {
    for (const kind of ["static", "continuous"] as const) {
      const s = await once(kind, b, requests);
      rows.push({
        scheduler: kind,
        batchSize: b,
        outputTokensPerS: s.output_tokens_per_s,
        meanLatencyMs: s.e2e_ms.mean,
        p95LatencyMs: s.e2e_ms.p95,
        meanTtftMs: s.ttft_ms.mean,
      });
    }
  }
  return rows;
}

/** Prompt tokens of every request in the batch sweep. */
const SWEEP_PROMPT = 32;

function sweepOutputLen(o: Options): [number, number] {
  return [Math.max(1, Math.floor(o.batchGen / 4)), 2 * o.batchGen];
}

/** One row of the roofline table. */
interface RooflineRow {
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

/** Runs the benchmark with `argv`; returns the exit status. */
export async function runPrefillDecodeBench(
  argv: string[],
  io: BenchIo = { log: (l) => console.log(l), err: (l) => console.error(l) },
): Promise<number> {
  let o: Options;
  try {
    o = parsePrefillDecodeArgs(argv);
  } catch (error) {
    if (error instanceof UsageError) {
      io.err(error.message.startsWith("usage:") ? error.message : `error: ${error.message}`);
      return 2;
    }
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
      modelDir = o.model;
      modelNote = modelDir;
    }
    const blockSize = 16;
    const maxModelLen = Math.ceil((o.promptLen + o.gen + 1) / blockSize) * blockSize;
    if (!o.json) io.err(`loading ${modelNote} ...`);
    const runner = await loadRunner(modelDir, {
      maxTokens: Math.max(o.promptLen, 64),
      maxSeqs: 16,
      maxModelLen,
      numKvBlocks: maxModelLen / blockSize,
    }, blockSize);
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

/** A runner for the batch sweep: room for 16 sequences of prompt 32 + 2 x batchGen tokens. */
function reloadForSweep(dir: string, o: Options, blockSize: number): Promise<ModelRunner> {
  const maxB = Math.max(...o.batchSizes);
  const perSeq = Math.ceil((SWEEP_PROMPT + 2 * o.batchGen + 1) / blockSize) * blockSize;
  return loadRunner(dir, {
    maxTokens: Math.max(64, SWEEP_PROMPT * maxB),
    maxSeqs: maxB,
    maxModelLen: perSeq,
    numKvBlocks: (maxB * perSeq) / blockSize,
  }, blockSize);
}

function decodeChart(stepMs: readonly number[]): string {
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

function batchCharts(rows: readonly BatchRow[]): { throughput: string; latency: string } {
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
function render(r: PrefillDecodeReport): { markdown: string; text: string } {
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

if (import.meta.main) Deno.exit(await runPrefillDecodeBench(Deno.args));
