/**
 * The measurements of the prefill / decode benchmark: per-step prefill and decode timing
 * (awaited and pipelined), the engine's matmul GFLOP/s, the model's shape for the roofline, and
 * the batch-size sweep (naive static vs continuous batching) with the runner it uses.
 *
 * @module
 */

import { STORAGE_RW } from "../../gpu/context.ts";
import { ParamArena } from "../../gpu/params.ts";
import { GpuMatrix } from "../../gpu/tensor.ts";
import type { ForwardBatch } from "../../engine/forward_batch.ts";
import { WebGpuExecutor } from "../../engine/executors/webgpu_executor.ts";
import { GpuTimer } from "../../gpu/timer.ts";
import type { ModelRunner } from "../../engine/model_runner.ts";
import { Matmul } from "../../kernels/matmul.ts";
import { timeGpu } from "../support.ts";
import { runHarness, WallTimeline } from "../batching/harness.ts";
import { summarizeRun } from "../batching/run_summary.ts";
import { makeScheduler } from "../batching/scheduler_choice.ts";
import { loadRunner, syntheticBatch } from "../batching/runner_timing.ts";
import { makeWorkload } from "../batching/workload.ts";
import type { ModelShape } from "../lib/roofline.ts";
import type { Options } from "./options.ts";

/** Section 1's measurements. */
export interface PhaseTiming {
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

/** Section 1: warm-up, then the prompt's prefill (best of three when short) and decode steps. */
export async function measurePhases(runner: ModelRunner, o: Options): Promise<PhaseTiming> {
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
export async function measureMatmulGflops(runner: ModelRunner): Promise<number> {
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

/** The runner's model as a roofline {@linkcode ModelShape} named `name`. */
export function shapeOf(runner: ModelRunner, name: string): ModelShape {
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
export interface BatchRow {
  readonly scheduler: "static" | "continuous";
  readonly batchSize: number;
  readonly outputTokensPerS: number;
  readonly meanLatencyMs: number;
  readonly p95LatencyMs: number;
  readonly meanTtftMs: number;
}

/** Section 4: each batch size under naive static and continuous batching, after a warm-up. */
export async function batchSweep(runner: ModelRunner, o: Options): Promise<BatchRow[]> {
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
export const SWEEP_PROMPT = 32;

/** Output-length range of the batch sweep's requests: batchGen / 4 .. 2 x batchGen. */
export function sweepOutputLen(o: Options): [number, number] {
  return [Math.max(1, Math.floor(o.batchGen / 4)), 2 * o.batchGen];
}

/** A runner for the batch sweep: room for 16 sequences of prompt 32 + 2 x batchGen tokens. */
export function reloadForSweep(dir: string, o: Options, blockSize: number): Promise<ModelRunner> {
  const maxB = Math.max(...o.batchSizes);
  const perSeq = Math.ceil((SWEEP_PROMPT + 2 * o.batchGen + 1) / blockSize) * blockSize;
  return loadRunner(
    dir,
    {
      maxTokens: Math.max(64, SWEEP_PROMPT * maxB),
      maxSeqs: maxB,
      maxModelLen: perSeq,
      numKvBlocks: (maxB * perSeq) / blockSize,
    },
    blockSize,
    o.kernelProfile,
    o.quantization,
  );
}
