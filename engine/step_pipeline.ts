/**
 * The engine's steps in flight: submitted to the executor, in step order, awaiting their sampled
 * tokens, and how many of them to keep submitted ahead of the oldest one's readback.
 *
 * Pipelining hides Deno's ~10 ms readback latency. Some adapters (lavapipe, measured) do a
 * step's work on the calling thread, inside the executor's `execute` (`queue.submit` and the
 * readback's `mapAsync` call): then every step in flight ahead of a token delays it by a whole
 * step while the event loop is blocked (no HTTP chunk goes out). So the work queued ahead is
 * bounded in time: about {@linkcode AHEAD_BUDGET_MS} of submit time, and never fewer than two
 * steps (the second submit covers the first readback).
 *
 * @module
 */

import type { SchedulerOutput } from "../scheduler/scheduler_output.ts";
import type { ExecutedStep, Executor, SampledToken } from "./executors/executor.ts";

/** Submit time the engine queues ahead of the oldest step's readback, ms. */
export const AHEAD_BUDGET_MS = 100;

/** Submissions slower than this (ms, moving average) do the device's work: yield after each. */
export const SYNC_SUBMIT_MS = 40;

/**
 * Overlapped steps (the WebGPU executor under the gpu kernel profile) start their deferred
 * readbacks this many at a time: Deno's `mapAsync` waits until the GPU has finished every
 * submitted step, so each start leaves the GPU idle until the next submit; batched, that happens
 * once per this many steps. A readback resolves >= 10 ms after it starts, so the steps kept in
 * flight behind a batch (the executor's `maxInFlight`, 7, less this) must cover that: 4 steps of
 * >= 2.5 ms.
 */
export const READBACK_BATCH = 3;

/** A submitted step awaiting its tokens. */
export interface InFlight {
  readonly output: SchedulerOutput;
  readonly result: Promise<ReadonlyMap<string, SampledToken>>;
  /** The prompt tokens the step scored (see `ExecutedStep.promptLogprobs`), when it scored any. */
  readonly promptLogprobs?: ExecutedStep["promptLogprobs"];
  /** Nothing was scheduled: no GPU work, nothing to wait for. */
  readonly empty: boolean;
  /** Whether the result's readback has started (see `ExecutedStep.readbackStarted`). */
  readonly readbackStarted: () => boolean;
}

/** The steps in flight (see the module documentation). */
export class StepPipeline {
  readonly #queue: InFlight[] = [];
  /** Most steps in flight. */
  readonly #depth: number;
  /** Moving average of the wall time `executor.execute` takes to return, ms. */
  #submitMs = 0;

  /** @param depth most steps in flight (>= 1). */
  constructor(depth: number) {
    this.#depth = Math.max(1, depth);
  }

  /** Steps in flight. */
  get length(): number {
    return this.#queue.length;
  }

  /** Whether another step may be submitted before the oldest one's tokens are awaited. */
  get hasRoom(): boolean {
    return this.#queue.length < this.#effectiveDepth();
  }

  /**
   * Whether `execute` does the device's work on this thread (its moving average is over
   * {@linkcode SYNC_SUBMIT_MS}): the engine then yields to the event loop after each step.
   */
  get synchronousDevice(): boolean {
    return this.#submitMs > SYNC_SUBMIT_MS;
  }

  /** Submits `output` to `executor`, timing the call, and queues it. */
  submit(
    executor: Executor,
    output: SchedulerOutput,
    tokenMasks?: ReadonlyMap<string, Uint32Array>,
  ): ExecutedStep {
    const t0 = performance.now();
    const step = executor.execute(output, tokenMasks);
    this.#submitMs = 0.7 * this.#submitMs + 0.3 * (performance.now() - t0);
    // The engine awaits results in order; a step that fails before its turn must not be
    // reported as an unhandled rejection meanwhile (the await still throws).
    step.result.catch(() => {});
    step.promptLogprobs?.catch(() => {});
    const started = step.readbackStarted?.bind(step) ?? (() => true);
    this.#queue.push({
      output,
      result: step.result,
      ...(step.promptLogprobs === undefined ? {} : { promptLogprobs: step.promptLogprobs }),
      empty: false,
      readbackStarted: started,
    });
    return step;
  }

  /** Queues a step that scheduled nothing: it is applied in order like any other. */
  pushEmpty(output: SchedulerOutput): void {
    this.#queue.push({
      output,
      result: Promise.resolve(new Map()),
      empty: true,
      readbackStarted: () => true,
    });
  }

  /** Takes the oldest step. */
  shift(): InFlight | undefined {
    return this.#queue.shift();
  }

  /** Takes the empty steps at the head of the queue (they have nothing to wait for). */
  shiftEmpty(): SchedulerOutput[] {
    const out: SchedulerOutput[] = [];
    while (this.#queue[0]?.empty === true) out.push(this.#queue.shift()!.output);
    return out;
  }

  /** Steps to keep in flight now (see the module documentation). */
  #effectiveDepth(): number {
    if (this.#submitMs <= 1) return this.#depth;
    return Math.max(2, Math.min(this.#depth, Math.floor(AHEAD_BUDGET_MS / this.#submitMs)));
  }
}
