/**
 * The mock executor: no model, no GPU; the one executor of the engine's mock mode (`--executor
 * mock`, the `/batch/test` experiment), of the batching benchmarks and of the scheduler tests.
 *
 * - Tokens: deterministic ({@linkcode mockTokenAt}`(requestId, position)`, or the `tokenAt`
 *   option), so outputs are reproducible whatever the batching.
 * - Latency model x timeline: each step "takes" `baseMs + perTokenMs * batchedTokens + perSeqMs *
 *   sequences + perKiloPairMs * attendedPairs / 1000` ms ({@linkcode mockStepMs}, e.g. calibrated
 *   from the WebGPU runner's measured step times), plus `swapOutMs` per swapped-out request, and
 *   steps run one after another as on a device. On the `"wall"` clock (default) that time passes
 *   for real: on timers, or busy-waiting inside `execute` with `blockingSubmit`. On the
 *   `"virtual"` clock each step's completion time is computed on a {@linkcode VirtualClock}
 *   (device serial: a step starts when the previous one ends or when it is submitted, whichever
 *   is later), and {@linkcode MockExecutor.settle} moves the clock there once the step's result
 *   is taken: minutes of simulated serving take a fraction of a second, exactly reproducibly.
 * - Contract checks (option `kv`): the steps also run against a simulated paged KV cache
 *   ({@linkcode MockKvCache}, engine/executors/mock_kv.ts) that checks fed tokens, slot mappings,
 *   block tables and swaps. {@linkcode MockExecutor.run} executes a step synchronously, and
 *   {@linkcode driveToCompletion} drives a scheduler with it.
 * - Fault injection (`failAtStep`): a step fails like a lost device.
 *
 * @module
 */

import type { RequestUpdate, SchedulerOutput } from "../../scheduler/scheduler_output.ts";
import { GpuDeviceError } from "../../gpu/errors.ts";
import type { ExecutedStep, Executor, SampledToken } from "./executor.ts";
import { MockKvCache, type MockKvOptions } from "./mock_kv.ts";

export { MockKvCache, type MockKvOptions };

/**
 * Token ids the mock produces by default: [10, 60). In the byte-level BPE vocabularies of
 * `make-model` (GPT-2 byte order) these are the printable ASCII bytes "+" to "\\", so streamed
 * text is never empty and never a partial UTF-8 character.
 */
export const MOCK_FIRST_TOKEN = 10;
export const MOCK_TOKEN_COUNT = 50;

/**
 * A deterministic "model": a token id in [first, first + count) hashed from the request id and
 * the position of the token being sampled.
 */
export function mockTokenAt(requestId: string, position: number, first = 100, count = 50): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < requestId.length; i++) h = Math.imul(h ^ requestId.charCodeAt(i), 0x01000193);
  h = Math.imul(h ^ position, 0x01000193);
  h = Math.imul(h ^ (h >>> 13), 0x5bd1e995);
  return first + ((h ^ (h >>> 15)) >>> 0) % count;
}

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

/** Simulated time in ms, starting at 0, moved only by {@linkcode VirtualClock.advanceTo}. */
export class VirtualClock {
  #t = 0;

  /** Simulated ms since the start. */
  now(): number {
    return this.#t;
  }

  /** Moves time forward to `t` (never backwards). */
  advanceTo(t: number): void {
    if (t > this.#t) this.#t = t;
  }
}

/** Options of {@linkcode MockExecutor}. */
export interface MockExecutorOptions {
  /** The latency model of a step (default: no time at all). */
  readonly latency?: MockLatency;
  /**
   * Where step time passes: `"wall"` (default), real time (timers, or a busy-wait with
   * `blockingSubmit`); `"virtual"`, simulated time on `virtualClock` (see the module doc).
   */
  readonly clock?: "wall" | "virtual";
  /** The clock of a `"virtual"` executor (default: a new one at 0; `virtualClock` reads it). */
  readonly virtualClock?: VirtualClock;
  /**
   * Wall clock only: spend the step's latency inside `execute` (busy-waiting) instead of on a
   * timer: the behaviour of adapters whose `queue.submit` does the work (lavapipe, measured).
   */
  readonly blockingSubmit?: boolean;
  /** Device ms each swapped-out request adds to its step (the copies of its blocks; default 0). */
  readonly swapOutMs?: number;
  /** Steps in flight at once (default 4). */
  readonly maxInFlight?: number;
  /** Token ids produced are in [firstToken, firstToken + numTokens) (default 10, 50). */
  readonly firstToken?: number;
  readonly numTokens?: number;
  /**
   * The token the "model" samples for `requestId` at `position` (the new token's position);
   * default `mockTokenAt(requestId, position, firstToken, numTokens)`.
   */
  readonly tokenAt?: (requestId: string, position: number) => number;
  /**
   * Fault injection: the n-th non-empty step fails with a {@linkcode GpuDeviceError}, as a lost
   * device would (tests of the engine's and the server's failure paths).
   */
  readonly failAtStep?: number;
  /** Run the steps against a simulated paged KV cache that checks the scheduler's contract. */
  readonly kv?: MockKvOptions;
}

/** See the module documentation. */
export class MockExecutor implements Executor {
  readonly kind = "mock" as const;
  readonly maxInFlight: number;
  readonly latency: MockLatency;
  readonly clock: "wall" | "virtual";
  /** The simulated time of a `"virtual"` executor; null on the wall clock. */
  readonly virtualClock: VirtualClock | null;
  /** Device ms each swapped-out request adds to its step. */
  readonly swapOutMs: number;
  /** Steps executed (`run` or `execute`, empty ones included). */
  steps = 0;
  /** Tokens computed (sum of `totalTokens` over steps). */
  tokens = 0;
  readonly #tokenAt: (requestId: string, position: number) => number;
  readonly #kv: MockKvCache | null;
  readonly #failAtStep: number | undefined;
  readonly #blocking: boolean;
  #nonEmptySteps = 0;
  #busyUntil = 0;
  readonly #doneAt = new Map<number, number>();
  readonly #timers = new Set<ReturnType<typeof setTimeout>>();

  /** Throws RangeError on a negative latency or swap-out time, or options of the other clock. */
  constructor(options: MockExecutorOptions = {}) {
    this.latency = options.latency ?? { baseMs: 0, perTokenMs: 0 };
    checkMockLatency(this.latency);
    this.swapOutMs = options.swapOutMs ?? 0;
    if (!(this.swapOutMs >= 0)) {
      throw new RangeError(`Mock swap-out time must be >= 0: got ${this.swapOutMs}`);
    }
    this.clock = options.clock ?? "wall";
    if (this.clock === "virtual" && options.blockingSubmit) {
      throw new RangeError("A mock executor on the virtual clock cannot busy-wait");
    }
    if (this.clock === "wall" && options.virtualClock !== undefined) {
      throw new RangeError('A virtual clock needs clock: "virtual"');
    }
    this.virtualClock = this.clock === "virtual"
      ? options.virtualClock ?? new VirtualClock()
      : null;
    this.maxInFlight = options.maxInFlight ?? 4;
    const first = options.firstToken ?? MOCK_FIRST_TOKEN;
    const count = options.numTokens ?? MOCK_TOKEN_COUNT;
    this.#tokenAt = options.tokenAt ?? ((id, p) => mockTokenAt(id, p, first, count));
    this.#kv = options.kv !== undefined ? new MockKvCache(options.kv) : null;
    this.#failAtStep = options.failAtStep;
    this.#blocking = options.blockingSubmit ?? false;
  }

  /** Milliseconds `output` takes under the latency model (swap-outs not included). */
  stepMs(output: SchedulerOutput): number {
    return mockStepMs(this.latency, output);
  }

  /**
   * Runs one step synchronously, taking no time: the simulated KV cache's swaps, writes and
   * checks (with the `kv` option), then sampling. Returns the sampled token per request with
   * `samplesToken`. Throws Error when a contract check fails.
   */
  run(output: SchedulerOutput): Map<string, number> {
    this.#kv?.write(output);
    const sampled = new Map<string, number>();
    for (const r of output.scheduled) {
      if (r.samplesToken) {
        sampled.set(r.requestId, this.#tokenAt(r.requestId, r.positionStart + r.numTokens));
      }
    }
    this.#kv?.sampled(output, sampled);
    this.steps++;
    this.tokens += output.totalTokens;
    return sampled;
  }

  /** {@linkcode MockExecutor.run}, with the step's time on the executor's clock. */
  execute(output: SchedulerOutput): ExecutedStep {
    const sampled = new Map<string, SampledToken>();
    for (const [id, tokenId] of this.run(output)) sampled.set(id, { tokenId, logprob: 0 });
    const ms = this.stepMs(output) + output.swappedOut.length * this.swapOutMs;
    if (output.scheduled.length === 0 && ms === 0) return { result: Promise.resolve(sampled) };
    if (output.scheduled.length > 0 && ++this.#nonEmptySteps === this.#failAtStep) {
      return {
        result: Promise.reject(
          new GpuDeviceError("GPU device lost (injected by the mock executor)"),
        ),
      };
    }
    if (this.virtualClock !== null) {
      this.#busyUntil = Math.max(this.virtualClock.now(), this.#busyUntil) + ms;
      this.#doneAt.set(output.step, this.#busyUntil);
      return { result: Promise.resolve(sampled) };
    }
    if (this.#blocking) {
      const until = performance.now() + ms;
      while (performance.now() < until) { /* the device works inside submit */ }
      return { result: Promise.resolve(sampled) };
    }
    const now = performance.now();
    this.#busyUntil = Math.max(now, this.#busyUntil) + ms;
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

  /**
   * Virtual clock: called once step `step`'s result was taken, moves the clock to the step's
   * completion time. Does nothing on the wall clock.
   */
  settle(step: number): void {
    const t = this.#doneAt.get(step);
    if (t !== undefined) {
      this.#doneAt.delete(step);
      this.virtualClock?.advanceTo(t);
    }
  }

  /** Always 0: the mock keeps no per-request state (its `kv` checks track the lifecycle). */
  get numTracked(): number {
    return 0;
  }

  destroy(): void {
    for (const id of this.#timers) clearTimeout(id);
    this.#timers.clear();
    this.#doneAt.clear();
  }
}

/** Options of {@linkcode driveToCompletion}. */
export interface DriveOptions {
  /** Schedule step n+1 before applying step n's tokens (default true), like the engine. */
  readonly async?: boolean;
  /** Throw after this many steps (default 1e6): a scheduler that stalls fails loudly. */
  readonly maxSteps?: number;
  /** Called with each output before it executes. */
  readonly onStep?: (output: SchedulerOutput) => void;
}

/** The scheduler side `driveToCompletion` needs (any `Scheduler` has it). */
export interface Drivable {
  schedule(): SchedulerOutput;
  updateFromOutput(output: SchedulerOutput, sampled: ReadonlyMap<string, number>): RequestUpdate[];
  hasUnfinishedRequests(): boolean;
}

/**
 * Runs `scheduler` with `executor` ({@linkcode MockExecutor.run}, no time passes) until no
 * request is unfinished; returns every update in order. Throws RangeError after `maxSteps` steps.
 */
export function driveToCompletion(
  scheduler: Drivable,
  executor: MockExecutor,
  options: DriveOptions = {},
): RequestUpdate[] {
  const { async = true, maxSteps = 1_000_000, onStep } = options;
  const updates: RequestUpdate[] = [];
  let pending: { output: SchedulerOutput; sampled: Map<string, number> } | null = null;
  for (let steps = 0; scheduler.hasUnfinishedRequests() || pending !== null; steps++) {
    if (steps >= maxSteps) {
      throw new RangeError(
        `Cannot drive scheduler: requests still unfinished after ${steps} steps`,
      );
    }
    const output = scheduler.schedule();
    onStep?.(output);
    const sampled = executor.run(output);
    if (!async) {
      updates.push(...scheduler.updateFromOutput(output, sampled));
      continue;
    }
    if (pending !== null) {
      updates.push(...scheduler.updateFromOutput(pending.output, pending.sampled));
    }
    pending = { output, sampled };
    if (!scheduler.hasUnfinishedRequests()) {
      updates.push(...scheduler.updateFromOutput(output, sampled));
      pending = null;
    }
  }
  return updates;
}
