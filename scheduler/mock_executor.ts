/**
 * A mock model runner for scheduler tests and for mock-model experiments (the `/batch/test`
 * style benchmarks): it executes a {@linkcode SchedulerOutput} against a simulated paged KV
 * cache on the CPU and samples deterministic tokens, `tokenAt(requestId, position)`.
 *
 * The simulated cache stores, per slot, the token id and position written there. A
 * {@linkcode SAMPLED_TOKEN} marker is resolved like the GPU engine does it: from the previous
 * executed step's sampler rows (`sampledFrom`), which must be the request's latest token. With
 * `truth` given, every step checks the scheduler's contract: each fed token equals the
 * true token at its position, slot mappings agree with block tables, and after the step's
 * writes every position of every scheduled request's context is found in its block table's
 * slots. Block tables that share or reuse blocks wrongly, lost swaps and prefix-cache hits on
 * the wrong content all fail these checks.
 *
 * @module
 */

import { type RequestUpdate, SAMPLED_TOKEN, type SchedulerOutput } from "./scheduler_output.ts";

/**
 * A deterministic "model": a token id in [first, first + count) hashed from the request id and
 * the position of the token being sampled.
 */
export function mockTokenAt(requestId: string, position: number, first = 100, count = 50): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < requestId.length; i++) h = Math.imul(h ^ requestId.charCodeAt(i), 0x01000193);
  h = Math.imul(h ^ position, 0x01000193);
  h = Math.imul(h ^ (h >>> 13), 0x5bd1e995);
  return first + ((h ^ (h >>> 15)) >>> 0) % count;
}

/** Construction options of a {@linkcode MockExecutor}. */
export interface MockExecutorOptions {
  /** KV blocks in the simulated GPU pool. */
  readonly numBlocks: number;
  /** Token slots per block. */
  readonly blockSize: number;
  /** Host swap slots (default 0). */
  readonly numSwapBlocks?: number;
  /** The token the "model" samples for `requestId` at `position` (the new token's position). */
  readonly tokenAt: (requestId: string, position: number) => number;
  /** The true token at `position` of a request (prompt or generated); enables the checks. */
  readonly truth?: (requestId: string, position: number) => number;
}

/** Executes scheduler outputs on a simulated KV cache (see module doc). */
export class MockExecutor {
  readonly #opts: MockExecutorOptions;
  readonly #kvToken: Int32Array;
  readonly #kvPos: Int32Array;
  readonly #hostToken: Int32Array;
  readonly #hostPos: Int32Array;
  readonly #last = new Map<string, number>();
  #prevStep = -1;
  #prevRows: number[] = [];
  /** Steps executed. */
  steps = 0;
  /** Tokens computed (sum of numTokens over steps). */
  tokens = 0;

  /** An empty simulated cache (every slot holds token -1). */
  constructor(options: MockExecutorOptions) {
    this.#opts = options;
    const slots = options.numBlocks * options.blockSize;
    const hostSlots = (options.numSwapBlocks ?? 0) * options.blockSize;
    this.#kvToken = new Int32Array(slots).fill(-1);
    this.#kvPos = new Int32Array(slots).fill(-1);
    this.#hostToken = new Int32Array(hostSlots).fill(-1);
    this.#hostPos = new Int32Array(hostSlots).fill(-1);
  }

  /**
   * Runs one step: swap-out copies, swap-in copies, KV writes, checks, sampling. Returns the
   * sampled token per request with `samplesToken`. Throws Error when a check fails.
   */
  execute(output: SchedulerOutput): Map<string, number> {
    const bs = this.#opts.blockSize;
    const truth = this.#opts.truth;
    for (const id of [...output.finished, ...output.aborted]) this.#last.delete(id);
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
    for (const r of output.scheduled) {
      for (let k = 0; k < r.numTokens; k++) {
        const p = r.positionStart + k;
        let t = r.tokenIds[k]!;
        if (t === SAMPLED_TOKEN) {
          const from = r.sampledFrom;
          if (k !== r.numTokens - 1 || from === null) {
            this.#fail(
              output,
              r.requestId,
              `marker at ${p} is not the last fed token or has no source`,
            );
          }
          if (from.step !== this.#prevStep || from.row >= this.#prevRows.length) {
            this.#fail(output, r.requestId, `marker refers to step ${from.step} row ${from.row}`);
          }
          t = this.#prevRows[from.row]!;
          if (t !== this.#last.get(r.requestId)) {
            this.#fail(
              output,
              r.requestId,
              `row ${from.row} of step ${from.step} is not its token`,
            );
          }
        }
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
    if (truth !== undefined) {
      for (const r of output.scheduled) {
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
    }
    const sampled = new Map<string, number>();
    const rows: number[] = [];
    for (const r of output.scheduled) {
      if (!r.samplesToken) continue;
      if (r.sampleRow !== rows.length) {
        this.#fail(output, r.requestId, `sample row ${r.sampleRow}, expected ${rows.length}`);
      }
      const t = this.#opts.tokenAt(r.requestId, r.positionStart + r.numTokens);
      this.#last.set(r.requestId, t);
      sampled.set(r.requestId, t);
      rows.push(t);
    }
    this.#prevStep = output.step;
    this.#prevRows = rows;
    this.steps++;
    this.tokens += output.totalTokens;
    return sampled;
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

/** Options of {@linkcode driveToCompletion}. */
export interface DriveOptions {
  /** Schedule step n+1 before applying step n's tokens (default true), like the engine. */
  readonly async?: boolean;
  /** Throw after this many steps (default 1e6): a scheduler that stalls fails loudly. */
  readonly maxSteps?: number;
  /** Called with each output before it executes. */
  readonly onStep?: (output: SchedulerOutput) => void;
}

/** The scheduler side `driveToCompletion` needs (any {@linkcode Scheduler} has it). */
export interface Drivable {
  schedule(): SchedulerOutput;
  updateFromOutput(output: SchedulerOutput, sampled: ReadonlyMap<string, number>): RequestUpdate[];
  hasUnfinishedRequests(): boolean;
}

/**
 * Runs `scheduler` with `executor` until no request is unfinished; returns every update in
 * order. Throws RangeError after `maxSteps` steps.
 */
export function driveToCompletion(
  scheduler: Drivable,
  executor: MockExecutor,
  options: DriveOptions = {},
): RequestUpdate[] {
  const { async = true, maxSteps = 1_000_000, onStep } = options;
  const updates: RequestUpdate[] = [];
  let pending: { output: SchedulerOutput; sampled: Map<string, number> } | null = null;
  for (let steps = 0; scheduler.hasUnfinishedRequests() || pending !== null; steps++) {
    if (steps >= maxSteps) {
      throw new RangeError(
        `Cannot drive scheduler: requests still unfinished after ${steps} steps`,
      );
    }
    const output = scheduler.schedule();
    onStep?.(output);
    const sampled = executor.execute(output);
    if (!async) {
      updates.push(...scheduler.updateFromOutput(output, sampled));
      continue;
    }
    if (pending !== null) {
      updates.push(...scheduler.updateFromOutput(pending.output, pending.sampled));
    }
    pending = { output, sampled };
    if (!scheduler.hasUnfinishedRequests()) {
      updates.push(...scheduler.updateFromOutput(output, sampled));
      pending = null;
    }
  }
  return updates;
}
