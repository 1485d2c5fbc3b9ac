/**
 * The interface shared by the continuous scheduler and the static / dynamic batching
 * baselines, and the request intake checks they all apply.
 *
 * Engine loop (asynchronous scheduling, one step in flight):
 * ```ts
 * let previous: { output: SchedulerOutput; sampled: Promise<Map<string, number>> } | null = null;
 * while (running) {
 *   const output = scheduler.schedule();             // step n+1, before step n's tokens are known
 *   const sampled = runner.execute(output);          // submits; resolves when read back
 *   if (previous) scheduler.updateFromOutput(previous.output, await previous.sampled);
 *   previous = { output, sampled };
 * }
 * ```
 *
 * @module
 */

import { DEFAULT_SAMPLING_PARAMS, type SamplingParams } from "./sampling_params.ts";
import { Sequence } from "./sequence.ts";
import type { RequestUpdate, SchedulerOutput } from "./scheduler_output.ts";

/**
 * Whether a request's host-side input for its next step is ready (a grammar-constrained
 * request's next token mask); see `hostReady` in the scheduler configurations.
 */
export type HostReady = (requestId: string) => boolean;

/** A time source in milliseconds (injectable so tests are deterministic). */
export type Clock = () => number;

/** A request handed to a scheduler. */
export interface NewRequest {
  /** Unique among unfinished requests. */
  readonly requestId: string;
  /** Prompt token ids (at least one). */
  readonly promptTokenIds: readonly number[];
  /** Sampling parameters over the defaults. */
  readonly params?: Partial<SamplingParams>;
  /** Lower number = higher priority (policy "priority" only); default 0. */
  readonly priority?: number;
  /** Arrival time in ms; default: the scheduler's clock now. */
  readonly arrivalTime?: number;
  /**
   * vLLM's `cache_salt`: the request shares prefix-cache blocks only with requests of the same
   * salt (a non-empty string; absent: the unsalted cache), so one tenant cannot probe another's
   * prompts through cache timing.
   */
  readonly cacheSalt?: string;
}

/** Gauges and counters for metrics. */
export interface SchedulerStats {
  /** Requests holding KV and being stepped (vllm:num_requests_running). */
  readonly numRunning: number;
  /** Requests queued, including those preempted by recompute (vllm:num_requests_waiting). */
  readonly numWaiting: number;
  /** Requests swapped out to host memory. */
  readonly numSwapped: number;
  /** Fraction of the KV pool allocated or reserved, 0..1 (vllm:kv_cache_usage_perc). */
  readonly kvCacheUsage: number;
  /** KV token slots allocated (paged) or reserved (static: maxModelLen per batch member). */
  readonly kvTokensAllocated: number;
  /** KV token slots holding context of unfinished requests (a shared prefix counts per request). */
  readonly kvTokensUsed: number;
  /** Prompt tokens looked up in the prefix cache (vllm:prefix_cache_queries). */
  readonly prefixCacheQueries: number;
  /** Prompt tokens found in the prefix cache (vllm:prefix_cache_hits). */
  readonly prefixCacheHits: number;
  /** Preemptions so far (vllm:num_preemptions). */
  readonly numPreemptions: number;
}

/** What every scheduler offers the engine. */
export interface Scheduler {
  /** Which scheduler this is. */
  readonly kind: "continuous" | "static" | "dynamic";
  /** Queues a request; throws RangeError when it can never run (see {@linkcode createSequence}). */
  addRequest(request: NewRequest): Sequence;
  /** Decides the next step (possibly empty: `scheduled` has length 0). */
  schedule(): SchedulerOutput;
  /**
   * Applies a step's sampled token ids (request id -> token id, one per request that had
   * `samplesToken`), in step order. Runs the stop checks and finishes requests. Returns one
   * update per live request that got a token. Tokens of finished or aborted requests are
   * ignored. Throws RangeError when updates come out of order or a token is missing.
   */
  updateFromOutput(output: SchedulerOutput, sampled: ReadonlyMap<string, number>): RequestUpdate[];
  /** Finishes a request early (a stop string seen by the detokenizer). False if not live. */
  finishRequest(requestId: string, reason: "stop" | "length", stopReason?: string | null): boolean;
  /** Aborts a request at any time: frees its KV at once. False if not live. */
  abortRequest(requestId: string): boolean;
  /** The live (unfinished) request with this id. */
  getRequest(requestId: string): Sequence | undefined;
  /** Whether any request is unfinished. */
  hasUnfinishedRequests(): boolean;
  /** No more arrivals are expected for now: batching baselines start partial batches. */
  flush(): void;
  /** Clock time at which `schedule()` may start work although nothing else changed, or null. */
  wakeTime(): number | null;
  /** Current gauges and counters. */
  stats(): SchedulerStats;
}

/** Limits a request is checked against at intake. */
export interface IntakeLimits {
  readonly maxModelLen: number;
  /** KV token capacity one request may use at most (pool size, or the static reservation). */
  readonly maxKvTokens: number;
}

/**
 * A new {@linkcode Sequence} for `request`, after the intake checks: an id, at least one
 * integer token id >= 0, prompt + max_tokens <= maxModelLen (max_tokens defaults to what
 * maxModelLen leaves), and the request's KV alone fits `maxKvTokens` (the last sampled token
 * needs no KV). Throws RangeError / TypeError naming the request.
 */
export function createSequence(
  request: NewRequest,
  limits: IntakeLimits,
  order: number,
  now: number,
): Sequence {
  const id = request.requestId;
  const prompt = request.promptTokenIds;
  if (typeof id !== "string" || id.length === 0) {
    throw new TypeError("Cannot add request: requestId must be a non-empty string");
  }
  if (prompt.length === 0) throw new RangeError(`Cannot add request "${id}": the prompt is empty`);
  for (const t of prompt) {
    if (!Number.isInteger(t) || t < 0) {
      throw new TypeError(`Cannot add request "${id}": token id ${t} is not an integer >= 0`);
    }
  }
  const params: SamplingParams = { ...DEFAULT_SAMPLING_PARAMS, ...request.params };
  const maxTokens = params.maxTokens ?? limits.maxModelLen - prompt.length;
  if (prompt.length + maxTokens > limits.maxModelLen) {
    throw new RangeError(
      `Cannot add request "${id}": prompt (${prompt.length} tokens) + max_tokens (${maxTokens}) exceeds max_model_len ${limits.maxModelLen}`,
    );
  }
  if (!Number.isInteger(maxTokens) || maxTokens < 1) {
    throw new RangeError(`Cannot add request "${id}": max_tokens is ${maxTokens}, expected >= 1`);
  }
  const salt = request.cacheSalt;
  if (salt !== undefined && (typeof salt !== "string" || salt.length === 0)) {
    throw new TypeError(`Cannot add request "${id}": cacheSalt must be a non-empty string`);
  }
  const kvTokens = prompt.length + maxTokens - 1;
  if (kvTokens > limits.maxKvTokens) {
    throw new RangeError(
      `Cannot add request "${id}": it needs KV for ${kvTokens} tokens, the cache holds ${limits.maxKvTokens}`,
    );
  }
  return new Sequence(
    id,
    [...prompt],
    params,
    maxTokens,
    request.priority ?? 0,
    request.arrivalTime ?? now,
    order,
    salt ?? null,
  );
}
