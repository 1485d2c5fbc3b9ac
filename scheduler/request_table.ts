/**
 * The live requests of a scheduler and what every scheduler does with them alike: intake
 * (unique ids, arrival order), lookup, finishing (stop, length, abort) with the ids reported in
 * the next step's output, the lifecycle part of each output (requests scheduled for the first
 * time, ids ended since), and applying a step's sampled tokens in step order. What a finish
 * releases (KV blocks, queue places) is the owning scheduler's business: it passes a `release`
 * callback.
 *
 * @module
 */

import { createSequence, type IntakeLimits, type NewRequest } from "./scheduler_api.ts";
import type { NewRequestData, RequestUpdate, SchedulerOutput } from "./scheduler_output.ts";
import type { FinishReason, Sequence } from "./sequence.ts";
import { applyStepTokens } from "./step_commit.ts";

/** The live requests of one scheduler, by id. */
export class RequestTable {
  readonly #requests = new Map<string, Sequence>();
  readonly #release: (seq: Sequence) => void;
  /** Live requests already listed in some output's `newRequests`. */
  readonly #announced = new Set<string>();
  #finished: string[] = [];
  #aborted: string[] = [];
  #lastUpdated = 0;
  #order = 0;

  /**
   * @param release called first when a request finishes or is aborted, while it is still live:
   *   it takes the request out of the scheduler's queues and frees its KV.
   */
  constructor(release: (seq: Sequence) => void) {
    this.#release = release;
  }

  /** Live (unfinished) requests. */
  get size(): number {
    return this.#requests.size;
  }

  /**
   * Creates and records the sequence of `request`, numbered in arrival order.
   *
   * @throws {RangeError} when the id is already live, or the request can never run (see
   *   {@linkcode createSequence}).
   */
  add(request: NewRequest, limits: IntakeLimits, now: number): Sequence {
    if (this.#requests.has(request.requestId)) {
      throw new RangeError(`Cannot add request "${request.requestId}": the id is already in use`);
    }
    const seq = createSequence(request, limits, this.#order++, now);
    this.#requests.set(seq.requestId, seq);
    return seq;
  }

  /** The live request with this id. */
  get(requestId: string): Sequence | undefined {
    return this.#requests.get(requestId);
  }

  /** Finishes `seq`: releases it, records the reason, reports its id in the next output. */
  #finish(seq: Sequence, reason: FinishReason, stopReason: number | string | null): void {
    this.#release(seq);
    seq.status = "finished";
    seq.finishReason = reason;
    seq.stopReason = stopReason;
    this.#requests.delete(seq.requestId);
    this.#announced.delete(seq.requestId);
    (reason === "abort" ? this.#aborted : this.#finished).push(seq.requestId);
  }

  /** Finishes the live request `requestId`; false when there is none. */
  finishById(requestId: string, reason: FinishReason, stopReason: string | null): boolean {
    const seq = this.#requests.get(requestId);
    if (seq === undefined) return false;
    this.#finish(seq, reason, stopReason);
    return true;
  }

  /** The ids finished and aborted since the previous call (for a step's output). */
  takeEnded(): { finished: string[]; aborted: string[] } {
    const ended = { finished: this.#finished, aborted: this.#aborted };
    this.#finished = [];
    this.#aborted = [];
    return ended;
  }

  /**
   * A step's output: `parts`, the requests in `parts.scheduled` for the first time (listed
   * once per request, whatever preemptions follow) and the ids ended since the previous output.
   */
  seal(parts: Omit<SchedulerOutput, "newRequests" | "finished" | "aborted">): SchedulerOutput {
    const newRequests: NewRequestData[] = [];
    for (const r of parts.scheduled) {
      if (this.#announced.has(r.requestId)) continue;
      const seq = this.#requests.get(r.requestId);
      if (seq === undefined) {
        throw new RangeError(`Cannot schedule request "${r.requestId}": it is not live`);
      }
      this.#announced.add(r.requestId);
      newRequests.push({
        requestId: r.requestId,
        promptTokenIds: seq.promptTokenIds,
        params: seq.params,
      });
    }
    return { ...parts, newRequests, ...this.takeEnded() };
  }

  /**
   * Applies a step's sampled tokens (see `Scheduler.updateFromOutput`): runs the stop checks
   * and finishes the requests they end.
   *
   * @throws {RangeError} when steps are applied out of order or a sampled token is missing.
   */
  applyStep(
    output: SchedulerOutput,
    sampled: ReadonlyMap<string, number>,
    eosTokenIds: readonly number[],
    maxModelLen: number,
  ): RequestUpdate[] {
    if (output.step !== this.#lastUpdated + 1) {
      throw new RangeError(
        `Cannot update from step ${output.step}: step ${
          this.#lastUpdated + 1
        } is the next to update`,
      );
    }
    this.#lastUpdated = output.step;
    return applyStepTokens(
      output,
      sampled,
      (id) => this.#requests.get(id),
      (seq, reason, stopReason) => this.#finish(seq, reason, stopReason),
      eosTokenIds,
      maxModelLen,
    );
  }
}
