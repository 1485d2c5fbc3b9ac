/**
 * Dynamic batching, the second baseline of the user's batching notes: like static batching,
 * but a batch also starts once the oldest waiting request has waited `batchWaitMs` (the wait
 * window opens at the first arrival), with up to `maxBatchSize` requests. With a window of 0 it
 * takes whatever is queued as soon as the previous batch is done. Time comes from the injected
 * clock, so tests drive it with a fake one; the engine sleeps until {@linkcode
 * DynamicScheduler.wakeTime} when a step schedules nothing.
 *
 * @module
 */

import { StaticScheduler, type StaticSchedulerConfig } from "./static_scheduler.ts";

/** Configuration of a {@linkcode DynamicScheduler}. */
export interface DynamicSchedulerConfig extends Omit<StaticSchedulerConfig, "batchSize"> {
  /** Most requests per batch. */
  readonly maxBatchSize: number;
  /** Wait window in ms, from the oldest waiting request's arrival. */
  readonly batchWaitMs: number;
}

/** Static batches formed by size or by a wait window, whichever comes first. */
export class DynamicScheduler extends StaticScheduler {
  override readonly kind: "static" | "dynamic" = "dynamic";
  /** The wait window in ms. */
  readonly batchWaitMs: number;

  /** Throws RangeError on a negative window or when the pool cannot hold maxBatchSize reservations. */
  constructor(config: DynamicSchedulerConfig) {
    super({ ...config, batchSize: config.maxBatchSize });
    if (!(config.batchWaitMs >= 0) || !Number.isFinite(config.batchWaitMs)) {
      throw new RangeError(
        `Cannot create scheduler: batchWaitMs is ${config.batchWaitMs}, expected a finite number >= 0`,
      );
    }
    this.batchWaitMs = config.batchWaitMs;
  }

  protected override shouldStartBatch(): boolean {
    const oldest = this.queue[0];
    if (oldest === undefined) return false;
    return super.shouldStartBatch() || this.now() - oldest.arrivalTime >= this.batchWaitMs;
  }

  override wakeTime(): number | null {
    const oldest = this.queue[0];
    if (oldest === undefined || !this.batch.every((s) => s.isFinished)) return null;
    return oldest.arrivalTime + this.batchWaitMs;
  }
}
