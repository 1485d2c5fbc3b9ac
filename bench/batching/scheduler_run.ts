/**
 * One scheduler run over a workload on a backend, shared by the batching benchmark's comparison
 * (bench/batching/compare.ts) and sweep (bench/batching/sweep.ts): the per-scheduler result, the
 * mock and WebGPU backends, the mock latency model and the workload of the options.
 *
 * @module
 */

import { MockExecutor, type MockLatency } from "../../engine/executors/mock_executor.ts";
import { WebGpuExecutor } from "../../engine/executors/webgpu_executor.ts";
import type { Executor } from "../../engine/executors/executor.ts";
import type { ModelRunner } from "../../engine/model_runner.ts";
import { runHarness, type Timeline, VirtualTimeline, WallTimeline } from "./harness.ts";
import { type RunSummary, summarizeRun } from "./run_summary.ts";
import { baselineBatchSize, makeScheduler, type SchedulerChoice } from "./scheduler_choice.ts";
import type { Options } from "./options.ts";
import { type Arrival, makeWorkload, type WorkloadRequest } from "./workload.ts";

/** The result of one scheduler on the workload (a JSON `results` entry). */
export interface SchedulerResult extends RunSummary {
  readonly scheduler: "continuous" | "static" | "dynamic";
  /** Static / dynamic batch size, continuous max_num_seqs. */
  readonly batch_size: number;
  /** Dynamic only: wait window, ms. */
  readonly batch_wait_ms: number | null;
  /** Decode steps (every request decodes one token) per second of the run. */
  readonly steps_per_s: number;
  /** Requests finished by time t (s from the first arrival), at most 64 points: the chart. */
  readonly completion_curve: readonly { readonly t_s: number; readonly finished: number }[];
}

/** Requests finished over time, sampled at (at most) 64 evenly spaced finish events. */
function completionCurve(
  requests: readonly { readonly arrivalMs: number; readonly finishMs: number }[],
): { t_s: number; finished: number }[] {
  if (requests.length === 0) return [];
  const t0 = Math.min(...requests.map((r) => r.arrivalMs));
  const ends = requests.map((r) => (r.finishMs - t0) / 1000).sort((a, b) => a - b);
  const stride = Math.max(1, Math.ceil(ends.length / 64));
  const curve = [{ t_s: 0, finished: 0 }];
  for (let i = stride - 1; i < ends.length; i += stride) {
    curve.push({ t_s: ends[i]!, finished: i + 1 });
  }
  if (curve.at(-1)!.finished !== ends.length) {
    curve.push({ t_s: ends.at(-1)!, finished: ends.length });
  }
  return curve;
}

/** Makes the executor and timeline of one run. */
type Backend = () => {
  executor: Executor;
  timeline: Timeline;
  settle?: (step: number) => void;
};

/**
 * Runs `requests` through the scheduler of `choice` on a fresh executor and timeline of
 * `backend`, at most `maxInFlight` steps in flight (default: the executor's maximum).
 */
export async function runOne(
  choice: SchedulerChoice,
  requests: readonly WorkloadRequest[],
  backend: Backend,
  maxInFlight: number | undefined,
): Promise<SchedulerResult> {
  const { executor, timeline, settle } = backend();
  const scheduler = makeScheduler(choice, () => timeline.now());
  const run = await runHarness({
    scheduler,
    executor,
    timeline,
    requests,
    maxInFlight: maxInFlight ?? executor.maxInFlight,
    ...(settle !== undefined ? { settle } : {}),
  });
  const s = summarizeRun(run);
  const batch = choice.kind === "continuous" ? choice.maxNumSeqs : Math.min(
    choice.batchSize ?? Infinity,
    baselineBatchSize(choice.kvTokens, choice.maxModelLen, choice.blockSize),
  );
  return {
    scheduler: choice.kind,
    batch_size: batch,
    batch_wait_ms: choice.kind === "dynamic" ? choice.batchWaitMs ?? 10 : null,
    ...s,
    steps_per_s: s.duration_s > 0 ? s.steps / s.duration_s : 0,
    completion_curve: completionCurve(run.requests),
  };
}

/** The mock executor with the options' latency model, on the virtual clock or the wall clock. */
export function mockBackend(o: Options): Backend {
  const latency = mockLatency(o);
  if (o.clock === "wall") {
    return () => ({ executor: new MockExecutor({ latency }), timeline: new WallTimeline() });
  }
  return () => {
    const timeline = new VirtualTimeline();
    const executor = new MockExecutor({
      latency,
      clock: "virtual",
      virtualClock: timeline,
      swapOutMs: o.swapOutMs,
    });
    return { executor, timeline, settle: (step) => executor.settle(step) };
  };
}

/** The WebGPU executor on `runner` (host swap space in swap mode), on the wall clock. */
export function webgpuBackend(runner: ModelRunner, o: Options): Backend {
  const numSwapBlocks = o.preemptionMode === "swap" ? swapBlocks(o) : 0;
  return () => ({
    executor: new WebGpuExecutor(runner, { numSwapBlocks, seedSource: () => 0 }),
    timeline: new WallTimeline(),
  });
}

/** The mock latency model of the options. */
function mockLatency(o: Options): MockLatency {
  return {
    baseMs: o.baseMs,
    perTokenMs: o.perTokenMs,
    perSeqMs: o.perSeqMs,
    perKiloPairMs: o.perKiloPairMs,
  };
}

/** The mock latency model in words. */
export function latencyText(o: Options): string {
  return `${o.baseMs} + ${o.perTokenMs} ms x batched tokens + ${o.perSeqMs} ms x sequences + ` +
    `${o.perKiloPairMs} ms x 1000 attended pairs` +
    (o.preemptionMode === "swap" ? `; swap-out ${o.swapOutMs} ms` : "");
}

/** The KV budget and step limits every scheduler of a run gets from the options. */
export function schedulerLimits(
  o: Options,
): Omit<SchedulerChoice, "kind" | "batchSize" | "batchWaitMs" | "preemptionMode" | "swapBlocks"> {
  return {
    kvTokens: o.kvSlots,
    blockSize: o.blockSize,
    maxModelLen: o.maxModelLen,
    maxNumSeqs: o.maxNumSeqs,
    maxNumBatchedTokens: o.maxNumBatchedTokens,
  };
}

/** Host swap blocks of the swap space (whole blocks of `--block-size` token slots). */
export function swapBlocks(o: Options): number {
  return Math.floor(o.swapSlots / o.blockSize);
}

/** The options' workload (count, seed, length ranges) over `vocabSize` token ids. */
export function workloadOf(o: Options, vocabSize: number, arrival: Arrival): WorkloadRequest[] {
  return makeWorkload({
    requests: o.requests,
    seed: o.seed,
    promptLen: o.promptLen,
    outputLen: o.outputLen,
    vocabSize,
    arrival,
  });
}
