/**
 * A mock executor: no model, no GPU. Each step "takes" `baseMs + perTokenMs * batchedTokens +
 * perSeqMs * sequences + perKiloPairMs * attendedPairs / 1000` milliseconds (a latency model of
 * a real runner, e.g.
 * calibrated from the WebGPU runner's measured step times; {@linkcode mockStepMs}), steps run
 * one after another as on a device, and the sampled tokens are
 * deterministic (`mockTokenAt(requestId, position)`), so outputs are reproducible whatever the
 * batching.
 *
 * @module
 */

import { mockTokenAt } from "../../scheduler/mock_executor.ts";
import type { SchedulerOutput } from "../../scheduler/scheduler_output.ts";
import { GpuDeviceError } from "../../gpu/errors.ts";
import type { ExecutedStep, Executor, SampledToken } from "./executor.ts";

/**
 * Token ids the mock produces by default: [10, 60). In the byte-level BPE vocabularies of
 * `make-model` (GPT-2 byte order) these are the printable ASCII bytes "+" to "\\", so streamed
 * text is never empty and never a partial UTF-8 character.
 */
export const MOCK_FIRST_TOKEN = 10;
export const MOCK_TOKEN_COUNT = 50;

/** The latency model of one step (see {@linkcode mockStepMs}). */
export interface MockLatency {
  /** Fixed ms per step. */
  readonly baseMs: number;
  /** ms per batched token. */
  readonly perTokenMs: number;
  /** ms per scheduled sequence (its attention, its sampled row); default 0. */
  readonly perSeqMs?: number;
  /** ms per 1,000 (query, key) pairs attended ({@linkcode attendedPairs}); default 0. */
  readonly perKiloPairMs?: number;
}

/**
 * The (query, key) pairs a step's attention covers: a chunk of `n` new tokens from position
 * `p` attends `p + 1`, ..., `p + n` keys, `n * p + n * (n + 1) / 2` in all (a decode token at
 * position `p`: `p + 1`).
 */
export function attendedPairs(output: SchedulerOutput): number {
  let pairs = 0;
  for (const r of output.scheduled) pairs += chunkPairs(r.positionStart, r.numTokens);
  return pairs;
}

/** The (query, key) pairs of `n` new tokens from position `p`: `n * p + n * (n + 1) / 2`. */
export function chunkPairs(p: number, n: number): number {
  return n * p + (n * (n + 1)) / 2;
}

/**
 * Milliseconds of a step under `latency`: `baseMs + perTokenMs * totalTokens + perSeqMs *
 * scheduled.length + perKiloPairMs * attendedPairs(output) / 1000`; 0 for a step with nothing
 * scheduled.
 */
export function mockStepMs(latency: MockLatency, output: SchedulerOutput): number {
  if (output.scheduled.length === 0) return 0;
  const perKiloPair = latency.perKiloPairMs ?? 0;
  const pairMs = perKiloPair === 0 ? 0 : (perKiloPair * attendedPairs(output)) / 1000;
  return latency.baseMs + latency.perTokenMs * output.totalTokens +
    (latency.perSeqMs ?? 0) * output.scheduled.length + pairMs;
}

/** Throws RangeError unless every term of `latency` is a number >= 0. */
export function checkMockLatency(latency: MockLatency): void {
  const { baseMs, perTokenMs, perSeqMs = 0, perKiloPairMs = 0 } = latency;
  if (!(baseMs >= 0) || !(perTokenMs >= 0) || !(perSeqMs >= 0) || !(perKiloPairMs >= 0)) {
    throw new RangeError(
      `Mock latency must be >= 0: got ${baseMs} + ${perTokenMs} per token + ${perSeqMs} per ` +
        `sequence + ${perKiloPairMs} per 1000 attended pairs`,
    );
  }
}

/** Options of {@linkcode MockExecutor}. */
export interface MockExecutorOptions {
  readonly latency: MockLatency;
  /** Steps in flight at once (default 4). */
  readonly maxInFlight?: number;
  /** Token ids produced are in [firstToken, firstToken + numTokens) (default 10, 50). */
  readonly firstToken?: number;
  readonly numTokens?: number;
  /**
   * Fault injection: the n-th non-empty step fails with a {@linkcode GpuDeviceError}, as a lost
   * device would (tests of the engine's and the server's failure paths).
   */
  readonly failAtStep?: number;
  /**
   * Spend the step's latency inside `execute` (busy-waiting) instead of on a timer: the
   * behaviour of adapters whose `queue.submit` does the work (lavapipe, measured).
   */
  readonly blockingSubmit?: boolean;
}

/** See the module documentation. */
export class MockExecutor implements Executor {
  readonly kind = "mock" as const;
  readonly maxInFlight: number;
  readonly latency: MockLatency;
  readonly #first: number;
  readonly #count: number;
  readonly #failAtStep: number | undefined;
  readonly #blocking: boolean;
  #steps = 0;
  #busyUntil = 0;
  readonly #timers = new Set<ReturnType<typeof setTimeout>>();

  constructor(options: MockExecutorOptions) {
    checkMockLatency(options.latency);
    this.latency = options.latency;
    this.maxInFlight = options.maxInFlight ?? 4;
    this.#first = options.firstToken ?? MOCK_FIRST_TOKEN;
    this.#count = options.numTokens ?? MOCK_TOKEN_COUNT;
    this.#failAtStep = options.failAtStep;
    this.#blocking = options.blockingSubmit ?? false;
  }

  /** Milliseconds `output` takes under the latency model. */
  stepMs(output: SchedulerOutput): number {
    return mockStepMs(this.latency, output);
  }

  execute(output: SchedulerOutput): ExecutedStep {
    const sampled = new Map<string, SampledToken>();
    for (const r of output.scheduled) {
      if (!r.samplesToken) continue;
      const position = r.positionStart + r.numTokens;
      sampled.set(r.requestId, {
        tokenId: mockTokenAt(r.requestId, position, this.#first, this.#count),
        logprob: 0,
      });
    }
    if (output.scheduled.length === 0) return { result: Promise.resolve(sampled) };
    if (++this.#steps === this.#failAtStep) {
      return {
        result: Promise.reject(
          new GpuDeviceError("GPU device lost (injected by the mock executor)"),
        ),
      };
    }
    if (this.#blocking) {
      const until = performance.now() + this.stepMs(output);
      while (performance.now() < until) { /* the device works inside submit */ }
      return { result: Promise.resolve(sampled) };
    }
    const now = performance.now();
    const start = Math.max(now, this.#busyUntil);
    this.#busyUntil = start + this.stepMs(output);
    const delay = this.#busyUntil - now;
    const result = new Promise<ReadonlyMap<string, SampledToken>>((resolve) => {
      const id = setTimeout(() => {
        this.#timers.delete(id);
        resolve(sampled);
      }, delay);
      this.#timers.add(id);
    });
    return { result };
  }

  release(_requestId: string): void {}

  destroy(): void {
    for (const id of this.#timers) clearTimeout(id);
    this.#timers.clear();
  }
}
