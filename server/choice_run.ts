/**
 * The engine requests behind one response: {@linkcode ChoiceRun} drives one choice's engine
 * request (its increments, accumulated text, logprobs, timings and metrics), and
 * {@linkcode launch} fans a {@linkcode Prepared} request out into one run per choice.
 *
 * @module
 */

import type {
  EngineClient,
  PromptLogprob,
  RequestOutput,
  TokenLogprob,
} from "../engine/engine_api.ts";
import { kernelSeed, type SamplingParams } from "../scheduler/sampling_params.ts";
import type { ServerMetrics } from "./metrics.ts";
import type { Prepared } from "./prepare.ts";

/** The `usage` field of a response. */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/** One engine request (one choice) of a response, with its timings and accumulated output. */
export class ChoiceRun {
  /** The choice's index in the response. */
  readonly index: number;
  /** The engine request id. */
  readonly requestId: string;
  /** Prompt length in tokens. */
  readonly promptTokens: number;
  /** Whether the response reports logprobs. */
  readonly logprobs: boolean;
  #iterator: AsyncIterator<RequestOutput> | null = null;
  #first: IteratorResult<RequestOutput> | null = null;
  readonly #arrival: number;
  #last = 0;
  #ttft: number | null = null;
  /** The engine's queue time (seconds), once reported. */
  #queueTime: number | null = null;
  readonly #gaps: number[] = [];
  /** Text generated so far. */
  text = "";
  /** Tokens generated so far. */
  outputTokens = 0;
  /** Prompt tokens the engine found in its prefix cache (known from the first increment). */
  cachedTokens = 0;
  /** Ids of the tokens generated so far (`return_token_ids`). */
  readonly tokenIds: number[] = [];
  /** Logprobs of the tokens generated so far (when requested). */
  readonly tokenLogprobs: TokenLogprob[] = [];
  /**
   * The prompt tokens' log-probabilities (one per prompt token, null first), once the engine
   * sent them with the first increment; null before, or when the request asked for none.
   */
  promptLogprobs: readonly (PromptLogprob | null)[] | null = null;
  /** Why the request finished; null while it runs. */
  finishReason: "stop" | "length" | "abort" | null = null;
  /** The stop string or token id that ended it, if any. */
  stopReason: number | string | null = null;
  #observed = false;
  #started = false;
  #ended = false;
  /** Echo without generation: the generated tokens are counted, never shown (see constructor). */
  readonly #hideOutput: boolean;

  /**
   * @param hideOutput `echo` with `max_tokens` 0 (Prepared.echoOnly): increments reach the
   *   response without their generated text, ids and logprobs (still counted in the usage and
   *   timed in the metrics).
   */
  constructor(
    index: number,
    requestId: string,
    promptTokens: number,
    logprobs: boolean,
    arrival: number,
    hideOutput = false,
  ) {
    this.index = index;
    this.requestId = requestId;
    this.promptTokens = promptTokens;
    this.logprobs = logprobs;
    this.#arrival = arrival;
    this.#hideOutput = hideOutput;
  }

  /**
   * Starts the engine request (may throw the engine's admission errors); `cacheSalt` (vLLM's
   * `cache_salt`, null: none) confines its prefix-cache sharing to requests of the same salt.
   */
  start(
    engine: EngineClient,
    params: SamplingParams,
    ids: readonly number[],
    priority: number,
    signal: AbortSignal,
    cacheSalt: string | null = null,
  ): void {
    const stream = engine.generate(
      {
        requestId: this.requestId,
        promptTokenIds: ids,
        params,
        priority,
        ...(cacheSalt === null ? {} : { cacheSalt }),
      },
      signal,
    );
    this.#iterator = stream[Symbol.asyncIterator]();
    this.#started = true;
  }

  /** Waits for the first result so admission errors surface before the response starts. */
  async prime(): Promise<void> {
    this.#first = await this.#pull();
  }

  async #pull(): Promise<IteratorResult<RequestOutput>> {
    if (this.#iterator === null) return { done: true, value: undefined };
    const r = await this.#iterator.next();
    if (!r.done) {
      if (r.value.tokenIds.length > 0) {
        // Timings per increment that carries tokens (one gap per increment, not per token).
        const now = performance.now();
        if (this.#ttft === null) this.#ttft = (now - this.#arrival) / 1000;
        else this.#gaps.push((now - this.#last) / 1000);
        this.#last = now;
      }
      const out = this.#hideOutput
        ? { ...r.value, text: "", tokenIds: [], logprobs: r.value.logprobs === null ? null : [] }
        : r.value;
      r.value = out;
      if (out.queueTime !== undefined) this.#queueTime = out.queueTime;
      this.text += out.text;
      this.outputTokens = out.numOutputTokens;
      this.cachedTokens = out.numCachedTokens;
      this.tokenIds.push(...out.tokenIds);
      if (out.logprobs !== null) this.tokenLogprobs.push(...out.logprobs);
      if (out.promptLogprobs !== undefined) this.promptLogprobs = out.promptLogprobs;
      if (out.finishReason !== null) {
        this.finishReason = out.finishReason;
        this.stopReason = out.stopReason;
      }
    }
    return r;
  }

  /** The next increment, or null when the request is over. */
  async next(): Promise<RequestOutput | null> {
    if (this.#ended) return null;
    let r: IteratorResult<RequestOutput>;
    if (this.#first !== null) {
      r = this.#first;
      this.#first = null;
    } else {
      r = await this.#pull();
    }
    if (r.done || r.value.finishReason !== null) this.#ended = true;
    return r.done ? null : r.value;
  }

  /** Ends the iteration early (aborts the engine request). */
  async cancel(engine: EngineClient): Promise<void> {
    this.#ended = true;
    if (this.#started) engine.abort(this.requestId);
    const it = this.#iterator;
    this.#iterator = null;
    if (it?.return !== undefined) await it.return().catch(() => {});
  }

  /** Records this request in the metrics once (an unfinished one counts as aborted). */
  observe(metrics: ServerMetrics): void {
    if (this.#observed || !this.#started) return;
    this.#observed = true;
    metrics.observeRequest({
      promptTokens: this.promptTokens,
      generationTokens: this.outputTokens,
      ttft: this.#ttft,
      queueTime: this.#queueTime,
      interTokenLatencies: this.#gaps,
      e2e: ((this.#ttft === null ? performance.now() : this.#last) - this.#arrival) / 1000,
      finishReason: this.finishReason ?? "abort",
    });
  }
}

/** Token counts of a response so far: every prompt once, every choice's output. */
export function usageOf(prep: Prepared, runs: readonly ChoiceRun[]): Usage {
  const prompt = prep.prompts.reduce((a, p) => a + p.length, 0);
  const completion = runs.reduce((a, r) => a + r.outputTokens, 0);
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
  };
}

/**
 * Starts every choice's engine request and waits for their first outputs, so admission errors
 * surface before the response starts. Choice `p * n + i` is prompt `p`'s i-th sample; with a
 * seed, choice i uses `seed + i` (exact; see `kernelSeed`). With `promptLogprobs`, only each
 * prompt's first choice asks the engine to score the prompt (the others may reuse its cached
 * prefix) and its prompt logprobs are shared with the prompt's other choices. Every choice
 * carries the request's `cache_salt`. On error every started request is aborted and the error
 * rethrown.
 */
export async function launch(
  engine: EngineClient,
  prep: Prepared,
  ac: AbortController,
): Promise<ChoiceRun[]> {
  const arrival = performance.now();
  const runs: ChoiceRun[] = [];
  try {
    prep.prompts.forEach((ids, p) => {
      const base = prep.params[p]!;
      for (let i = 0; i < prep.n; i++) {
        const index = p * prep.n + i;
        // Exact seed + index, mapped into the kernel's 32 bits (no overflow, deterministic).
        let params = base.seed !== null ? { ...base, seed: kernelSeed(base.seed, index) } : base;
        // One scoring of the prompt serves all its choices.
        if (i > 0 && params.promptLogprobs !== null) params = { ...params, promptLogprobs: null };
        const run = new ChoiceRun(
          index,
          `${prep.id}-${index}`,
          ids.length,
          prep.logprobs,
          arrival,
          prep.echoOnly,
        );
        run.start(engine, params, ids, prep.priority, ac.signal, prep.cacheSalt);
        runs.push(run);
      }
    });
    await Promise.all(runs.map((r) => r.prime()));
    runs.forEach((r, index) => {
      if (index % prep.n !== 0) r.promptLogprobs = runs[index - (index % prep.n)]!.promptLogprobs;
      const p = Math.floor(index / prep.n);
      const len = prep.prompts[p]!.length;
      if (prep.params[p]!.promptLogprobs !== null && r.promptLogprobs?.length !== len) {
        throw new Error(
          `The engine sent ${
            r.promptLogprobs === null ? "no" : r.promptLogprobs.length
          } prompt log-probabilities for request ${r.requestId} (a prompt of ${len} tokens)`,
        );
      }
    });
    return runs;
  } catch (e) {
    ac.abort();
    await Promise.all(runs.map((r) => r.cancel(engine)));
    throw e;
  }
}
