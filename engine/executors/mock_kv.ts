/**
 * The simulated paged KV cache of the {@linkcode MockExecutor} (engine/executors/mock_executor.ts)
 * and its checks of the scheduler's contract, for scheduler tests.
 *
 * The cache stores, per slot, the token id and position written there, in a GPU pool and a host
 * swap space. A {@linkcode SAMPLED_TOKEN} marker is resolved like the GPU engine does it: from the
 * previous executed step's sampler rows (`sampledFrom`), which must be the request's latest token.
 * With `truth` given, every step checks the scheduler's contract: each fed token equals the true
 * token at its position, slot mappings agree with block tables, and after the step's writes every
 * position of every scheduled request's context is found in its block table's slots. Block tables
 * that share or reuse blocks wrongly, lost swaps and prefix-cache hits on the wrong content all
 * fail these checks. The request lifecycle is checked in every step: a scheduled request must
 * have been listed once in some step's `newRequests` and not ended since.
 *
 * @module
 */

import {
  SAMPLED_TOKEN,
  type ScheduledRequest,
  type SchedulerOutput,
} from "../../scheduler/scheduler_output.ts";

/** The simulated KV cache of a {@linkcode MockExecutor} (its `kv` option). */
export interface MockKvOptions {
  /** KV blocks in the simulated GPU pool. */
  readonly numBlocks: number;
  /** Token slots per block. */
  readonly blockSize: number;
  /** Host swap slots (default 0). */
  readonly numSwapBlocks?: number;
  /** The true token at `position` of a request (prompt or generated); enables the checks. */
  readonly truth?: (requestId: string, position: number) => number;
}

/**
 * A paged KV cache on the CPU that executes a step's swaps and KV writes and checks the
 * scheduler's contract (see the module documentation). Methods throw Error when a check fails.
 */
export class MockKvCache {
  readonly #opts: MockKvOptions;
  readonly #kvToken: Int32Array;
  readonly #kvPos: Int32Array;
  readonly #hostToken: Int32Array;
  readonly #hostPos: Int32Array;
  readonly #last = new Map<string, number>();
  /** Requests registered through `newRequests` and not ended since. */
  readonly #live = new Set<string>();
  #prevStep = -1;
  #prevRows: number[] = [];

  /** An empty cache (every slot holds token -1). */
  constructor(options: MockKvOptions) {
    this.#opts = options;
    const slots = options.numBlocks * options.blockSize;
    const hostSlots = (options.numSwapBlocks ?? 0) * options.blockSize;
    this.#kvToken = new Int32Array(slots).fill(-1);
    this.#kvPos = new Int32Array(slots).fill(-1);
    this.#hostToken = new Int32Array(hostSlots).fill(-1);
    this.#hostPos = new Int32Array(hostSlots).fill(-1);
  }

  /**
   * The first half of a step, before sampling: checks the request lifecycle (ended ids dropped,
   * then new requests registered, and every scheduled request registered and live), runs the
   * swap-out copies, the swap-in copies and the KV writes of `output`, with the checks.
   */
  write(output: SchedulerOutput): void {
    this.#lifecycle(output);
    for (const s of output.swappedOut) {
      for (const c of s.copies) {
        this.#copy(
          this.#kvToken,
          this.#kvPos,
          c.gpuBlock,
          this.#hostToken,
          this.#hostPos,
          c.hostSlot,
        );
      }
    }
    for (const s of output.swappedIn) {
      for (const c of s.copies) {
        this.#copy(
          this.#hostToken,
          this.#hostPos,
          c.hostSlot,
          this.#kvToken,
          this.#kvPos,
          c.gpuBlock,
        );
      }
    }
    for (const r of output.scheduled) this.#writeTokens(output, r);
    if (this.#opts.truth !== undefined) {
      for (const r of output.scheduled) this.#checkContext(output, r, this.#opts.truth);
    }
  }

  /** The lifecycle the executor learns from `output` alone (see scheduler_output.ts). */
  #lifecycle(output: SchedulerOutput): void {
    for (const id of [...output.finished, ...output.aborted]) {
      this.#last.delete(id);
      this.#live.delete(id);
    }
    for (const n of output.newRequests) {
      if (this.#live.has(n.requestId)) this.#fail(output, n.requestId, "listed as new while live");
      if (!output.scheduled.some((r) => r.requestId === n.requestId)) {
        this.#fail(output, n.requestId, "listed as new but not scheduled");
      }
      this.#live.add(n.requestId);
    }
    for (const r of output.scheduled) {
      if (!this.#live.has(r.requestId)) {
        this.#fail(output, r.requestId, "scheduled but never listed in newRequests");
      }
    }
  }

  /** Writes the fed tokens of `r` to their slots, resolving a sampled-token marker. */
  #writeTokens(output: SchedulerOutput, r: ScheduledRequest): void {
    const bs = this.#opts.blockSize;
    const truth = this.#opts.truth;
    for (let k = 0; k < r.numTokens; k++) {
      const p = r.positionStart + k;
      let t = r.tokenIds[k]!;
      if (t === SAMPLED_TOKEN) t = this.#resolveMarker(output, r, k);
      if (truth !== undefined && t !== truth(r.requestId, p)) {
        this.#fail(
          output,
          r.requestId,
          `fed token ${t} at ${p}, expected ${truth(r.requestId, p)}`,
        );
      }
      const slot = r.slotMapping[k]!;
      const block = r.blockTable[Math.floor(p / bs)];
      if (block === undefined || slot !== block * bs + (p % bs)) {
        this.#fail(
          output,
          r.requestId,
          `slot ${slot} for position ${p} disagrees with the block table`,
        );
      }
      this.#kvToken[slot] = t;
      this.#kvPos[slot] = p;
    }
  }

  /** The token a {@linkcode SAMPLED_TOKEN} marker at fed index `k` of `r` stands for. */
  #resolveMarker(output: SchedulerOutput, r: ScheduledRequest, k: number): number {
    const p = r.positionStart + k;
    const from = r.sampledFrom;
    if (k !== r.numTokens - 1 || from === null) {
      this.#fail(output, r.requestId, `marker at ${p} is not the last fed token or has no source`);
    }
    if (from.step !== this.#prevStep || from.row >= this.#prevRows.length) {
      this.#fail(output, r.requestId, `marker refers to step ${from.step} row ${from.row}`);
    }
    const t = this.#prevRows[from.row]!;
    if (t !== this.#last.get(r.requestId)) {
      this.#fail(output, r.requestId, `row ${from.row} of step ${from.step} is not its token`);
    }
    return t;
  }

  /** After the writes: every position of `r`'s context is in its block table's slots. */
  #checkContext(
    output: SchedulerOutput,
    r: ScheduledRequest,
    truth: (requestId: string, position: number) => number,
  ): void {
    const bs = this.#opts.blockSize;
    const end = r.positionStart + r.numTokens;
    for (let q = 0; q < end; q++) {
      const block = r.blockTable[Math.floor(q / bs)];
      const slot = block === undefined ? -1 : block * bs + (q % bs);
      const want = truth(r.requestId, q);
      if (slot < 0 || this.#kvToken[slot] !== want || this.#kvPos[slot] !== q) {
        this.#fail(
          output,
          r.requestId,
          `KV at position ${q} (slot ${slot}) holds token ${this.#kvToken[slot]} @ ${
            this.#kvPos[slot]
          }, expected ${want}`,
        );
      }
    }
  }

  /**
   * The second half of a step: records the tokens sampled for `output` (request id -> token, for
   * every scheduled request with `samplesToken`) as its sampler rows, which must be numbered in
   * scheduling order, for the next step's {@linkcode SAMPLED_TOKEN} markers.
   */
  sampled(output: SchedulerOutput, tokens: ReadonlyMap<string, number>): void {
    const rows: number[] = [];
    for (const r of output.scheduled) {
      if (!r.samplesToken) continue;
      if (r.sampleRow !== rows.length) {
        this.#fail(output, r.requestId, `sample row ${r.sampleRow}, expected ${rows.length}`);
      }
      const t = tokens.get(r.requestId)!;
      this.#last.set(r.requestId, t);
      rows.push(t);
    }
    this.#prevStep = output.step;
    this.#prevRows = rows;
  }

  #copy(
    fromToken: Int32Array,
    fromPos: Int32Array,
    fromBlock: number,
    toToken: Int32Array,
    toPos: Int32Array,
    toBlock: number,
  ): void {
    const bs = this.#opts.blockSize;
    toToken.set(fromToken.subarray(fromBlock * bs, (fromBlock + 1) * bs), toBlock * bs);
    toPos.set(fromPos.subarray(fromBlock * bs, (fromBlock + 1) * bs), toBlock * bs);
  }

  #fail(output: SchedulerOutput, requestId: string, what: string): never {
    throw new Error(`Mock executor, step ${output.step}, request "${requestId}": ${what}`);
  }
}
