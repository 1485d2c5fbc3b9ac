/**
 * Static batching, the baseline of the user's batching notes: a fixed batch size; a batch
 * starts only when `batchSize` requests are waiting (or after {@linkcode StaticScheduler.flush},
 * when no more arrivals are expected, with what is there) and runs until its longest request
 * finishes; requests arriving meanwhile wait for the next batch. Each batch member reserves a
 * contiguous KV region of maxModelLen tokens (slot i owns blocks [i*R, (i+1)*R), R =
 * ceil(maxModelLen / blockSize)) for the whole batch, so `stats()` reports reserved against
 * used token slots. No paging, no preemption.
 *
 * It speaks the same {@linkcode Scheduler} interface and plain-data {@linkcode SchedulerOutput}
 * as the continuous scheduler, so the same runner executes it. Steps still respect the token
 * budget (a runner limit), so a batch's prompts are prefilled in order, chunked if needed,
 * before its decodes.
 *
 * @module
 */

import { BaseScheduler } from "./base_scheduler.ts";
import type { Clock, HostReady, NewRequest, SchedulerStats } from "./scheduler_api.ts";
import type { ScheduledRequest, SchedulerOutput } from "./scheduler_output.ts";
import type { Sequence } from "./sequence.ts";
import { commitTokens, fitRows, samplerRows, tokensToRun } from "./step_commit.ts";

/** Configuration of a {@linkcode StaticScheduler}. */
export interface StaticSchedulerConfig {
  /** Requests per batch. */
  readonly batchSize: number;
  /** Most tokens in one sequence; also each member's KV reservation. */
  readonly maxModelLen: number;
  /** Token slots per KV block. */
  readonly blockSize: number;
  /** KV blocks in the pool (must hold batchSize reservations). */
  readonly numGpuBlocks: number;
  /** Token budget of one step (the runner's limit). */
  readonly maxNumBatchedTokens: number;
  /**
   * Sampler rows of one step: sampled tokens and scored prompt positions together (the model
   * runner's `samplerRows`); at least, and by default, `batchSize`.
   */
  readonly maxSamplerRows?: number;
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

/** Static batching over contiguous per-request KV reservations. */
export class StaticScheduler extends BaseScheduler {
  /** "static", or "dynamic" for the subclass. */
  readonly kind: "static" | "dynamic" = "static";
  /** Requests per batch. */
  readonly batchSize: number;
  /** Most tokens in one sequence (each member's reservation). */
  readonly maxModelLen: number;
  /** Token slots per KV block. */
  readonly blockSize: number;
  /** KV blocks in the pool. */
  readonly numGpuBlocks: number;
  /** Token budget of one step. */
  readonly maxNumBatchedTokens: number;
  /** Sampler rows of one step (sampled tokens and scored prompt positions). */
  readonly maxSamplerRows: number;
  /** The model's end-of-sequence token ids. */
  readonly eosTokenIds: readonly number[];
  /** Blocks reserved per batch member. */
  readonly blocksPerSlot: number;
  /** The clock. */
  protected readonly now: Clock;
  /** Queued requests, in arrival order. */
  protected readonly queue: Sequence[] = [];
  /** Set by flush(): start a partial batch; cleared when the queue empties. */
  protected flushed = false;

  readonly #hostReady: HostReady;
  #batch: Sequence[] = [];
  #batchesStarted = 0;

  /** Throws RangeError when the pool cannot hold batchSize reservations. */
  constructor(config: StaticSchedulerConfig) {
    super();
    for (
      const [k, v] of Object.entries({
        batchSize: config.batchSize,
        maxModelLen: config.maxModelLen,
        blockSize: config.blockSize,
        numGpuBlocks: config.numGpuBlocks,
        maxNumBatchedTokens: config.maxNumBatchedTokens,
        maxSamplerRows: config.maxSamplerRows ?? config.batchSize,
      })
    ) {
      if (!Number.isInteger(v) || v < 1) {
        throw new RangeError(`Cannot create scheduler: ${k} is ${v}, expected an integer >= 1`);
      }
    }
    this.batchSize = config.batchSize;
    this.maxModelLen = config.maxModelLen;
    this.blockSize = config.blockSize;
    this.numGpuBlocks = config.numGpuBlocks;
    this.maxNumBatchedTokens = config.maxNumBatchedTokens;
    this.maxSamplerRows = config.maxSamplerRows ?? config.batchSize;
    if (this.maxSamplerRows < this.batchSize) {
      throw new RangeError(
        `Cannot create scheduler: maxSamplerRows (${this.maxSamplerRows}) must be >= batchSize (${this.batchSize})`,
      );
    }
    this.eosTokenIds = config.eosTokenIds ?? [];
    this.now = config.now ?? Date.now;
    this.#hostReady = config.hostReady ?? (() => true);
    this.blocksPerSlot = Math.ceil(this.maxModelLen / this.blockSize);
    const need = this.batchSize * this.blocksPerSlot;
    if (need > this.numGpuBlocks) {
      throw new RangeError(
        `Cannot create scheduler: ${this.batchSize} reservations of ${this.maxModelLen} tokens need ${need} KV blocks, the pool has ${this.numGpuBlocks}`,
      );
    }
  }

  /** Members of the current batch, finished ones included (read-only view). */
  get batch(): readonly Sequence[] {
    return this.#batch;
  }

  /** Batches started so far. */
  get batchesStarted(): number {
    return this.#batchesStarted;
  }

  addRequest(request: NewRequest): Sequence {
    const seq = this.requests.add(
      request,
      { maxModelLen: this.maxModelLen, maxKvTokens: this.blocksPerSlot * this.blockSize },
      this.now(),
    );
    this.queue.push(seq);
    return seq;
  }

  /** Whether a new batch starts now (the queue is not empty). Static: full, or flushed. */
  protected shouldStartBatch(): boolean {
    return this.queue.length >= this.batchSize || this.flushed;
  }

  schedule(): SchedulerOutput {
    const step = this.nextStep();
    if (this.#batch.every((s) => s.isFinished)) this.#batch = [];
    const fresh = new Set<Sequence>();
    if (this.#batch.length === 0 && this.queue.length > 0 && this.shouldStartBatch()) {
      this.#batch = this.queue.splice(0, this.batchSize);
      if (this.queue.length === 0) this.flushed = false;
      this.#batchesStarted++;
      this.#batch.forEach((seq, slot) => {
        seq.blockTable = Array.from(
          { length: this.blocksPerSlot },
          (_, j) => slot * this.blocksPerSlot + j,
        );
        seq.status = "running";
        fresh.add(seq);
      });
    }
    let budget = this.maxNumBatchedTokens;
    const scheduled: ScheduledRequest[] = [];
    let rows = 0;
    // Sampler rows left (maxSamplerRows: the runner holds at least batchSize); a member's chunk
    // of prompt log-probabilities leaves one to each live member after it.
    let rowsLeft = this.maxSamplerRows;
    let after = this.#batch.filter((s) => !s.isFinished).length;
    for (const seq of this.#batch) {
      if (seq.isFinished) continue;
      after--;
      if (budget === 0) continue;
      const from = seq.numComputedTokens;
      const n = fitRows(
        seq,
        from,
        Math.min(tokensToRun(seq, this.maxModelLen, this.#hostReady), budget),
        rowsLeft - after,
      );
      if (n === 0) continue;
      rowsLeft -= samplerRows(seq, from, n);
      const isNew = from === 0;
      const r = commitTokens(seq, n, this.blockSize, isNew, step, rows);
      if (r.samplesToken) rows++;
      scheduled.push(r);
      budget -= n;
    }
    return this.seal({
      step,
      scheduled,
      totalTokens: this.maxNumBatchedTokens - budget,
      blockSize: this.blockSize,
      preempted: [],
      swappedOut: [],
      swappedIn: [],
    });
  }

  override flush(): void {
    if (this.queue.length > 0) this.flushed = true;
  }

  stats(): SchedulerStats {
    let used = 0;
    let live = 0;
    for (const s of this.#batch) {
      if (s.isFinished) continue;
      live++;
      used += s.numComputedTokens;
    }
    const reservedBlocks = this.#batch.length * this.blocksPerSlot;
    return {
      numRunning: live,
      numWaiting: this.queue.length,
      numSwapped: 0,
      kvCacheUsage: reservedBlocks / this.numGpuBlocks,
      kvTokensAllocated: reservedBlocks * this.blockSize,
      kvTokensUsed: used,
      prefixCacheQueries: 0,
      prefixCacheHits: 0,
      numPreemptions: 0,
    };
  }

  /** A finishing request leaves the queue; a batch member keeps its reservation to the end. */
  protected releaseSequence(seq: Sequence): void {
    const at = this.queue.indexOf(seq);
    if (at >= 0) this.queue.splice(at, 1);
  }
}
