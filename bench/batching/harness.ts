/**
 * The batching benchmark's harness: the engine's schedule / execute / postprocess loop (as in
 * engine/llm_engine.ts `#run`) driven directly over a {@linkcode Scheduler} and an
 * {@linkcode Executor}, so that the scheduler's gauges can be read at every step and each
 * request's arrival, first-token and finish times recorded.
 *
 * Loop, one iteration:
 * 1. requests whose arrival time has come are added to the scheduler;
 * 2. while fewer than `maxInFlight` steps are in flight: `schedule()`, record the KV gauges,
 *    `execute()` (returns at once);
 * 3. otherwise the oldest step's sampled tokens are awaited and applied with
 *    `updateFromOutput` (in step order), stamping first-token and finish times;
 * 4. when nothing runs: sleep until the next arrival or the dynamic baseline's wake time; once
 *    every request has arrived, `flush()` lets the baselines start a partial batch.
 *
 * Time comes from a {@linkcode Timeline}: wall-clock for the WebGPU executor (and the
 * `MockExecutor` of engine/executors/mock_executor.ts on its `"wall"` clock), or virtual for the
 * `MockExecutor` on its `"virtual"` clock, whose steps take the mock latency model's time
 * (`mockStepMs`: a fixed cost, a cost per batched token, one per sequence and one per attended
 * (query, key) pair) of *simulated* time, so a run of minutes of simulated serving takes a
 * fraction of a second and is exactly reproducible. The simulation models the device as serial
 * (one step after another) and the host as free (scheduling costs nothing).
 *
 * The schedulers are built by scheduler_choice.ts and a run's figures summarised by
 * run_summary.ts.
 *
 * @module
 */

import type { Scheduler } from "../../scheduler/scheduler_api.ts";
import {
  endsRequests,
  hasDeviceWork,
  type SchedulerOutput,
} from "../../scheduler/scheduler_output.ts";
import { samplingParams } from "../../scheduler/sampling_params.ts";
import type { Executor, SampledToken } from "../../engine/executors/executor.ts";
import { VirtualClock } from "../../engine/executors/mock_executor.ts";
import type { KvSample } from "./kv_utilization.ts";
import type { WorkloadRequest } from "./workload.ts";

/** A source of time in ms, and a way to wait for a time. */
export interface Timeline {
  /** True when time only moves when the harness moves it. */
  readonly virtual: boolean;
  /** Milliseconds since the start of the run. */
  now(): number;
  /** Resolves at time `t` (virtual: jumps there). */
  waitUntil(t: number): Promise<void>;
}

/** Real time since construction (performance.now). */
export class WallTimeline implements Timeline {
  readonly virtual = false;
  readonly #origin = performance.now();

  now(): number {
    return performance.now() - this.#origin;
  }

  waitUntil(t: number): Promise<void> {
    const ms = t - this.now();
    return new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
  }
}

/**
 * Simulated time, starting at 0, moved only by `advanceTo`: the {@linkcode VirtualClock} that a
 * virtual-clock `MockExecutor` advances, as a {@linkcode Timeline}.
 */
export class VirtualTimeline extends VirtualClock implements Timeline {
  readonly virtual = true;

  waitUntil(t: number): Promise<void> {
    this.advanceTo(t);
    return Promise.resolve();
  }
}

/** Per-request times of a run, ms since the start of the run. */
export interface RequestTiming {
  readonly requestId: string;
  readonly promptLen: number;
  readonly arrivalMs: number;
  /** When the first output token reached the host. */
  readonly firstTokenMs: number;
  /** When the last output token reached the host. */
  readonly finishMs: number;
  readonly outputTokens: number;
}

/** One scheduled (non-empty) step. */
export interface StepRecord {
  readonly step: number;
  /** Batched tokens. */
  readonly tokens: number;
  /** Requests in the step. */
  readonly seqs: number;
  /** Whether every request in it decodes one token. */
  readonly allDecode: boolean;
  /** Time it was submitted. */
  readonly submitMs: number;
  /** KV gauges right after it was scheduled. */
  readonly kv: KvSample;
}

/** Everything a run measured. */
export interface RunRecord {
  readonly requests: readonly RequestTiming[];
  readonly steps: readonly StepRecord[];
  /** First arrival to last finish, ms. */
  readonly durationMs: number;
  /** Preemptions (recompute or swap) during the run. */
  readonly preemptions: number;
  /**
   * Host wall ms spent in the scheduler over the run: `schedule()` and `updateFromOutput()`
   * (not `execute()`, whose submit runs the kernels themselves on lavapipe).
   */
  readonly schedulerMs: number;
}

/** Options of {@linkcode runHarness}. */
export interface HarnessOptions {
  readonly scheduler: Scheduler;
  readonly executor: Executor;
  readonly timeline: Timeline;
  readonly requests: readonly WorkloadRequest[];
  /** Steps in flight at once (capped by the executor's maximum). */
  readonly maxInFlight: number;
  /** Called after a step's result was awaited (a virtual-clock `MockExecutor.settle`). */
  readonly settle?: (step: number) => void;
}

interface Live {
  readonly req: WorkloadRequest;
  first: number | null;
  tokens: number;
}

/**
 * Runs every request of `options.requests` to completion (greedy, ignore_eos, max_tokens =
 * outputLen) and returns the timings. The scheduler must use `options.timeline.now` as its
 * clock. Throws Error when the scheduler stops making progress.
 */
export function runHarness(options: HarnessOptions): Promise<RunRecord> {
  return new HarnessRun(options).run();
}

/** One run of the harness loop (see the module documentation). */
class HarnessRun {
  readonly #o: HarnessOptions;
  readonly #pending: WorkloadRequest[];
  readonly #live = new Map<string, Live>();
  readonly #done: RequestTiming[] = [];
  readonly #steps: StepRecord[] = [];
  readonly #inFlight: {
    output: SchedulerOutput;
    result: Promise<ReadonlyMap<string, SampledToken>>;
  }[] = [];
  #next = 0;
  #idleFlushes = 0;
  #schedulerMs = 0;

  constructor(options: HarnessOptions) {
    this.#o = options;
    this.#pending = [...options.requests].sort((a, b) => a.arrivalMs - b.arrivalMs);
  }

  async run(): Promise<RunRecord> {
    const { scheduler, executor } = this.#o;
    const depth = Math.max(1, Math.min(this.#o.maxInFlight, executor.maxInFlight));
    while (this.#next < this.#pending.length || scheduler.hasUnfinishedRequests() || this.#busy()) {
      this.#admit();
      if (this.#inFlight.length < depth) {
        const t0 = performance.now();
        const output = scheduler.schedule();
        this.#schedulerMs += performance.now() - t0;
        // A step that only moves blocks (swap-out / swap-in) is executed too, as by the engine.
        if (hasDeviceWork(output)) {
          await this.#submit(output);
          continue;
        }
        // The executor learns of ended requests from the outputs alone.
        if (endsRequests(output)) executor.execute(output);
        if (this.#busy()) {
          // Empty steps are applied in order like any other.
          this.#inFlight.push({ output, result: Promise.resolve(new Map()) });
        } else {
          await this.#idle(output);
          continue;
        }
      }
      const oldest = this.#inFlight.shift()!;
      const sampled = await oldest.result;
      this.#o.settle?.(oldest.output.step);
      const t0 = performance.now();
      this.#apply(oldest.output, sampled);
      this.#schedulerMs += performance.now() - t0;
    }
    const first = this.#pending[0]?.arrivalMs ?? 0;
    const last = this.#done.reduce((m, r) => Math.max(m, r.finishMs), first);
    return {
      requests: this.#done,
      steps: this.#steps,
      durationMs: last - first,
      preemptions: scheduler.stats().numPreemptions,
      schedulerMs: this.#schedulerMs,
    };
  }

  /** Empty steps in flight alone do not keep the loop going. */
  #busy(): boolean {
    return this.#inFlight.some((s) => s.output.scheduled.length > 0);
  }

  /** Adds the requests whose arrival time has come. */
  #admit(): void {
    const now = this.#o.timeline.now();
    const pending = this.#pending;
    while (this.#next < pending.length && pending[this.#next]!.arrivalMs <= now) {
      const req = pending[this.#next++]!;
      this.#o.scheduler.addRequest({
        requestId: req.requestId,
        promptTokenIds: req.promptTokenIds,
        params: samplingParams({ temperature: 0, maxTokens: req.outputLen, ignoreEos: true }),
        arrivalTime: req.arrivalMs,
      });
      this.#live.set(req.requestId, { req, first: null, tokens: 0 });
    }
    // No more arrivals: the baselines may start a partial batch.
    if (this.#next === pending.length) this.#o.scheduler.flush();
  }

  /** Records the KV gauges of a step that computes or moves something, and submits it. */
  async #submit(output: SchedulerOutput): Promise<void> {
    const { scheduler, executor, timeline } = this.#o;
    const s = scheduler.stats();
    this.#steps.push({
      step: output.step,
      tokens: output.totalTokens,
      seqs: output.scheduled.length,
      allDecode: output.scheduled.every((r) => r.numTokens === 1),
      submitMs: timeline.now(),
      kv: { allocated: s.kvTokensAllocated, used: s.kvTokensUsed },
    });
    const landing = executor.swapInReady?.(output);
    if (landing !== undefined) await landing;
    const step = executor.execute(output);
    this.#inFlight.push({ output, result: step.result });
    this.#idleFlushes = 0;
  }

  /**
   * Only empty steps in flight: applies them, then `output`, and waits for the next arrival
   * or the dynamic baseline's window.
   */
  async #idle(output: SchedulerOutput): Promise<void> {
    const scheduler = this.#o.scheduler;
    for (const e of this.#inFlight.splice(0)) this.#apply(e.output, new Map());
    this.#apply(output, new Map());
    const wake = scheduler.wakeTime();
    const arrival = this.#pending[this.#next]?.arrivalMs;
    const t = Math.min(wake ?? Infinity, arrival ?? Infinity);
    if (t === Infinity) {
      if (scheduler.hasUnfinishedRequests() && ++this.#idleFlushes > 2) {
        throw new Error(
          `The ${scheduler.kind} scheduler stopped making progress with ${this.#live.size} requests unfinished`,
        );
      }
      return;
    }
    await this.#o.timeline.waitUntil(t);
  }

  /** Applies a step's tokens, stamping first-token and finish times. */
  #apply(output: SchedulerOutput, sampled: ReadonlyMap<string, SampledToken>): void {
    const ids = new Map<string, number>();
    for (const [id, s] of sampled) ids.set(id, s.tokenId);
    const now = this.#o.timeline.now();
    for (const u of this.#o.scheduler.updateFromOutput(output, ids)) {
      const l = this.#live.get(u.requestId);
      if (l === undefined) continue;
      l.tokens += u.newTokenIds.length;
      l.first ??= now;
      if (u.finishReason !== null) {
        this.#live.delete(u.requestId);
        this.#done.push({
          requestId: l.req.requestId,
          promptLen: l.req.promptTokenIds.length,
          arrivalMs: l.req.arrivalMs,
          firstTokenMs: l.first,
          finishMs: now,
          outputTokens: l.tokens,
        });
      }
    }
  }
}
