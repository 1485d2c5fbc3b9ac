/**
 * KV-cache utilisation of a run, from the scheduler's per-step gauges: token slots allocated
 * (paged: blocks in use x block size; static / dynamic: max_model_len reserved per batch
 * member) against token slots holding context of unfinished requests.
 *
 * @module
 */

/** The scheduler's KV gauges right after one `schedule()` call. */
export interface KvSample {
  /** Token slots allocated or reserved. */
  readonly allocated: number;
  /** Token slots holding context. */
  readonly used: number;
}

/** Utilisation figures of a run. */
export interface KvUtilization {
  /** The most token slots allocated at once. */
  readonly peakAllocated: number;
  /**
   * used / allocated at the step of peak allocation. Several steps can reach the peak (a static
   * batch keeps its reservation for its whole life): the best of them is taken, i.e. the most
   * the scheme ever uses of the largest allocation it makes.
   */
  readonly peakUtilization: number;
  /** Mean over steps with an allocation of used / allocated. */
  readonly meanUtilization: number;
}

/**
 * Computes {@linkcode KvUtilization} over per-step samples (steps with nothing allocated are
 * skipped). All zeros when no step allocated anything.
 *
 * @throws {RangeError} on a sample with used > allocated or a negative count.
 */
export function kvUtilization(samples: readonly KvSample[]): KvUtilization {
  let peak = 0;
  let best = 0;
  let sum = 0;
  let count = 0;
  for (const [i, s] of samples.entries()) {
    if (!(s.used >= 0) || !(s.allocated >= 0) || s.used > s.allocated) {
      throw new RangeError(
        `KV sample ${i} is inconsistent: ${s.used} slots used of ${s.allocated} allocated`,
      );
    }
    if (s.allocated === 0) continue;
    const u = s.used / s.allocated;
    sum += u;
    count++;
    if (s.allocated > peak) {
      peak = s.allocated;
      best = u;
    } else if (s.allocated === peak && u > best) {
      best = u;
    }
  }
  return {
    peakAllocated: peak,
    peakUtilization: best,
    meanUtilization: count === 0 ? 0 : sum / count,
  };
}
