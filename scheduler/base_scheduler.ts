/**
 * What every scheduler does alike, around its own policy: the live-request table, step
 * numbering, the lifecycle part of each {@linkcode SchedulerOutput} (new requests, ended ids),
 * applying sampled tokens, finishing and aborting. A scheduler supplies `addRequest`,
 * `schedule` (building its output with {@linkcode BaseScheduler.seal}), `stats` and what a
 * finishing request releases ({@linkcode BaseScheduler.releaseSequence}).
 *
 * @module
 */

import { RequestTable } from "./request_table.ts";
import type { NewRequest, Scheduler, SchedulerStats } from "./scheduler_api.ts";
import type { RequestUpdate, SchedulerOutput } from "./scheduler_output.ts";
import type { Sequence } from "./sequence.ts";

/** The shared half of the schedulers (see the module documentation). */
export abstract class BaseScheduler implements Scheduler {
  abstract readonly kind: Scheduler["kind"];
  /** Most tokens in one sequence. */
  abstract readonly maxModelLen: number;
  /** The model's end-of-sequence token ids. */
  abstract readonly eosTokenIds: readonly number[];
  /** The live requests; a finishing one is handed to {@linkcode releaseSequence} first. */
  protected readonly requests: RequestTable = new RequestTable((seq) => this.releaseSequence(seq));
  #step = 0;

  abstract addRequest(request: NewRequest): Sequence;
  abstract schedule(): SchedulerOutput;
  abstract stats(): SchedulerStats;

  /**
   * Takes a finishing (or aborted) request, still live, out of the scheduler's queues and frees
   * its KV.
   */
  protected abstract releaseSequence(seq: Sequence): void;

  /** Numbers a new step: 1, 2, ... */
  protected nextStep(): number {
    return ++this.#step;
  }

  /** Completes a step's output with its lifecycle lists (see {@linkcode RequestTable.seal}). */
  protected seal(
    parts: Omit<SchedulerOutput, "newRequests" | "finished" | "aborted">,
  ): SchedulerOutput {
    return this.requests.seal(parts);
  }

  updateFromOutput(output: SchedulerOutput, sampled: ReadonlyMap<string, number>): RequestUpdate[] {
    return this.requests.applyStep(output, sampled, this.eosTokenIds, this.maxModelLen);
  }

  finishRequest(
    requestId: string,
    reason: "stop" | "length",
    stopReason: string | null = null,
  ): boolean {
    return this.requests.finishById(requestId, reason, stopReason);
  }

  abortRequest(requestId: string): boolean {
    return this.requests.finishById(requestId, "abort", null);
  }

  getRequest(requestId: string): Sequence | undefined {
    return this.requests.get(requestId);
  }

  hasUnfinishedRequests(): boolean {
    return this.requests.size > 0;
  }

  /** Nothing to do unless the scheduler holds requests back to form batches. */
  flush(): void {}

  /** Null unless the scheduler waits for a deadline (see the dynamic baseline). */
  wakeTime(): number | null {
    return null;
  }
}
