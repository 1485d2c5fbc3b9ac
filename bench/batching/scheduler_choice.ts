/**
 * Scheduler construction for the batching benchmark: {@linkcode SchedulerChoice} (which
 * scheduler and its knobs), {@linkcode makeScheduler} and the baselines' largest batch
 * {@linkcode baselineBatchSize}.
 *
 * @module
 */

import { DEFAULT_KV_WATERMARK } from "../../engine/engine_config.ts";
import { createScheduler } from "../../scheduler/index.ts";
import type { Scheduler } from "../../scheduler/scheduler_api.ts";

/** Which scheduler, and its knobs. */
export interface SchedulerChoice {
  readonly kind: "continuous" | "static" | "dynamic";
  /** KV token slots (the memory budget every scheduler gets). */
  readonly kvTokens: number;
  readonly blockSize: number;
  readonly maxModelLen: number;
  /** Continuous: most running requests. */
  readonly maxNumSeqs: number;
  readonly maxNumBatchedTokens: number;
  /**
   * Static / dynamic: requested batch size, capped at the largest batch whose max_model_len
   * reservations fit `kvTokens` (default: that largest batch).
   */
  readonly batchSize?: number;
  /** Dynamic: wait window, ms. */
  readonly batchWaitMs?: number;
  /** Continuous: preemption by recompute (default) or by swap to `swapBlocks` host blocks. */
  readonly preemptionMode?: "recompute" | "swap";
  /** Continuous, swap mode: host swap blocks. */
  readonly swapBlocks?: number;
}

/** The largest batch whose contiguous max_model_len reservations fit `kvTokens` slots. */
export function baselineBatchSize(
  kvTokens: number,
  maxModelLen: number,
  blockSize: number,
): number {
  const perMember = Math.ceil(maxModelLen / blockSize) * blockSize;
  return Math.floor(Math.floor(kvTokens / blockSize) * blockSize / perMember);
}

/**
 * The scheduler for `c`, clocked by `now`. The baselines get the same KV pool as the
 * continuous scheduler; their batch is the largest that fits it (or `batchSize` if smaller).
 *
 * @throws {RangeError} when not even one max_model_len reservation fits the pool.
 */
export function makeScheduler(c: SchedulerChoice, now: () => number): Scheduler {
  const common = {
    maxModelLen: c.maxModelLen,
    blockSize: c.blockSize,
    numGpuBlocks: Math.floor(c.kvTokens / c.blockSize),
    maxNumBatchedTokens: c.maxNumBatchedTokens,
    eosTokenIds: [],
    now,
  };
  if (c.kind === "continuous") {
    return createScheduler({
      kind: "continuous",
      ...common,
      maxNumSeqs: c.maxNumSeqs,
      watermark: DEFAULT_KV_WATERMARK, // as the engine
      preemptionMode: c.preemptionMode ?? "recompute",
      numSwapBlocks: c.preemptionMode === "swap" ? c.swapBlocks ?? 0 : 0,
    });
  }
  const fits = baselineBatchSize(c.kvTokens, c.maxModelLen, c.blockSize);
  if (fits < 1) {
    throw new RangeError(
      `Cannot run the ${c.kind} baseline: ${c.kvTokens} KV slots hold no reservation of max_model_len ${c.maxModelLen}`,
    );
  }
  const batch = Math.min(c.batchSize ?? fits, fits);
  return c.kind === "static"
    ? createScheduler({ kind: "static", ...common, batchSize: batch })
    : createScheduler({
      kind: "dynamic",
      ...common,
      maxBatchSize: batch,
      batchWaitMs: c.batchWaitMs ?? 10,
    });
}
