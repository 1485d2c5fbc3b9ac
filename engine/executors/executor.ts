/**
 * What the engine loop needs from whatever computes steps: execute one scheduler output, i.e.
 * submit it without waiting, and later deliver the token sampled for each request that samples.
 * The WebGPU executor runs the real model; the mock executor (mock_executor.ts) fakes step times
 * with a latency model, on the wall clock or a virtual one, for the engine's mock mode, the
 * `/batch/test` experiment and the batching benchmarks, and checks the scheduler's contract on a
 * simulated KV cache in the scheduler tests.
 *
 * @module
 */

import type { SchedulerOutput } from "../../scheduler/scheduler_output.ts";
import type { PromptLogprobRow } from "../sampled_rows.ts";

/** The token sampled for one request in one step. */
export interface SampledToken {
  readonly tokenId: number;
  /**
   * Log-probability under the raw model distribution (0 for the mock executor). For a request
   * with penalties or a logit bias: under the processed logits, unless the token is among `top`
   * (then its raw value from there).
   */
  readonly logprob: number;
  /**
   * When the request's `params.logprobs` > 0: the most likely tokens under the raw logits, best
   * first (ties: lower id first), `min(params.logprobs, vocab)` of them.
   */
  readonly top?: readonly { readonly tokenId: number; readonly logprob: number }[];
}

/** The log-probability of one prompt token, scored in a step (`params.promptLogprobs`). */
export interface ScoredPromptToken extends PromptLogprobRow {
  /** The token's position in the prompt (>= 1). */
  readonly position: number;
}

/** A submitted step. */
export interface ExecutedStep {
  /** Request id -> sampled token, for every scheduled request with `samplesToken`. */
  readonly result: Promise<ReadonlyMap<string, SampledToken>>;
  /**
   * Requests this step could not serve (a parameter outside what the kernels take, a bug in
   * their per-request state), with why. The step ran for every other request; the engine ends
   * these with an error. Absent when none failed.
   */
  readonly failed?: ReadonlyMap<string, Error>;
  /**
   * When the step scores prompt tokens (`ScheduledRequest.promptLogprobs`): request id -> its
   * scored tokens, in position order; resolves with `result`. Absent when it scores none.
   */
  readonly promptLogprobs?: Promise<ReadonlyMap<string, readonly ScoredPromptToken[]>>;
  /**
   * Whether the result's readback has started; false while it waits for a later submit (the
   * WebGPU executor's overlapped steps: {@linkcode Executor.flush} starts it). Absent: started.
   */
  readbackStarted?(): boolean;
}

/** Computes steps. */
export interface Executor {
  readonly kind: "webgpu" | "mock";
  /** Steps that may be submitted before the oldest one's result is awaited. */
  readonly maxInFlight: number;
  /**
   * Submits `output` (which may be empty) and returns at once. The executor learns the request
   * lifecycle from `output` alone (`newRequests`, `finished`, `aborted`: see
   * scheduler/scheduler_output.ts), so the engine passes it every output that lists ended ids,
   * even one that schedules nothing. Swap-outs do not hold later
   * steps back: the device copies the blocks before any later step can overwrite them, and the
   * copies reach host memory in the background. `tokenMasks` (structured outputs): request id
   * -> the allowed-token bitmask of its sampled row this step (xgrammar's layout, see
   * `SequenceChunk.tokenMask`); an executor that runs no model ignores them.
   */
  execute(output: SchedulerOutput, tokenMasks?: ReadonlyMap<string, Uint32Array>): ExecutedStep;
  /**
   * When `output` swaps in blocks whose swap-out has not reached host memory yet: a promise to
   * await before `execute(output)` (it rejects when that swap-out failed). Otherwise undefined,
   * the common case: a request is seldom swapped back in within a readback's ~10 ms.
   */
  swapInReady?(output: SchedulerOutput): Promise<void> | undefined;
  /**
   * When a step's result may wait for a later `execute` (the WebGPU executor's overlapped
   * steps): starts it now. The engine calls it before awaiting a step whose readback has not
   * started ({@linkcode ExecutedStep.readbackStarted}).
   */
  flush?(): void;
  /**
   * Requests whose per-request state (seeds, penalty histories) the executor holds: 0 once
   * every request has ended and an output listing it was executed. For leak checks.
   */
  readonly numTracked: number;
  /** Releases the device. */
  destroy(): void;
}
