/**
 * The batching benchmark's main comparison: one workload through the static, dynamic and
 * continuous schedulers on the mock or WebGPU executor. One scheduler run, the backends and the
 * workload are in bench/batching/scheduler_run.ts; the files and lines written, in
 * bench/batching/compare_report.ts.
 *
 * @module
 */

import { resolveModelDir } from "../../cli/engine_flags.ts";
import { describeMachine } from "../support.ts";
import { baselineBatchSize, type SchedulerChoice } from "./scheduler_choice.ts";
import type { BenchIo } from "../bench_io.ts";
import { DEFAULT_MOCK_LATENCY, type Options } from "./options.ts";
import { destroyRunner, loadRunner, measureDecodeRate } from "./runner_timing.ts";
import {
  mockBackend,
  runOne,
  schedulerLimits,
  type SchedulerResult,
  swapBlocks,
  webgpuBackend,
  workloadOf,
} from "./scheduler_run.ts";
import { type ComparisonMeta, goals, printComparison, writeComparison } from "./compare_report.ts";

/** The three schedulers compared, on the same KV budget and limits. */
function choices(o: Options): SchedulerChoice[] {
  const common = {
    ...schedulerLimits(o),
    preemptionMode: o.preemptionMode,
    swapBlocks: swapBlocks(o),
  };
  return [
    { kind: "static", ...common },
    { kind: "dynamic", ...common, batchWaitMs: o.batchWaitMs },
    { kind: "continuous", ...common },
  ];
}

/** The run's settings as recorded in the JSON (the executor-specific fields come later). */
function comparisonMeta(o: Options): ComparisonMeta {
  return {
    bench: "batching",
    executor: o.executor,
    kv_slots: o.kvSlots,
    max_model_len: o.maxModelLen,
    block_size: o.blockSize,
    max_num_seqs: o.maxNumSeqs,
    max_num_batched_tokens: o.maxNumBatchedTokens,
    baseline_batch_size: baselineBatchSize(o.kvSlots, o.maxModelLen, o.blockSize),
    workload: {
      requests: o.requests,
      seed: o.seed,
      prompt_len: o.promptLen,
      output_len: o.outputLen,
      arrival: "all at t = 0",
    },
  };
}

/** Every scheduler on the mock executor; records its latency model in `meta`. */
async function compareOnMock(o: Options, meta: ComparisonMeta): Promise<SchedulerResult[]> {
  const calibrated = o.baseMs === DEFAULT_MOCK_LATENCY.baseMs &&
    o.perTokenMs === DEFAULT_MOCK_LATENCY.perTokenMs &&
    o.perSeqMs === DEFAULT_MOCK_LATENCY.perSeqMs &&
    o.perKiloPairMs === DEFAULT_MOCK_LATENCY.perKiloPairMs &&
    o.swapOutMs === DEFAULT_MOCK_LATENCY.swapOutMs;
  meta.latency_model = {
    base_ms: o.baseMs,
    per_token_ms: o.perTokenMs,
    per_seq_ms: o.perSeqMs,
    per_kpair_ms: o.perKiloPairMs,
    swap_out_ms: o.swapOutMs,
    source: calibrated ? DEFAULT_MOCK_LATENCY.source : "command line",
    clock: o.clock === "virtual" ? "simulated (virtual time)" : "wall clock (MockExecutor)",
  };
  meta.machine = null;
  const requests = workloadOf(o, 50_000, { kind: "burst" });
  const results: SchedulerResult[] = [];
  for (const c of choices(o)) {
    results.push(await runOne(c, requests, mockBackend(o), o.maxInFlight));
  }
  return results;
}

/**
 * Every scheduler on the WebGPU executor, after a warm-up; records the machine, the model and
 * the decode rates (one readback per step vs pipelined) in `meta`.
 */
async function compareOnWebGpu(
  o: Options,
  meta: ComparisonMeta,
  io: BenchIo,
): Promise<SchedulerResult[]> {
  const dir = await resolveModelDir(o.model);
  const runner = await loadRunner(
    dir,
    {
      maxTokens: o.maxNumBatchedTokens,
      maxSeqs: o.maxNumSeqs,
      maxModelLen: o.maxModelLen,
      numKvBlocks: Math.floor(o.kvSlots / o.blockSize),
    },
    o.blockSize,
    o.kernelProfile,
    o.quantization,
  );
  try {
    meta.machine = describeMachine(runner.ctx);
    meta.model = dir;
    meta.weight_dtype = runner.ctx.weightDtype;
    meta.quantization = o.quantization;
    meta.weight_device_bytes = runner.weights.device;
    meta.weight_unquantized_bytes = runner.weights.unquantized;
    meta.latency_model = null;
    const rate = await measureDecodeRate(runner, 1, Math.min(128, o.maxModelLen), 64);
    meta.decode_rate = {
      seqs: rate.seqs,
      steps: rate.steps,
      one_readback_per_step_steps_per_s: rate.syncStepsPerS,
      pipelined_steps_per_s: rate.pipelinedStepsPerS,
      ratio: rate.pipelinedStepsPerS / rate.syncStepsPerS,
      goal_ratio: 3,
      max_in_flight: rate.maxInFlight,
    };
    const requests = workloadOf(o, runner.config.vocabSize, { kind: "burst" });
    // Warm-up (shader compilation on first use): a few short requests, not measured.
    const warm = requests.slice(0, 4).map((r) => ({ ...r, outputLen: Math.min(r.outputLen, 4) }));
    await runOne(choices(o)[2]!, warm, webgpuBackend(runner, o), o.maxInFlight);
    await runOne(choices(o)[0]!, warm, webgpuBackend(runner, o), o.maxInFlight);
    const results: SchedulerResult[] = [];
    for (const c of choices(o)) {
      if (!o.json) io.err(`running ${c.kind} on the WebGPU executor ...`);
      results.push(await runOne(c, requests, webgpuBackend(runner, o), o.maxInFlight));
    }
    return results;
  } finally {
    destroyRunner(runner);
  }
}

/** The main comparison (mock or webgpu). */
export async function runCompare(o: Options, io: BenchIo): Promise<number> {
  const meta = comparisonMeta(o);
  const results = o.executor === "mock"
    ? await compareOnMock(o, meta)
    : await compareOnWebGpu(o, meta, io);
  const g = goals(results);
  const outDir = await writeComparison(o, meta, results, g);
  if (o.json) {
    io.log(JSON.stringify({ ...meta, results, goals: g }));
    return 0;
  }
  printComparison(o, meta, results, g, outDir, io);
  return 0;
}
