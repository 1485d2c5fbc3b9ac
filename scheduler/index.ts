/**
 * Schedulers for the engine: the continuous (vLLM v1 style) scheduler over a paged KV cache,
 * and the static / dynamic batching baselines behind the same {@linkcode Scheduler} interface.
 *
 * @module
 */

import { ContinuousScheduler, type ContinuousSchedulerConfig } from "./scheduler.ts";
import type { Scheduler } from "./scheduler_api.ts";
import { DynamicScheduler, type DynamicSchedulerConfig } from "./dynamic_scheduler.ts";
import { StaticScheduler, type StaticSchedulerConfig } from "./static_scheduler.ts";

export { BlockManager } from "./block_manager.ts";
export type { BlockManagerOptions, PrefixHit, SwapInCopy, SwapOutCopy } from "./block_manager.ts";
export { ContinuousScheduler, DynamicScheduler, StaticScheduler };
export type { ContinuousSchedulerConfig, DynamicSchedulerConfig, StaticSchedulerConfig };
export { DEFAULT_SAMPLING_PARAMS, samplingParams } from "./sampling_params.ts";
export type { SamplingParams } from "./sampling_params.ts";
export type { Clock, HostReady, NewRequest, Scheduler, SchedulerStats } from "./scheduler_api.ts";
export { SAMPLED_TOKEN } from "./scheduler_output.ts";
export type {
  RequestUpdate,
  ScheduledRequest,
  SchedulerOutput,
  SwappedInRequest,
  SwappedOutRequest,
} from "./scheduler_output.ts";
export { Sequence } from "./sequence.ts";
export type { FinishReason, RequestStatus } from "./sequence.ts";
export { checkStop } from "./stop_checker.ts";
export { enqueueWaiting, pickVictim, serviceOrder } from "./policy.ts";
export type { SchedulingPolicy } from "./policy.ts";
export type { StopDecision } from "./stop_checker.ts";

/** Configuration for {@linkcode createScheduler}, tagged by kind. */
export type SchedulerConfig =
  | ({ readonly kind: "continuous" } & ContinuousSchedulerConfig)
  | ({ readonly kind: "static" } & StaticSchedulerConfig)
  | ({ readonly kind: "dynamic" } & DynamicSchedulerConfig);

/** A scheduler of the configured kind. Throws RangeError on an invalid configuration. */
export function createScheduler(config: SchedulerConfig): Scheduler {
  switch (config.kind) {
    case "continuous":
      return new ContinuousScheduler(config);
    case "static":
      return new StaticScheduler(config);
    case "dynamic":
      return new DynamicScheduler(config);
  }
}
