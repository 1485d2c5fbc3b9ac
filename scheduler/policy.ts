/**
 * Scheduling policies: the order requests are served in, where a request joins the waiting
 * queue, and which running request is preempted first.
 * - "fcfs": by arrival time (then admission order); new requests join the back of the waiting
 *   queue, preempted ones its front; the latest arrival is preempted first.
 * - "priority": by priority (lower number first, like vLLM), then as fcfs; the waiting queue
 *   is kept sorted; the lowest priority, latest arrival is preempted first.
 *
 * @module
 */

import type { Sequence } from "./sequence.ts";

/** A scheduling policy (`--scheduling-policy`). */
export type SchedulingPolicy = "fcfs" | "priority";

/** > 0 when `a` is served after `b`, < 0 before, 0 for the same request. */
export function serviceOrder(policy: SchedulingPolicy, a: Sequence, b: Sequence): number {
  if (policy === "priority" && a.priority !== b.priority) return a.priority - b.priority;
  if (a.arrivalTime !== b.arrivalTime) return a.arrivalTime - b.arrivalTime;
  return a.order - b.order;
}

/** Inserts `seq` into `waiting`: fcfs at the back (front when `preempted`); priority sorted. */
export function enqueueWaiting(
  policy: SchedulingPolicy,
  waiting: Sequence[],
  seq: Sequence,
  preempted: boolean,
): void {
  if (policy === "priority") {
    let lo = 0;
    let hi = waiting.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (serviceOrder(policy, waiting[mid]!, seq) <= 0) lo = mid + 1;
      else hi = mid;
    }
    waiting.splice(lo, 0, seq);
  } else if (preempted) {
    waiting.unshift(seq);
  } else {
    waiting.push(seq);
  }
}

/** The request of `running` to preempt first, ignoring those in `skip`; undefined if none. */
export function pickVictim(
  policy: SchedulingPolicy,
  running: readonly Sequence[],
  skip: ReadonlySet<Sequence>,
): Sequence | undefined {
  let victim: Sequence | undefined;
  for (const s of running) {
    if (skip.has(s)) continue;
    if (victim === undefined || serviceOrder(policy, s, victim) > 0) victim = s;
  }
  return victim;
}
