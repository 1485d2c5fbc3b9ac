/**
 * One request (a single sequence) as the schedulers see it: its tokens, how many of them have
 * their KV computed, its KV block table and its place in the request life cycle.
 *
 * Asynchronous scheduling: the engine schedules step n+1 before step n's sampled tokens reach
 * the host (the GPU feeds each sampled token straight into the next step). A sequence therefore
 * has *placeholder* tokens: sampled on the GPU, counted in {@linkcode Sequence.numTokens} and
 * possibly already computed, but whose ids are not known on the host yet. They are resolved in
 * order by {@linkcode Sequence.appendToken} when the step's results are read back. At most the
 * last token fed in a step is a placeholder, and it is always the token sampled most recently
 * for the request.
 *
 * @module
 */

import type { SamplingParams } from "./sampling_params.ts";

/** Where a request is in its life cycle. */
export type RequestStatus =
  /** Queued, not yet admitted to the running set. */
  | "waiting"
  /** In the running set: holds KV blocks and is scheduled every step it has tokens to run. */
  | "running"
  /** Preempted by recompute: KV freed, back in the waiting queue, outputs kept. */
  | "preempted"
  /** Preempted by swap: KV blocks copied to host swap space. */
  | "swapped"
  /** Done (see {@linkcode Sequence.finishReason}). */
  | "finished";

/** Why a request finished, with OpenAI's `finish_reason` values. */
export type FinishReason =
  /** EOS, a stop token id, or a stop string. */
  | "stop"
  /** max_tokens or the model's context length reached. */
  | "length"
  /** Aborted by the client (disconnect) or the server. */
  | "abort";

/** A request's scheduling state. Fields marked "owned by" are written only by that module. */
export class Sequence {
  /** Caller-chosen unique id. */
  readonly requestId: string;
  /** The prompt's token ids. */
  readonly promptTokenIds: readonly number[];
  /** Sampling parameters (the scheduler reads maxTokens, minTokens, stopTokenIds, ignoreEos). */
  readonly params: SamplingParams;
  /** Resolved maximum number of output tokens (params.maxTokens, or what maxModelLen leaves). */
  readonly maxTokens: number;
  /** Scheduling priority for policy "priority": lower number = served first (like vLLM). */
  readonly priority: number;
  /** Arrival time in the scheduler clock's unit (ms). */
  readonly arrivalTime: number;
  /** Monotonic admission order (tie-breaker after arrivalTime). */
  readonly order: number;
  /** The prefix-cache salt (`NewRequest.cacheSalt`), or null. */
  readonly cacheSalt: string | null;

  /** Life cycle state (owned by the scheduler). */
  status: RequestStatus = "waiting";
  /** Set when status becomes "finished". */
  finishReason: FinishReason | null = null;
  /** The stop token id or stop string that ended the request, if any. */
  stopReason: number | string | null = null;
  /**
   * Tokens whose KV is computed or scheduled for computation in a step already handed out
   * (owned by the scheduler; advanced at schedule time, reset to 0 by recompute preemption).
   */
  numComputedTokens = 0;
  /** Prefix-cache hit, in tokens, at the latest admission (owned by the scheduler). */
  numCachedTokens = 0;
  /** Times this request was preempted. */
  numPreemptions = 0;
  /** Physical KV block ids, block i holds positions [i*blockSize, (i+1)*blockSize) (owned by BlockManager). */
  blockTable: number[] = [];
  /** Host swap slots holding this request's blocks while swapped, in block order (owned by BlockManager). */
  hostSlots: number[] = [];
  /** Chained hashes of the full blocks whose token ids are all known (owned by BlockManager). */
  readonly blockHashes: string[] = [];
  /** Step and sampler row of the latest token sampled for this request (owned by the scheduler). */
  lastSampledAt: { readonly step: number; readonly row: number } | null = null;
  /** Leading blocks of blockTable already offered to the prefix cache (owned by BlockManager). */
  numCachedBlocks = 0;
  /**
   * With `params.promptLogprobs`: prompt positions `[0, n)` whose log-probability rows a step
   * has already been given (owned by the scheduler; kept across preemptions, so a recompute
   * does not compute them again).
   */
  promptLogprobsUntil = 0;

  readonly #tokens: number[];
  readonly #outputs: number[] = [];
  #placeholders = 0;

  constructor(
    requestId: string,
    promptTokenIds: readonly number[],
    params: SamplingParams,
    maxTokens: number,
    priority: number,
    arrivalTime: number,
    order: number,
    cacheSalt: string | null = null,
  ) {
    this.requestId = requestId;
    this.promptTokenIds = promptTokenIds;
    this.params = params;
    this.maxTokens = maxTokens;
    this.priority = priority;
    this.arrivalTime = arrivalTime;
    this.order = order;
    this.cacheSalt = cacheSalt;
    this.#tokens = [...promptTokenIds];
  }

  /** Known token ids: prompt followed by the outputs known on the host. */
  get tokenIds(): readonly number[] {
    return this.#tokens;
  }

  /** Output token ids known on the host. */
  get outputTokenIds(): readonly number[] {
    return this.#outputs;
  }

  /** Sampled tokens whose ids have not reached the host yet. */
  get numPlaceholders(): number {
    return this.#placeholders;
  }

  /** Logical length: prompt + known outputs + placeholders. */
  get numTokens(): number {
    return this.#tokens.length + this.#placeholders;
  }

  /** Prompt + known outputs. */
  get numKnownTokens(): number {
    return this.#tokens.length;
  }

  /** Outputs generated so far, including placeholders. */
  get numOutputTokens(): number {
    return this.#outputs.length + this.#placeholders;
  }

  /** True once status is "finished". */
  get isFinished(): boolean {
    return this.status === "finished";
  }

  /** Counts one token sampled by a step whose result is not read back yet. */
  addPlaceholder(): void {
    this.#placeholders++;
  }

  /** Appends a sampled token id, resolving the oldest placeholder if there is one. */
  appendToken(tokenId: number): void {
    if (this.#placeholders > 0) this.#placeholders--;
    this.#tokens.push(tokenId);
    this.#outputs.push(tokenId);
  }

  /** Token id at `position`, or -1 where it is a placeholder (id not known on the host). */
  tokenAt(position: number): number {
    return this.#tokens[position] ?? -1;
  }
}
