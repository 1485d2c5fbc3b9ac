/**
 * Calibration of the mock executor's latency model from the WebGPU runner: step times
 * measured at several batched-token counts (decode steps of 1 to 64 sequences, and prefill
 * chunks of one sequence), fitted by least squares to `ms = a + b * batchedTokens`.
 *
 * @module
 */

import type { ModelRunner } from "../../engine/model_runner.ts";
import { fitLine, type LineFit } from "./fit.ts";
import { pipelinedStepMs, type StepShape, syntheticBatch } from "./runner_timing.ts";

/** The step shapes measured by default (contexts typical of the batching workload). */
export const CALIBRATION_SHAPES: readonly StepShape[] = [
  { seqs: 1, queryLen: 1, contextLen: 256 },
  { seqs: 4, queryLen: 1, contextLen: 256 },
  { seqs: 16, queryLen: 1, contextLen: 256 },
  { seqs: 32, queryLen: 1, contextLen: 256 },
  { seqs: 64, queryLen: 1, contextLen: 256 },
  { seqs: 1, queryLen: 64, contextLen: 64 },
  { seqs: 1, queryLen: 128, contextLen: 128 },
  { seqs: 1, queryLen: 256, contextLen: 256 },
];

/** One measured step shape. */
export interface CalibrationPoint {
  readonly shape: StepShape;
  /** Batched tokens (seqs x queryLen). */
  readonly tokens: number;
  /** Measured ms per step (pipelined). */
  readonly ms: number;
  /** The fit's prediction, ms. */
  readonly fittedMs: number;
}

/** Measured points and the fitted line. */
export interface Calibration {
  readonly points: readonly CalibrationPoint[];
  readonly fit: LineFit;
}

/** Measures every shape (skipping those the runner cannot hold) and fits the line. */
export async function calibrate(
  runner: ModelRunner,
  shapes: readonly StepShape[] = CALIBRATION_SHAPES,
  onPoint: (shape: StepShape, ms: number) => void = () => {},
): Promise<Calibration> {
  const measured: { shape: StepShape; tokens: number; ms: number }[] = [];
  for (const shape of shapes) {
    const tokens = shape.seqs * shape.queryLen;
    const o = runner.options;
    if (tokens > o.maxTokens || shape.seqs > o.maxSeqs || shape.contextLen > o.maxModelLen) {
      continue;
    }
    const ms = await pipelinedStepMs(runner, syntheticBatch(runner, shape));
    onPoint(shape, ms);
    measured.push({ shape, tokens, ms });
  }
  const fit = fitLine(measured.map((p) => ({ x: p.tokens, y: p.ms })));
  return {
    points: measured.map((p) => ({ ...p, fittedMs: fit.a + fit.b * p.tokens })),
    fit,
  };
}
