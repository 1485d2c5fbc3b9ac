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
import { destroyRunner, loadRunner } from "./batching/runner_timing.ts";
import {
  type BatchRow,
  batchSweep,
  measureMatmulGflops,
  measurePhases,
  reloadForSweep,
  shapeOf,
} from "./prefill_decode/measure.ts";
import { type BenchIo, reportUsage, resultsDir, runMain, UsageError } from "./bench_io.ts";
import { type Options, parsePrefillDecodeArgs } from "./prefill_decode/options.ts";
import {
  buildReport,
  type Measurements,
  type PrefillDecodeReport,
} from "./prefill_decode/report.ts";
import { render } from "./prefill_decode/report_render.ts";
import { batchCharts, decodeChart } from "./prefill_decode/report_svg.ts";

/** KV block size of every runner this benchmark loads. */
const BLOCK_SIZE = 16;

/** The model measured: its directory, its name in the report, and a folder to delete after. */
interface MainModel {
  readonly dir: string;
  readonly note: string;
  /** The generated model's temporary folder (`qwen3-0.6b`), else null. */
  readonly tempDir: string | null;
}

/** Resolves `--model`, generating the `qwen3-0.6b` preset into a temporary folder. */
async function prepareModel(model: string): Promise<MainModel> {
  if (model === "tiny") {
    return {
      dir: await resolveModelDir(undefined),
      note: "tiny-qwen3 (random weights)",
      tempDir: null,
    };
  }
  if (model !== "qwen3-0.6b") {
    const dir = await resolveModelDir(model);
    return { dir, note: dir, tempDir: null };
  }
  const tempDir = await Deno.makeTempDir({ prefix: "prefill-decode-qwen3-" });
  try {
    await makeModel({ out: tempDir, preset: "qwen3-0.6b", dtype: "f16", seed: 0 });
  } catch (error) {
    await Deno.remove(tempDir, { recursive: true });
    throw error;
  }
  return {
    dir: tempDir,
    note: `qwen3-0.6b preset (Qwen3-0.6B shapes, random f16 weights generated into a temp dir)`,
    tempDir,
  };
}

/** Sections 1-3 on the main model: step times, bandwidth, matmul peak and the model's shape. */
async function measureMain(
  model: MainModel,
  o: Options,
  io: BenchIo,
): Promise<Omit<Measurements, "batchRows">> {
  const maxModelLen = Math.ceil((o.promptLen + o.gen + 1) / BLOCK_SIZE) * BLOCK_SIZE;
  if (!o.json) io.err(`loading ${model.note} ...`);
  const runner = await loadRunner(
    model.dir,
    {
      maxTokens: Math.max(o.promptLen, 64),
      maxSeqs: 16,
      maxModelLen,
      numKvBlocks: maxModelLen / BLOCK_SIZE,
    },
    BLOCK_SIZE,
    o.kernelProfile,
    o.quantization,
  );
  const ctx = runner.ctx;
  try {
    const machine = describeMachine(ctx);
    if (!o.json) io.err("measuring prefill and decode ...");
    const phases = await measurePhases(runner, o);
    if (!o.json) io.err("measuring bandwidth and matmul peak ...");
    const bandwidthGBs = await measureCopyBandwidth(ctx);
    const matmulGflops = await measureMatmulGflops(runner);
    const shape = shapeOf(runner, model.note);
    return {
      machine,
      model: model.note,
      weightDtype: ctx.weightDtype,
      hasTimestamps: ctx.hasTimestamps,
      phases,
      bandwidthGBs,
      matmulGflops,
      shape,
    };
  } finally {
    destroyRunner(runner);
  }
}

/** Section 4 on the tiny model (or the main one with `--batch-model main`); null when skipped. */
async function measureBatchSizes(
  model: MainModel,
  o: Options,
  io: BenchIo,
): Promise<BatchRow[] | null> {
  if (!o.batchSweep) return null;
  if (!o.json) io.err("batch-size sweep ...");
  const dir = o.batchModel === "main" ? model.dir : await resolveModelDir(undefined);
  const runner = await reloadForSweep(dir, o, BLOCK_SIZE);
  try {
    return await batchSweep(runner, o);
  } finally {
    destroyRunner(runner);
  }
}

/** Writes report.md, report.json and the three charts to the report's folder. */
async function writeReport(report: PrefillDecodeReport, markdown: string): Promise<void> {
  const outDir = report.out_dir;
  await Deno.mkdir(outDir, { recursive: true });
  await Deno.writeTextFile(`${outDir}/report.md`, markdown);
  await Deno.writeTextFile(`${outDir}/report.json`, JSON.stringify(report, null, 2));
  await Deno.writeTextFile(`${outDir}/decode_steps.svg`, decodeChart(report.decode_step_ms));
  const charts = batchCharts(report.batch_sweep?.rows ?? []);
  await Deno.writeTextFile(`${outDir}/batch_throughput.svg`, charts.throughput);
  await Deno.writeTextFile(`${outDir}/batch_latency.svg`, charts.latency);
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
    if (error instanceof UsageError) return reportUsage(error, io, "bench:prefill-decode");
    throw error;
  }
  const model = await prepareModel(o.model);
  try {
    const measured = await measureMain(model, o, io);
    const batchRows = await measureBatchSizes(model, o, io);
    const report = buildReport(
      o,
      { ...measured, batchRows },
      o.outDir ?? resultsDir("prefill-decode"),
    );
    const rendered = render(report);
    await writeReport(report, rendered.markdown);
    if (o.json) {
      io.log(JSON.stringify(report));
    } else {
      io.log(rendered.text);
      io.log(`wrote ${report.out_dir}/report.md, report.json, decode_steps.svg, batch_*.svg`);
    }
    return 0;
  } finally {
    if (model.tempDir !== null) await Deno.remove(model.tempDir, { recursive: true });
  }
}

if (import.meta.main) Deno.exit(await runMain(() => runPrefillDecodeBench(Deno.args)));
