/**
 * One runner's measurements in the model bench: load it with a weight format, measure the copy
 * bandwidth ceiling, warm up, then prefill tokens/s at each `--prefill` length and decode
 * tokens/s at each `--batches` size (bench/model_bench/workload.ts), printing each figure.
 *
 * @module
 */

import type { GpuContext } from "../../gpu/context.ts";
import type { Quantization, QuantizationChoice } from "../../gpu/quant.ts";
import { ModelRunner } from "../../engine/model_runner.ts";
import { tuneRunner } from "../../engine/kernel_tuning.ts";
import { READBACK_BATCH } from "../../engine/step_pipeline.ts";
import { measureCopyBandwidth } from "../support.ts";
import { median } from "../lib/step_cost.ts";
import { type ModelBenchOptions, PROMPT, runnerSizes } from "./options.ts";
import {
  decodeLines,
  loadLine,
  type ModelBenchReport,
  prefillLine,
  type PrefillResult,
  type RunResult,
} from "./report.ts";
import { BenchWorkload, cpuSeconds, type DecodeResult } from "./workload.ts";

/** What the measurements need from the entry point. */
export interface BenchEnv {
  readonly ctx: GpuContext;
  readonly options: ModelBenchOptions;
  readonly modelDir: string;
  readonly report: ModelBenchReport;
  /** Prints a line (nothing with `--json`). */
  readonly log: (line: string) => void;
}

/** Loads a runner with `choice` weights (auto: as serve would), sized for every measurement. */
export async function loadWorkload(env: BenchEnv, choice: QuantizationChoice) {
  const t0 = performance.now();
  const { blocksPerSeq, ...sizes } = runnerSizes(env.options);
  const runner = await ModelRunner.load(env.ctx, env.modelDir, {
    ...sizes,
    showProgress: false,
    quantization: choice,
    fusedDecode: env.options.fusedDecode,
    kvCacheDtype: env.options.kvCacheDtype,
    ...(env.options.maxInFlight === undefined ? {} : { maxInFlight: env.options.maxInFlight }),
  });
  const seconds = (performance.now() - t0) / 1000;
  env.log(loadLine(seconds, runner.weights.quantization, runner.weights, env.ctx.weightDtype));
  // The engine's kernel tuning (engine/engine_setup.ts), at the sizes this bench runs.
  await tuneRunner(runner, env.options.kernelTuning, (line) => {
    env.log(line);
    env.report.kernelTuning = line;
  });
  const work = new BenchWorkload(runner, blocksPerSeq);
  // As the engine runs them (engine/engine_setup.ts), unless --overlap / --readback-batch say
  // otherwise.
  const overlap = env.options.overlap;
  work.overlap = overlap === "serial" ? false : overlap ?? !env.ctx.isCpuProfile;
  work.serial = overlap === "serial";
  const batch = env.options.readbackBatch ?? READBACK_BATCH;
  work.readbackBatch = Math.min(batch, runner.maxInFlight);
  if (work.readbackBatch < batch) {
    env.log(
      `readback batch ${batch} cut to ${work.readbackBatch}: the runner keeps no more steps in flight`,
    );
  }
  return work;
}

/**
 * Each `--prefill` length timed `--prefill-repeats` times (after an untimed one when more than
 * once: whatever that length does the first time, such as first use of its buffers' ranges, is
 * then not timed), the medians reported.
 */
async function measurePrefills(env: BenchEnv, work: BenchWorkload): Promise<PrefillResult[]> {
  const out: PrefillResult[] = [];
  const repeats = env.options.prefillRepeats;
  for (const n of env.options.prefills) {
    if (repeats > 1) await work.prefillTimed(n, 0);
    const runs: { ms: number; gpuMs: number | null; cpuS: number }[] = [];
    for (let i = 0; i < repeats; i++) {
      const c0 = cpuSeconds();
      const t = await work.prefillTimed(n, 0);
      runs.push({ ...t, cpuS: cpuSeconds() - c0 });
    }
    const ms = median(runs.map((t) => t.ms));
    const gpu = runs.flatMap((t) => t.gpuMs === null ? [] : [t.gpuMs]);
    const r: PrefillResult = {
      tokens: n,
      ms,
      tokensPerS: n / (ms / 1000),
      cpuS: median(runs.map((t) => t.cpuS)),
      gpuMs: gpu.length === runs.length ? median(gpu) : null,
      ...(repeats > 1
        ? {
          repeats: {
            n: repeats,
            minMs: Math.min(...runs.map((t) => t.ms)),
            maxMs: Math.max(...runs.map((t) => t.ms)),
          },
        }
        : {}),
    };
    out.push(r);
    env.log(prefillLine(r));
  }
  return out;
}

async function measureDecodes(e: BenchEnv, work: BenchWorkload): Promise<DecodeResult[]> {
  const c = work.runner.config;
  // The projections and LM head one decode step reads, at the bytes they have on the device.
  const untiedEmbed = c.tieWordEmbeddings ? 0 : (e.ctx.weightDtype === "f16" ? 2 : 4);
  const stepWeightBytes = work.runner.weights.device - c.vocabSize * c.hiddenSize * untiedEmbed;
  const out: DecodeResult[] = [];
  for (const batch of e.options.batches) {
    const r = await work.decode(batch, e.options.steps);
    out.push(r);
    for (const line of decodeLines(r, stepWeightBytes, c.numLayers)) e.log(line);
  }
  return out;
}

/** Measures prefill and decode with the runner of `work` (weights `quantization`). */
export async function measure(
  env: BenchEnv,
  work: BenchWorkload,
  quantization: Quantization,
): Promise<RunResult> {
  const copyBandwidth = await measureCopyBandwidth(env.ctx);
  env.report.copyBandwidthGBs = copyBandwidth;
  env.log(`copy bandwidth ceiling (same run): ${copyBandwidth.toFixed(1)} GB/s`);

  // Warm-up: pipelines are compiled lazily by the driver on first use.
  await work.prefill(16, work.blocksPerSeq * work.runner.options.maxSeqs);
  await work.decode(1, 2);

  const prefill = await measurePrefills(env, work);
  // The decode prompt: PROMPT tokens in blocks [0, PROMPT / BLOCK), unless prefilled last.
  const prefills = env.options.prefills;
  if (!prefills.includes(PROMPT) || prefills.indexOf(PROMPT) !== prefills.length - 1) {
    await work.prefill(PROMPT, 0);
  }
  const decode = await measureDecodes(env, work);
  return {
    quantization,
    weightBytes: work.runner.weights.device,
    unquantizedWeightBytes: work.runner.weights.unquantized,
    prefill,
    decode,
  };
}
