/**
 * Whole-model throughput of the real {@linkcode ModelRunner} on the Qwen3-0.6B shapes
 * (28 layers, hidden 1024, 16 q / 8 kv heads of 128, intermediate 3072, vocab 151936, tied
 * embeddings), with the weights in the context's dtype (f16 where `shader-f16` exists):
 *
 * - prefill tokens/s of one 128-token and one 512-token prompt (wall time from the submit to
 *   the readback of the sampled token);
 * - decode tokens/s at batch 1, 8 and 32: every sequence holds a 128-token prompt in the KV
 *   cache, then `--steps` decode steps are submitted back to back, each fed from the previous
 *   step's samples on the GPU (`runner.sampledRef`), never waiting per step (at most
 *   `runner.maxInFlight` in flight). tokens/s = batch * steps / (first decode submit -> last
 *   readback). The prompt is prefilled once and its KV blocks are shared by every sequence
 *   (prefix caching), so a batch of 32 does not spend minutes in prefill; each sequence writes
 *   its own blocks from position 128 on. Process CPU time (lavapipe runs its threads inside this
 *   process) is printed next to the wall time, as the machine is shared and noisy;
 * - a per-kernel breakdown of one decode step at batch 1 and 8 (`--breakdown-batches`): the
 *   runner runs one decode step with its dispatches recorded by kernel group (all 28 layers'
 *   dispatches of one kind: qkv matmuls, RoPE, attention, ...), then each group is replayed as
 *   one compute pass timed with GPU timestamps (bench/support.ts `timeGpu`): the engine's own
 *   call sites, weights and buffers (bench/model_bench/breakdown.ts); and the same for the
 *   prefill of the longest `--prefill` length (`--breakdown-prefill`).
 *
 * Run: `deno bench -A bench/model_bench.ts` (figures printed when the file loads; the
 * `Deno.bench` entries time one decode step on the host, ~10 ms wait included), or
 * `deno run -A bench/model_bench.ts [--model DIR] [--steps N] [--batches 1,8,32]
 * [--no-breakdown] [--json]`. Without `--model` the qwen3-0.6b preset is generated (random
 * bf16 weights, 1.2 GB) into a temporary directory, deleted at exit. The parts live in
 * bench/model_bench/ (options, setup, workload, measure, breakdown, report).
 *
 * @module
 */

import { parseKernelProfileChoice } from "../gpu/kernel_profile.ts";
import { kvDtypeOf } from "../gpu/dtype.ts";
import type { ModelRunner } from "../engine/model_runner.ts";
import { benchContext, describeMachine } from "./support.ts";
import { READBACK_BATCH } from "../engine/step_pipeline.ts";
import { DEFAULT_RING_SLOTS } from "../engine/step_buffers.ts";
import { parseModelBenchArgs } from "./model_bench/options.ts";
import { forceMatmulVariant, modelDirectory } from "./model_bench/setup.ts";
import { type BenchEnv, loadWorkload, measure } from "./model_bench/measure.ts";
import { breakdown, type Group, prefillBreakdown } from "./model_bench/breakdown.ts";
import {
  breakdownLines,
  headerLines,
  medianRatioLines,
  type ModelBenchReport,
  ratioLines,
  type RunResult,
} from "./model_bench/report.ts";
import type { BenchWorkload } from "./model_bench/workload.ts";

const options = parseModelBenchArgs(Deno.args);
const log = options.json ? (_: string) => {} : (line: string) => console.log(line);
const forced = forceMatmulVariant(options.matmulVariant);
const ctx = await benchContext({
  forceF32: options.forceF32,
  kernelProfile: parseKernelProfileChoice(options.kernelProfile),
});
const model = await modelDirectory(options.model);
const command = Deno.args.length > 0 || !import.meta.main
  ? `deno ${import.meta.main ? "run" : "bench"} -A bench/model_bench.ts ${Deno.args.join(" ")}`
  : "deno run -A bench/model_bench.ts";
const report: ModelBenchReport = {
  machine: describeMachine(ctx),
  date: new Date().toISOString(),
  command: command.trim(),
  model: model.generated ? `qwen3-0.6b preset generated into ${model.dir}` : model.dir,
  weightDtype: ctx.weightDtype,
  kvCacheDtype: kvDtypeOf(options.kvCacheDtype, ctx.weightDtype),
  lpNumThreads: Deno.env.get("LP_NUM_THREADS") ?? "(default)",
  matmulVariant: forced ?? "(policy)",
  kernelProfile: `${ctx.profile} (${ctx.profileReason})`,
  overlap: options.overlap ?? !ctx.isCpuProfile,
  readbackBatch: options.readbackBatch ?? READBACK_BATCH,
  maxInFlight: options.maxInFlight ?? DEFAULT_RING_SLOTS - 1,
};
for (const line of headerLines(report)) log(line);
const env: BenchEnv = { ctx, options, modelDir: model.dir, report, log };

// One runner per weight format, measured in turn; the last one stays for the breakdown. With
// --rounds N > 1 every runner stays loaded and the formats are measured N times in turn.
let work: BenchWorkload | undefined;
const rounds: RunResult[][] = [];
if (options.rounds === 1) {
  const runs: RunResult[] = [];
  for (const quantization of options.quantizations) {
    work?.runner.destroy();
    work = await loadWorkload(env, quantization);
    runs.push(await measure(env, work, work.runner.weights.quantization));
  }
  rounds.push(runs);
} else {
  const works: BenchWorkload[] = [];
  for (const quantization of options.quantizations) {
    works.push(await loadWorkload(env, quantization));
  }
  for (let r = 1; r <= options.rounds; r++) {
    const runs: RunResult[] = [];
    for (const w of works) {
      const quantization = w.runner.weights.quantization;
      log(`round ${r} of ${options.rounds}, weights ${quantization}:`);
      runs.push(await measure(env, w, quantization));
    }
    rounds.push(runs);
    for (const line of ratioLines(runs)) log(line);
  }
  for (const w of works.slice(0, -1)) w.runner.destroy();
  work = works.at(-1);
}
report.runs = rounds.flat();
for (const line of rounds.length === 1 ? ratioLines(rounds[0]!) : medianRatioLines(rounds)) {
  log(line);
}

const breakdownSteps = [
  ...options.breakdownBatches.map((n) => ({ kind: "decode" as const, n })),
  ...options.breakdownPrefills.map((n) => ({ kind: "prefill" as const, n })),
];
if (breakdownSteps.length > 0 && work !== undefined) {
  const method = ctx.hasTimestamps ? "GPU timestamps" : "host clock / 3 passes";
  const breakdowns: Record<string, Group[]> = {};
  for (const { kind, n } of breakdownSteps) {
    const groups = kind === "decode"
      ? await breakdown(ctx, work, n)
      : await prefillBreakdown(ctx, work, n);
    breakdowns[kind === "decode" ? `batch${n}` : `prefill${n}`] = groups;
    for (
      const line of breakdownLines(n, groups, method, rounds.at(-1)!.at(-1)!.quantization, kind)
    ) {
      log(line);
    }
  }
  report.breakdown = breakdowns;
}

if (options.json) console.log(JSON.stringify(report, null, 2));

const runner: ModelRunner | undefined = work?.runner;
Deno.bench({
  name: "model decode step, batch 1 (host time incl. ~10 ms wait)",
  group: "model",
  async fn() {
    await work!.decode(1, 1);
  },
});

globalThis.addEventListener("unload", () => {
  runner?.destroy();
  if (model.generated) Deno.removeSync(model.dir, { recursive: true });
});
