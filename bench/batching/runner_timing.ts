/**
 * Step times of the WebGPU {@linkcode ModelRunner}, measured on the host: the runner does not
 * expose GPU timestamps for its steps, so a step's time is the wall time of many identical steps
 * kept `maxInFlight` deep in flight, divided by their number (the ~10 ms readback floor of
 * Deno is paid once per measurement, not per step), or, with depth 1, the wall time of each step
 * submitted and awaited on its own (floor included: what one readback per step costs).
 *
 * Used to calibrate the mock executor's latency model (see calibrate.ts) and
 * by bench/prefill_decode.ts.
 *
 * @module
 */

import type { Quantization } from "../../gpu/quant.ts";
import type { ForwardBatch, SequenceChunk } from "../../engine/forward_batch.ts";
import { GpuContext } from "../../gpu/context.ts";
import type { KernelProfileChoice } from "../../gpu/kernel_profile.ts";
import { openCheckpoint } from "../../engine/model/checkpoint.ts";
import { ModelRunner } from "../../engine/model_runner.ts";

/** The shape of a synthetic step: `seqs` sequences, each computing `queryLen` new tokens. */
export interface StepShape {
  readonly seqs: number;
  readonly queryLen: number;
  /** Tokens in each sequence's KV after the step (>= queryLen). */
  readonly contextLen: number;
}

/** Loads `dir` onto a fresh context with room for the given sizes. */
export async function loadRunner(
  dir: string,
  sizes: { maxTokens: number; maxSeqs: number; maxModelLen: number; numKvBlocks: number },
  blockSize = 16,
  kernelProfile: KernelProfileChoice = "auto",
  quantization: Quantization = "none",
): Promise<ModelRunner> {
  const ctx = await GpuContext.create({ kernelProfile });
  try {
    const ck = await openCheckpoint(dir);
    try {
      return await ModelRunner.fromCheckpoint(ctx, ck, {
        ...sizes,
        blockSize,
        showProgress: false,
        quantization,
      });
    } finally {
      ck.close();
    }
  } catch (error) {
    ctx.destroy();
    throw error;
  }
}

/** Destroys `runner` and the GPU context {@linkcode loadRunner} made for it. */
export function destroyRunner(runner: ModelRunner): void {
  const ctx = runner.ctx;
  runner.destroy();
  ctx.destroy();
}

/**
 * A batch of `shape` (prompt-like token ids 1, 2, ...), sequence i owning the consecutive KV
 * blocks from `i * ceil(contextLen / blockSize)`; greedy sampling of every sequence.
 *
 * @throws {RangeError} when the runner's KV pool is too small for it.
 */
export function syntheticBatch(runner: ModelRunner, shape: StepShape): ForwardBatch {
  const bs = runner.options.blockSize;
  const perSeq = Math.ceil(shape.contextLen / bs);
  if (shape.seqs * perSeq > runner.options.numKvBlocks) {
    throw new RangeError(
      `Cannot build a step of ${shape.seqs} x ${shape.contextLen} tokens: ${runner.options.numKvBlocks} KV blocks of ${bs}`,
    );
  }
  const n = shape.seqs * shape.queryLen;
  const inputIds = new Uint32Array(n);
  const positions = new Uint32Array(n);
  const slotMapping = new Uint32Array(n);
  const seqs: SequenceChunk[] = [];
  const vocab = runner.config.vocabSize;
  for (let s = 0, t = 0; s < shape.seqs; s++) {
    const blockTable = Array.from({ length: perSeq }, (_, j) => s * perSeq + j);
    for (let i = 0; i < shape.queryLen; i++, t++) {
      const p = shape.contextLen - shape.queryLen + i;
      inputIds[t] = (1 + s * 7 + p) % vocab;
      positions[t] = p;
      slotMapping[t] = blockTable[Math.floor(p / bs)]! * bs + (p % bs);
    }
    seqs.push({
      queryLen: shape.queryLen,
      contextLen: shape.contextLen,
      blockTable,
      sample: { temperature: 0, seed: s, counter: shape.contextLen },
    });
  }
  return { inputIds, positions, slotMapping, seqs };
}

/** Executes `batch` `count` times, at most `depth` in flight; returns the total wall ms. */
export async function runRepeated(
  runner: ModelRunner,
  batch: ForwardBatch,
  count: number,
  depth: number,
): Promise<number> {
  const d = Math.max(1, Math.min(depth, runner.maxInFlight));
  const queue: Promise<unknown>[] = [];
  const t0 = performance.now();
  for (let i = 0; i < count; i++) {
    if (queue.length >= d) await queue.shift();
    queue.push(runner.execute(batch).result);
  }
  await Promise.all(queue);
  return performance.now() - t0;
}

/**
 * Steady-state ms per step of `batch` with steps pipelined: the best of `trials` runs of
 * `count` repeats each (count: enough for ~`targetMs` of work per trial, at least 8), after two
 * warm-up steps. The best, not the median: other processes sharing the CPU only ever add time.
 */
export async function pipelinedStepMs(
  runner: ModelRunner,
  batch: ForwardBatch,
  targetMs = 150,
  trials = 3,
): Promise<number> {
  await runRepeated(runner, batch, 2, runner.maxInFlight);
  const probe = await runRepeated(runner, batch, 8, runner.maxInFlight) / 8;
  const count = Math.max(8, Math.min(400, Math.ceil(targetMs / Math.max(probe, 0.01))));
  let best = Infinity;
  for (let i = 0; i < trials; i++) {
    best = Math.min(best, await runRepeated(runner, batch, count, runner.maxInFlight) / count);
  }
  return best;
}

/** Decode-rate comparison: one readback per step against pipelined steps. */
export interface DecodeRate {
  /** Sequences in the decode batch. */
  readonly seqs: number;
  readonly steps: number;
  /** Steps per second, each step submitted and awaited (maxInFlight 1). */
  readonly syncStepsPerS: number;
  /** Steps per second, `maxInFlight` steps in flight. */
  readonly pipelinedStepsPerS: number;
  readonly maxInFlight: number;
}

/**
 * Decode steps per second of a `seqs`-sequence decode step at context `contextLen`, with one
 * readback per step (depth 1) and pipelined (the runner's maxInFlight).
 */
export async function measureDecodeRate(
  runner: ModelRunner,
  seqs = 1,
  contextLen = 128,
  steps = 64,
): Promise<DecodeRate> {
  const batch = syntheticBatch(runner, { seqs, queryLen: 1, contextLen });
  await runRepeated(runner, batch, 4, runner.maxInFlight);
  const sync = await runRepeated(runner, batch, steps, 1);
  const piped = await runRepeated(runner, batch, steps, runner.maxInFlight);
  return {
    seqs,
    steps,
    syncStepsPerS: (steps * 1000) / sync,
    pipelinedStepsPerS: (steps * 1000) / piped,
    maxInFlight: runner.maxInFlight,
  };
}
