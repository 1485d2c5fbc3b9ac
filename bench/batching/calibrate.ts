/**
 * Calibration of the mock executor's latency model from the WebGPU runner: step times
 * measured at decode steps of 1 to 64 sequences and prefill chunks over contexts of 32 to 960
 * tokens, fitted by least squares to `ms = a + b * batchedTokens + s * sequences +
 * c * attendedPairs / 1000`
 * (engine/executors/mock_executor.ts mockStepMs); and the time of a swap-out (preemption by
 * swap) through the WebGPU executor.
 *
 * @module
 */

import type { ModelRunner } from "../../engine/model_runner.ts";
import { WebGpuExecutor } from "../../engine/executors/webgpu_executor.ts";
import { chunkPairs } from "../../engine/executors/mock_executor.ts";
import type { SchedulerOutput } from "../../scheduler/scheduler_output.ts";
import { fitLinear } from "./fit.ts";
import { pipelinedStepMs, type StepShape, syntheticBatch } from "./runner_timing.ts";

/**
 * The step shapes measured by default: decodes and prefills at the contexts of the batching
 * workload (prompts 16..256, outputs 16..512), varied independently of the token counts so
 * that the per-token and per-pair costs can be told apart.
 */
export const CALIBRATION_SHAPES: readonly StepShape[] = [
  { seqs: 1, queryLen: 1, contextLen: 32 },
  { seqs: 1, queryLen: 1, contextLen: 256 },
  { seqs: 1, queryLen: 1, contextLen: 512 },
  { seqs: 16, queryLen: 1, contextLen: 32 },
  { seqs: 16, queryLen: 1, contextLen: 256 },
  { seqs: 16, queryLen: 1, contextLen: 512 },
  { seqs: 64, queryLen: 1, contextLen: 32 },
  { seqs: 64, queryLen: 1, contextLen: 256 },
  { seqs: 32, queryLen: 1, contextLen: 512 },
  { seqs: 1, queryLen: 64, contextLen: 64 },
  { seqs: 1, queryLen: 256, contextLen: 256 },
  { seqs: 4, queryLen: 128, contextLen: 128 },
  { seqs: 1, queryLen: 128, contextLen: 640 },
  { seqs: 1, queryLen: 64, contextLen: 960 },
];

/** (query, key) pairs a step of `shape` attends (see mockStepMs). */
export function shapePairs(shape: StepShape): number {
  return shape.seqs * chunkPairs(shape.contextLen - shape.queryLen, shape.queryLen);
}

/** One measured step shape. */
export interface CalibrationPoint {
  readonly shape: StepShape;
  /** Batched tokens (seqs x queryLen). */
  readonly tokens: number;
  /** Attended (query, key) pairs. */
  readonly pairs: number;
  /** Measured ms per step (pipelined). */
  readonly ms: number;
  /** The fit's prediction, ms. */
  readonly fittedMs: number;
}

/**
 * The fitted model `ms = baseMs + perTokenMs * tokens + perSeqMs * seqs + perKiloPairMs *
 * pairs / 1000`.
 */
export interface LatencyFit {
  readonly baseMs: number;
  readonly perTokenMs: number;
  readonly perSeqMs: number;
  readonly perKiloPairMs: number;
  /** Coefficient of determination over the points. */
  readonly r2: number;
}

/** Measured points and the fitted model. */
export interface Calibration {
  readonly points: readonly CalibrationPoint[];
  readonly fit: LatencyFit;
}

/** Fits the latency model to measured (shape, ms) points. */
export function fitLatency(
  measured: readonly { readonly shape: StepShape; readonly ms: number }[],
): Calibration {
  const rows = measured.map((p) => ({
    ...p,
    tokens: p.shape.seqs * p.shape.queryLen,
    pairs: shapePairs(p.shape),
  }));
  const { coef, r2 } = fitLinear(
    rows.map((p) => [1, p.tokens, p.shape.seqs, p.pairs / 1000]),
    rows.map((p) => p.ms),
  );
  const [baseMs, perTokenMs, perSeqMs, perKiloPairMs] = coef as [number, number, number, number];
  return {
    points: rows.map((p) => ({
      ...p,
      fittedMs: baseMs + perTokenMs * p.tokens + perSeqMs * p.shape.seqs +
        (perKiloPairMs * p.pairs) / 1000,
    })),
    fit: { baseMs, perTokenMs, perSeqMs, perKiloPairMs, r2 },
  };
}

/** Measures every shape (skipping those the runner cannot hold) and fits the model. */
export async function calibrate(
  runner: ModelRunner,
  shapes: readonly StepShape[] = CALIBRATION_SHAPES,
  onPoint: (shape: StepShape, ms: number) => void = () => {},
): Promise<Calibration> {
  const measured: { shape: StepShape; ms: number }[] = [];
  const o = runner.options;
  const bs = o.blockSize;
  for (const shape of shapes) {
    const tokens = shape.seqs * shape.queryLen;
    if (
      tokens > o.maxTokens || shape.seqs > o.maxSeqs || shape.contextLen > o.maxModelLen ||
      shape.seqs * Math.ceil(shape.contextLen / bs) > o.numKvBlocks
    ) {
      continue;
    }
    const ms = await pipelinedStepMs(runner, syntheticBatch(runner, shape));
    onPoint(shape, ms);
    measured.push({ shape, ms });
  }
  try {
    return fitLatency(measured);
  } catch (error) {
    throw new RangeError(
      `Cannot calibrate from the ${measured.length} step shapes that fit the runner (max ` +
        `${o.maxSeqs} sequences, ${o.maxTokens} tokens, context ${o.maxModelLen}): they do not ` +
        `vary tokens, sequences and context independently`,
      { cause: error },
    );
  }
}

/**
 * Wall ms one swap-out of `blocks` KV blocks costs through the {@linkcode WebGpuExecutor}: the
 * copy of every layer's K and V blocks into a staging buffer and, in the background, its
 * readback into the host swap pool. `count` swap-outs are executed back to back into distinct
 * host slots and timed until the last has landed (awaited as a swap-in would), so Deno's
 * ~10 ms readback floor is paid once per trial, as in a run where swap-outs overlap the steps
 * after them; the best of `trials` trials, divided by `count`. `blocks` defaults to 16: one
 * preempted request of ~250 tokens.
 *
 * @throws {RangeError} when the runner's KV pool has fewer than `blocks` blocks.
 */
export async function measureSwapOutMs(
  runner: ModelRunner,
  blocks = 16,
  count = 8,
  trials = 3,
): Promise<number> {
  if (blocks > runner.options.numKvBlocks) {
    throw new RangeError(
      `Cannot time a swap-out of ${blocks} blocks: the KV pool has ${runner.options.numKvBlocks}`,
    );
  }
  // The executor is not destroyed: that would destroy the runner; its pool is host memory.
  const executor = new WebGpuExecutor(runner, {
    numSwapBlocks: blocks * count,
    seedSource: () => 0,
  });
  const copiesOf = (i: number) =>
    Array.from({ length: blocks }, (_, j) => ({ gpuBlock: j, hostSlot: i * blocks + j }));
  const output = (step: number, out: number[], back: number[]): SchedulerOutput => ({
    step,
    scheduled: [],
    totalTokens: 0,
    blockSize: runner.options.blockSize,
    preempted: [],
    swappedOut: out.map((i) => ({ requestId: `swap-${i}`, copies: copiesOf(i) })),
    swappedIn: back.map((i) => ({ requestId: `swap-${i}`, copies: copiesOf(i) })),
    newRequests: [],
    finished: [],
    aborted: [],
  });
  const all = Array.from({ length: count }, (_, i) => i);
  let step = 0;
  let best = Infinity;
  for (let t = 0; t <= trials; t++) {
    const t0 = performance.now();
    for (const i of all) executor.execute(output(++step, [i], []));
    await executor.swapInReady(output(++step, [], all));
    // The first trial warms up.
    if (t > 0) best = Math.min(best, (performance.now() - t0) / count);
  }
  return best;
}
