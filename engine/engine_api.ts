/**
 * The engine as its clients (the HTTP server, the `generate` CLI, benchmarks) see it: submit a
 * tokenized request with sampling parameters, receive its output as an async stream of
 * increments, abort it, read gauges and counters. {@linkcode LLMEngine} (llm_engine.ts)
 * implements it over a scheduler and an executor (WebGPU or mock).
 *
 * @module
 */

import type { SamplingParams } from "../scheduler/sampling_params.ts";
import type { Tokenizer } from "./tokenizer.ts";

export type { SamplingParams };

/** One request for {@linkcode EngineClient.generate}. */
export interface GenerateRequest {
  /** Unique among the engine's unfinished requests. */
  readonly requestId: string;
  /** Prompt token ids (at least one). */
  readonly promptTokenIds: readonly number[];
  /** Sampling parameters (see scheduler/sampling_params.ts; `samplingParams()` fills defaults). */
  readonly params: SamplingParams;
  /** Lower number = served first under `--scheduling-policy priority`; default 0. */
  readonly priority?: number;
  /**
   * vLLM's `cache_salt` (a non-empty string): the request reads and shares prefix-cache blocks
   * only with requests of the same salt. Absent: the shared, unsalted cache.
   */
  readonly cacheSalt?: string;
}

/**
 * A request the engine could not serve to the end although it was valid when admitted (a bug in
 * per-request state, caught inside a step): that request ends with this error (the HTTP server
 * answers 500, or an SSE error event), every other request goes on.
 */
export class RequestFailedError extends Error {
  override name = "RequestFailedError";
  /** The failed request. */
  readonly requestId: string;

  constructor(requestId: string, cause: Error) {
    super(`Request "${requestId}" failed inside an engine step: ${cause.message}`, { cause });
    this.requestId = requestId;
  }
}

/** Log-probabilities of one generated token. */
export interface TokenLogprob {
  /** The token generated. */
  readonly tokenId: number;
  /** Its log-probability under the model's raw distribution (before sampling filters). */
  readonly logprob: number;
  /** The most likely tokens at that step, best first, when `params.logprobs` > 0. */
  readonly top?: readonly { readonly tokenId: number; readonly logprob: number }[];
}

/** One prompt token's log-probability (`params.promptLogprobs`, vLLM's `prompt_logprobs`). */
export interface PromptLogprob {
  /** The prompt token. */
  readonly tokenId: number;
  /** Its log-probability given the prompt before it, under the model's raw distribution. */
  readonly logprob: number;
  /** 1 + the number of tokens more likely there (vLLM's rank; ties share the better rank). */
  readonly rank: number;
  /** The `params.promptLogprobs` most likely tokens there, best first (ties: lower id first). */
  readonly top: readonly { readonly tokenId: number; readonly logprob: number }[];
}

/** Why a request finished (OpenAI's `finish_reason`, plus `abort`). */
export type FinishReason = "stop" | "length" | "abort";

/** One increment of a request's output. */
export interface RequestOutput {
  readonly requestId: string;
  /** Token ids generated since the previous increment. */
  readonly tokenIds: readonly number[];
  /**
   * Text since the previous increment. Text that may still turn out to be the start of a stop
   * string, or an incomplete UTF-8 character, is held back; a matched stop string is never
   * emitted. The concatenation of all increments is the request's output text.
   */
  readonly text: string;
  /** One entry per token of `tokenIds`, when `params.logprobs` is not null. */
  readonly logprobs: readonly TokenLogprob[] | null;
  /**
   * With `params.promptLogprobs` (not null): one entry per prompt token, null for the first
   * (nothing precedes it), on the request's first increment only.
   */
  readonly promptLogprobs?: readonly (PromptLogprob | null)[];
  /** Set on the last increment. */
  readonly finishReason: FinishReason | null;
  /** The stop token id or stop string that ended the request (last increment only). */
  readonly stopReason: number | string | null;
  /** Prompt length in tokens. */
  readonly numPromptTokens: number;
  /** Output tokens so far (including this increment). */
  readonly numOutputTokens: number;
  /** Prompt tokens found in the prefix cache at admission (known from the first increment). */
  readonly numCachedTokens: number;
  /**
   * Seconds from the request's arrival at the engine to its first scheduling (vLLM's queue
   * time), on every increment after it; absent before, and from engines that do not measure it.
   */
  readonly queueTime?: number;
}

/** Gauges and counters for `/metrics` and `/health` (vLLM's metric meanings). */
export interface EngineStats {
  readonly numRunning: number;
  readonly numWaiting: number;
  /** Fraction of the KV block pool in use, 0..1. */
  readonly kvCacheUsage: number;
  /** KV blocks currently held by requests (0 when idle: nothing leaked). */
  readonly kvBlocksUsed: number;
  readonly kvBlocksTotal: number;
  readonly promptTokensTotal: number;
  readonly generationTokensTotal: number;
  readonly prefixCacheQueries: number;
  readonly prefixCacheHits: number;
  readonly numPreemptions: number;
  /** Engine steps executed. */
  readonly steps: number;
}

/** Static facts about the served model. */
export interface ModelInfo {
  /** Name requests must use (`--served-model-name`, default the model directory's name). */
  readonly name: string;
  /** Architecture from config.json, or "mock". */
  readonly architecture: string;
  readonly maxModelLen: number;
  readonly vocabSize: number;
  /** Weight dtype on the device, or "none" for the mock executor. */
  readonly dtype: string;
  /** The KV cache as configured (`/metrics`' `vllm:cache_config_info`); absent for a bare fake. */
  readonly cache?: CacheInfo;
}

/** The KV cache's configuration, as vLLM's `CacheConfig` reports it. */
export interface CacheInfo {
  /** Tokens per block. */
  readonly blockSize: number;
  /** Blocks on the device. */
  readonly numGpuBlocks: number;
  /** Host blocks of `--preemption-mode swap` (0 otherwise). */
  readonly numCpuBlocks: number;
  /** `--kv-cache-dtype` as configured: `auto` or `fp8_e4m3`. */
  readonly cacheDtype: string;
  readonly enablePrefixCaching: boolean;
}

/** An engine as its clients use it. */
export interface EngineClient {
  readonly model: ModelInfo;
  /** The model's tokenizer (prompts, chat template, /tokenize); null for a bare mock engine. */
  readonly tokenizer: Tokenizer | null;
  /**
   * Sampling defaults from the model's generation_config.json (temperature, top_p, top_k,
   * min_p, repetition_penalty); a request's own values override them.
   */
  readonly generationDefaults?: Partial<SamplingParams>;
  /**
   * Queues a request and returns its output stream. Throws RangeError / TypeError at once for a
   * request that can never run (prompt too long for max_model_len or for the whole KV cache,
   * empty prompt, duplicate id) and {@linkcode EngineOverloadedError} when the waiting queue is
   * full. Breaking out of the iteration, or `signal` aborting, aborts the request and frees its
   * KV blocks at once.
   */
  generate(request: GenerateRequest, signal?: AbortSignal): AsyncIterable<RequestOutput>;
  /** Aborts a request (no-op when unknown or finished). */
  abort(requestId: string): void;
  /** Current gauges and counters. */
  stats(): EngineStats;
  /** The fatal error that stopped the engine (device lost, ...), or null while healthy. */
  readonly error: Error | null;
  /**
   * Stops accepting requests, lets in-flight ones finish for up to `graceMs`, aborts the rest,
   * releases the GPU. Resolves when everything is released.
   */
  shutdown(graceMs?: number): Promise<void>;
}

/** The waiting queue is full (`--max-waiting-requests`): HTTP 429. */
export class EngineOverloadedError extends Error {
  override name = "EngineOverloadedError";
}

/** The engine stopped after a fatal error or was shut down: HTTP 503. */
export class EngineDeadError extends Error {
  override name = "EngineDeadError";
}
