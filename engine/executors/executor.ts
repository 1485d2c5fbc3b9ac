/**
 * What the engine loop needs from whatever computes steps: execute one scheduler output, i.e.
 * submit it without waiting, and later deliver the token sampled for each request that samples.
 * The WebGPU executor runs the real model; the mock executor fakes step times with a latency
 * model for scheduler studies and the `/batch/test` experiment.
 *
 * @module
 */

import type { SchedulerOutput } from "../../scheduler/scheduler_output.ts";

/** The token sampled for one request in one step. */
export interface SampledToken {
  readonly tokenId: number;
  /** Log-probability under the raw model distribution (0 for the mock executor). */
  readonly logprob: number;
}

/** A submitted step. */
export interface ExecutedStep {
  /** Request id -> sampled token, for every scheduled request with `samplesToken`. */
  readonly result: Promise<ReadonlyMap<string, SampledToken>>;
  /**
   * When set, the next step must not be executed before it resolves (a swap-out whose blocks
   * are still on their way to host memory).
   */
  readonly ready?: Promise<void>;
}

/** Computes steps. */
export interface Executor {
  readonly kind: "webgpu" | "mock";
  /** Steps that may be submitted before the oldest one's result is awaited. */
  readonly maxInFlight: number;
  /** Submits `output` (which may be empty) and returns at once. */
  execute(output: SchedulerOutput): ExecutedStep;
  /** Forgets per-request state (sampling seeds, ...). */
  release(requestId: string): void;
  /** Releases the device. */
  destroy(): void;
}
