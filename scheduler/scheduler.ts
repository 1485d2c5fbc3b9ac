/**
 * The continuous (iteration-level) scheduler, vLLM v1 style. There are no prefill and decode
 * phases: every request has `numComputedTokens`, and each step hands out a token budget
 * (`maxNumBatchedTokens`):
 * 1. running requests, in admission order, get what they still need (1 token for a decode,
 *    the rest of the prompt, or a budget-sized chunk of it). When the pool runs out of blocks,
 *    the lowest-ranked running request is preempted (fcfs: latest arrival; priority: lowest
 *    priority, then latest arrival) until the request fits or is itself the one preempted.
 *    Preemption is by recompute (blocks freed, computed tokens forgotten, outputs kept, back at
 *    the front of the waiting queue) or, in mode "swap", by swapping out to host space when it
 *    fits (recompute otherwise).
 * 2. if nothing was preempted: swapped requests are swapped back in, in order;
 * 3. if nothing was preempted and none is left swapped: waiting requests are admitted in queue
 *    order (fcfs: arrival, preempted ones first; priority: priority then arrival) while the
 *    budget, `maxNumSeqs` and the pool allow, reusing their longest cached prefix. A prompt
 *    larger than the remaining budget is chunked (`enableChunkedPrefill`, default true) or
 *    waits for a step with room. With policy "priority", a waiting request that does not fit
 *    preempts running requests of strictly lower priority.
 *
 * A request's step ends on the last token of its sequence, so one token is sampled; the
 * sampled token is a placeholder until {@linkcode ContinuousScheduler.updateFromOutput}.
 *
 * Sampler rows: a step's sampler holds `maxSamplerRows` rows (default `maxNumSeqs`; the model
 * runner's `samplerRows`), one per sampled token and one per prompt position scored for
 * `params.promptLogprobs` (step_commit.ts `samplerRows`). A chunk of
 * such a prompt is cut to the rows left (`fitRows`), leaving one to each running request after
 * it, whether chunked prefill is enabled or not; such a request reads no cached prefix while
 * positions remain to be scored.
 *
 * @module
 */

import { BlockManager, NO_PREFIX_HIT, type PrefixHit } from "./block_manager.ts";
import { enqueueWaiting, pickVictim, type SchedulingPolicy } from "./policy.ts";
import { BaseScheduler } from "./base_scheduler.ts";
import type { Clock, HostReady, NewRequest, SchedulerStats } from "./scheduler_api.ts";
import type {
  ScheduledRequest,
  SchedulerOutput,
  SwappedInRequest,
  SwappedOutRequest,
} from "./scheduler_output.ts";
import type { Sequence } from "./sequence.ts";
import { commitTokens, fitRows, needsPromptRows, samplerRows, tokensToRun } from "./step_commit.ts";

/** Configuration of a {@linkcode ContinuousScheduler}. */
export interface ContinuousSchedulerConfig {
  /** Token budget of one step. */
  readonly maxNumBatchedTokens: number;
  /** Most requests in the running set. */
  readonly maxNumSeqs: number;
  /**
   * Sampler rows of one step: sampled tokens and scored prompt positions together (the model
   * runner's `samplerRows`); at least, and by default, `maxNumSeqs`.
   */
  readonly maxSamplerRows?: number;
  /** Most tokens (prompt + output) in one sequence. */
  readonly maxModelLen: number;
  /** Token slots per KV block. */
  readonly blockSize: number;
  /** KV blocks in the GPU pool. */
  readonly numGpuBlocks: number;
  /** Host swap space in blocks (`--swap-space` bytes / bytes per block); default 0. */
  readonly numSwapBlocks?: number;
  /** Split prompts across steps (default true); when false maxNumBatchedTokens >= maxModelLen. */
  readonly enableChunkedPrefill?: boolean;
  /** Reuse cached prefix blocks (default true). */
  readonly enablePrefixCaching?: boolean;
  /**
   * Fraction of the KV pool that must stay free after a NEW request is admitted (0..1, default
   * 0): headroom for the running requests to grow before anyone is preempted. Running requests,
   * resumed ones and the first request of an empty running set are not held back by it.
   */
  readonly watermark?: number;
  /** "fcfs" (default) or "priority". */
  readonly policy?: SchedulingPolicy;
  /** "recompute" (default) or "swap" (falls back to recompute when host space is short). */
  readonly preemptionMode?: "recompute" | "swap";
  /** The model's end-of-sequence token ids. */
  readonly eosTokenIds?: readonly number[];
  /**
   * Whether a grammar-constrained request's next mask is on the host (default: always): such a
   * request is not scheduled until it is (the engine computes masks off its thread).
   */
  readonly hostReady?: HostReady;
  /** Time source in ms (default Date.now). */
  readonly now?: Clock;
}

/** Mutable state of one `schedule()` call. */
interface StepState {
  /** Token budget left. */
  budget: number;
  /**
   * Sampler rows left (from maxSamplerRows, the runner's rows): each picked chunk takes
   * `samplerRows` of them (one per sampled token, one per prompt log-probability position).
   */
  rows: number;
  /** Requests scheduled so far -> tokens, in scheduling order. */
  picked: Map<Sequence, number>;
  /** Requests admitted, swapped in or preempted this step (not victims, not re-admitted). */
  touched: Set<Sequence>;
  /** Requests admitted from the waiting queue this step. */
  fresh: Set<Sequence>;
  preempted: string[];
  swappedOut: SwappedOutRequest[];
  swappedIn: SwappedInRequest[];
}

function positiveInt(what: string, v: number): number {
  if (!Number.isInteger(v) || v < 1) {
    throw new RangeError(`Cannot create scheduler: ${what} is ${v}, expected an integer >= 1`);
  }
  return v;
}

/** vLLM-v1-style continuous batching scheduler over a paged {@linkcode BlockManager}. */
export class ContinuousScheduler extends BaseScheduler {
  /** Always "continuous". */
  readonly kind = "continuous";
  /** The KV block bookkeeping (exposed for metrics and tests). */
  readonly blockManager: BlockManager;
  /** Token budget of one step. */
  readonly maxNumBatchedTokens: number;
  /** Most requests in the running set. */
  readonly maxNumSeqs: number;
  /** Sampler rows of one step (sampled tokens and scored prompt positions). */
  readonly maxSamplerRows: number;
  /** Most tokens in one sequence. */
  readonly maxModelLen: number;
  /** Whether prompts may be split across steps. */
  readonly enableChunkedPrefill: boolean;
  /** Blocks that must stay free after admitting a new request (from `watermark`). */
  readonly watermarkBlocks: number;
  /** Service order and preemption order. */
  readonly policy: SchedulingPolicy;
  /** How running requests are preempted when blocks run out. */
  readonly preemptionMode: "recompute" | "swap";
  /** The model's end-of-sequence token ids. */
  readonly eosTokenIds: readonly number[];

  readonly #now: Clock;
  readonly #hostReady: HostReady;
  #waiting: Sequence[] = [];
  #running: Sequence[] = [];
  #swapped: Sequence[] = [];
  #numPreemptions = 0;

  /** Throws RangeError on an invalid configuration. */
  constructor(config: ContinuousSchedulerConfig) {
    super();
    this.maxNumBatchedTokens = positiveInt("maxNumBatchedTokens", config.maxNumBatchedTokens);
    this.maxNumSeqs = positiveInt("maxNumSeqs", config.maxNumSeqs);
    this.maxSamplerRows = positiveInt("maxSamplerRows", config.maxSamplerRows ?? this.maxNumSeqs);
    if (this.maxSamplerRows < this.maxNumSeqs) {
      throw new RangeError(
        `Cannot create scheduler: maxSamplerRows (${this.maxSamplerRows}) must be >= maxNumSeqs (${this.maxNumSeqs})`,
      );
    }
    this.maxModelLen = positiveInt("maxModelLen", config.maxModelLen);
    this.enableChunkedPrefill = config.enableChunkedPrefill ?? true;
    if (!this.enableChunkedPrefill && this.maxNumBatchedTokens < this.maxModelLen) {
      throw new RangeError(
        `Cannot create scheduler: without chunked prefill maxNumBatchedTokens (${this.maxNumBatchedTokens}) must be >= maxModelLen (${this.maxModelLen})`,
      );
    }
    const watermark = config.watermark ?? 0;
    if (!(watermark >= 0 && watermark < 1)) {
      throw new RangeError(
        `Cannot create scheduler: watermark must be in [0, 1), got ${watermark}`,
      );
    }
    this.watermarkBlocks = Math.floor(watermark * config.numGpuBlocks);
    this.policy = config.policy ?? "fcfs";
    this.preemptionMode = config.preemptionMode ?? "recompute";
    this.eosTokenIds = config.eosTokenIds ?? [];
    this.#now = config.now ?? Date.now;
    this.#hostReady = config.hostReady ?? (() => true);
    this.blockManager = new BlockManager({
      numBlocks: positiveInt("numGpuBlocks", config.numGpuBlocks),
      blockSize: positiveInt("blockSize", config.blockSize),
      enablePrefixCaching: config.enablePrefixCaching ?? true,
      numSwapBlocks: config.numSwapBlocks ?? 0,
    });
  }

  /** Running requests in admission order (read-only view). */
  get running(): readonly Sequence[] {
    return this.#running;
  }

  /** Waiting requests in queue order (read-only view). */
  get waiting(): readonly Sequence[] {
    return this.#waiting;
  }

  /** Swapped-out requests in resume order (read-only view). */
  get swapped(): readonly Sequence[] {
    return this.#swapped;
  }

  addRequest(request: NewRequest): Sequence {
    const bm = this.blockManager;
    const seq = this.requests.add(
      request,
      { maxModelLen: this.maxModelLen, maxKvTokens: bm.numBlocks * bm.blockSize },
      this.#now(),
    );
    enqueueWaiting(this.policy, this.#waiting, seq, false);
    return seq;
  }

  schedule(): SchedulerOutput {
    const bm = this.blockManager;
    const step = this.nextStep();
    const st: StepState = {
      budget: this.maxNumBatchedTokens,
      rows: this.maxSamplerRows,
      picked: new Map(),
      touched: new Set(),
      fresh: new Set(),
      preempted: [],
      swappedOut: [],
      swappedIn: [],
    };

    // 1. Running requests, in order.
    let i = 0;
    while (i < this.#running.length && st.budget > 0) {
      const seq = this.#running[i]!;
      // One row stays for each running request after this one: a chunk of prompt
      // log-probabilities never starves them.
      const n = fitRows(
        seq,
        seq.numComputedTokens,
        Math.min(tokensToRun(seq, this.maxModelLen, this.#hostReady), st.budget),
        st.rows - (this.#running.length - i - 1),
      );
      if (n === 0) {
        i++;
        continue;
      }
      let ok = false;
      for (;;) {
        if (bm.allocateSlots(seq, n)) {
          ok = true;
          break;
        }
        const victim = pickVictim(this.policy, this.#running, st.touched)!;
        const at = this.#running.indexOf(victim);
        this.#preempt(st, victim);
        if (at < i) i--;
        if (victim === seq) break;
      }
      if (ok) {
        st.picked.set(seq, n);
        st.budget -= n;
        st.rows -= samplerRows(seq, seq.numComputedTokens, n);
        i++;
      }
    }

    // 2. Swapped requests, then 3. waiting requests, only when nothing was preempted.
    if (st.preempted.length === 0 && st.swappedOut.length === 0) {
      this.#swapIn(st);
      if (this.#swapped.length === 0) this.#admitWaiting(st);
    }

    // Commit: advance computed tokens, add placeholders, build the plain-data output.
    const scheduled: ScheduledRequest[] = [];
    let totalTokens = 0;
    let rows = 0;
    for (const [seq, n] of st.picked) {
      const r = commitTokens(seq, n, bm.blockSize, st.fresh.has(seq), step, rows);
      if (r.samplesToken) rows++;
      scheduled.push(r);
      bm.cacheFullBlocks(seq);
      totalTokens += n;
    }
    bm.endStep();
    return this.seal({
      step,
      scheduled,
      totalTokens,
      blockSize: bm.blockSize,
      preempted: st.preempted,
      swappedOut: st.swappedOut,
      swappedIn: st.swappedIn,
    });
  }

  stats(): SchedulerStats {
    const bm = this.blockManager;
    let used = 0;
    for (const s of this.#running) used += s.numComputedTokens;
    return {
      numRunning: this.#running.length,
      numWaiting: this.#waiting.length,
      numSwapped: this.#swapped.length,
      kvCacheUsage: bm.usage,
      kvTokensAllocated: bm.numUsedBlocks * bm.blockSize,
      kvTokensUsed: used,
      prefixCacheQueries: bm.prefixCacheQueries,
      prefixCacheHits: bm.prefixCacheHits,
      numPreemptions: this.#numPreemptions,
    };
  }

  /** Preempts `victim` (recompute, or swap when configured and host space allows). */
  #preempt(st: StepState, victim: Sequence): void {
    const bm = this.blockManager;
    this.#running.splice(this.#running.indexOf(victim), 1);
    const picked = st.picked.get(victim);
    if (picked !== undefined) {
      st.budget += picked;
      st.rows += samplerRows(victim, victim.numComputedTokens, picked);
    }
    st.picked.delete(victim);
    st.fresh.delete(victim);
    st.touched.add(victim);
    victim.numPreemptions++;
    this.#numPreemptions++;
    if (this.preemptionMode === "swap" && bm.canSwapOut(victim)) {
      st.swappedOut.push({ requestId: victim.requestId, copies: bm.swapOut(victim) });
      victim.status = "swapped";
      this.#swapped.push(victim);
    } else {
      bm.free(victim);
      victim.numComputedTokens = 0;
      victim.status = "preempted";
      enqueueWaiting(this.policy, this.#waiting, victim, true);
      st.preempted.push(victim.requestId);
    }
  }

  /** Swaps requests back in, in order, while they fit. */
  #swapIn(st: StepState): void {
    const bm = this.blockManager;
    while (this.#swapped.length > 0 && this.#running.length < this.maxNumSeqs && st.budget > 0) {
      const seq = this.#swapped[0]!;
      const n = fitRows(
        seq,
        seq.numComputedTokens,
        Math.min(tokensToRun(seq, this.maxModelLen, this.#hostReady), st.budget),
        st.rows,
      );
      if (!bm.canSwapIn(seq, n)) break;
      this.#swapped.shift();
      st.swappedIn.push({ requestId: seq.requestId, copies: bm.swapIn(seq) });
      bm.allocateOrThrow(seq, n);
      seq.status = "running";
      this.#running.push(seq);
      st.touched.add(seq);
      if (n > 0) {
        st.picked.set(seq, n);
        st.budget -= n;
        st.rows -= samplerRows(seq, seq.numComputedTokens, n);
      }
    }
  }

  /** Admits waiting requests in queue order while budget, maxNumSeqs and the pool allow. */
  #admitWaiting(st: StepState): void {
    const bm = this.blockManager;
    let idx = 0;
    while (idx < this.#waiting.length && st.budget > 0) {
      const seq = this.#waiting[idx]!;
      // Skip requests preempted this step and those whose ids are not all known yet.
      if (st.touched.has(seq) || seq.numPlaceholders > 0) {
        idx++;
        continue;
      }
      if (this.#running.length >= this.maxNumSeqs) {
        if (this.#preemptFor(st, seq)) continue;
        break;
      }
      // Prompt log-probabilities need the prompt computed, not read from the cache.
      const hit: PrefixHit = needsPromptRows(seq) ? NO_PREFIX_HIT : bm.findCachedPrefix(seq);
      const remaining = seq.numTokens - hit.numTokens;
      if (!this.enableChunkedPrefill && remaining > st.budget) break;
      const n = fitRows(seq, hit.numTokens, Math.min(remaining, st.budget), st.rows);
      if (n === 0) break;
      const blocksNeeded = Math.ceil((hit.numTokens + n) / bm.blockSize) - hit.blocks.length;
      if (
        this.#running.length > 0 && seq.numPreemptions === 0 &&
        bm.numFreeBlocks - blocksNeeded < this.watermarkBlocks
      ) {
        break; // keep headroom for the running requests to grow
      }
      if (!bm.allocateSlots(seq, n, hit)) {
        if (this.#preemptFor(st, seq)) continue;
        break;
      }
      this.#waiting.splice(idx, 1);
      seq.numComputedTokens = hit.numTokens;
      seq.numCachedTokens = hit.numTokens;
      seq.status = "running";
      this.#running.push(seq);
      st.touched.add(seq);
      st.fresh.add(seq);
      st.picked.set(seq, n);
      st.budget -= n;
      st.rows -= samplerRows(seq, hit.numTokens, n);
    }
  }

  /** Policy "priority": preempts a running request of strictly lower priority than `seq`. */
  #preemptFor(st: StepState, seq: Sequence): boolean {
    if (this.policy !== "priority") return false;
    const victim = pickVictim(this.policy, this.#running, st.touched);
    if (victim === undefined || victim.priority <= seq.priority) return false;
    this.#preempt(st, victim);
    return true;
  }

  /** A finishing request leaves its queue; its full blocks stay cached, the rest is freed. */
  protected releaseSequence(seq: Sequence): void {
    for (const q of [this.#running, this.#waiting, this.#swapped]) {
      const at = q.indexOf(seq);
      if (at >= 0) q.splice(at, 1);
    }
    this.blockManager.cacheFullBlocks(seq);
    this.blockManager.free(seq);
  }
}
