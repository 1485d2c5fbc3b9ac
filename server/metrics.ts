/**
 * {@linkcode ServerMetrics}, the vLLM-compatible metric set the HTTP server exposes on
 * `GET /metrics`, and its histogram buckets. The text format itself is in `prometheus.ts`.
 *
 * @module
 */

import type { CacheInfo, EngineStats, FinishReason } from "../engine/engine_api.ts";
import { type Counter, type Gauge, type Histogram, Registry } from "./prometheus.ts";

// deno-fmt-ignore
/** vLLM's TTFT buckets (seconds). */
export const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

// deno-fmt-ignore
/** vLLM's inter-token latency buckets (seconds). */
export const ITL_BUCKETS = [
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
  40.0, 80.0,
];

// deno-fmt-ignore
/** vLLM's request latency buckets (seconds): e2e and the four phases (queue ... inference). */
export const REQUEST_LATENCY_BUCKETS = [
  0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
  480.0, 960.0, 1920.0, 7680.0,
];

/** 1, 2, 5, 10, 20, 50, ... up to and including the last one <= `max` (vLLM's token buckets). */
export function buckets125(max: number): number[] {
  const out: number[] = [];
  for (let exp = 1;; exp *= 10) {
    for (const m of [1, 2, 5]) {
      const v = m * exp;
      if (v > max) return out;
      out.push(v);
    }
  }
}

/** Finish reasons counted by `vllm:request_success_total` (series created up front). */
const FINISH_REASONS: readonly FinishReason[] = ["stop", "length", "abort"];

/** A metric's name and help text. */
type MetricSpec = readonly [name: string, help: string];

/** vLLM's metric names and help texts, by {@linkcode ServerMetrics} field (registered in this order). */
const METRICS = {
  running: ["vllm:num_requests_running", "Number of requests in model execution batches."],
  waiting: ["vllm:num_requests_waiting", "Number of requests waiting to be processed."],
  kvCacheUsage: ["vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."],
  promptTokens: ["vllm:prompt_tokens", "Number of prefill tokens processed."],
  generationTokens: ["vllm:generation_tokens", "Number of generation tokens processed."],
  requestSuccess: ["vllm:request_success", "Count of successfully processed requests."],
  prefixCacheQueries: [
    "vllm:prefix_cache_queries",
    "Prefix cache queries, in terms of number of queried tokens.",
  ],
  prefixCacheHits: [
    "vllm:prefix_cache_hits",
    "Prefix cache hits, in terms of number of cached tokens.",
  ],
  preemptions: ["vllm:num_preemptions", "Cumulative number of preemption from the engine."],
  ttft: ["vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."],
  itl: ["vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."],
  e2e: ["vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."],
  queueTime: [
    "vllm:request_queue_time_seconds",
    "Histogram of time spent in WAITING phase for request.",
  ],
  prefillTime: [
    "vllm:request_prefill_time_seconds",
    "Histogram of time spent in PREFILL phase for request.",
  ],
  decodeTime: [
    "vllm:request_decode_time_seconds",
    "Histogram of time spent in DECODE phase for request.",
  ],
  inferenceTime: [
    "vllm:request_inference_time_seconds",
    "Histogram of time spent in RUNNING phase for request.",
  ],
  requestPromptTokens: ["vllm:request_prompt_tokens", "Number of prefill tokens processed."],
  requestGenerationTokens: [
    "vllm:request_generation_tokens",
    "Number of generation tokens processed.",
  ],
} as const satisfies Record<string, MetricSpec>;

/**
 * vLLM's `vllm:cache_config_info` for `cache`: the labels it has here (vLLM's names; its Python
 * booleans as `True` / `False`), the value 1.
 */
function cacheConfigInfo(r: Registry, cache: CacheInfo): Gauge {
  const labels = {
    block_size: String(cache.blockSize),
    cache_dtype: cache.cacheDtype,
    enable_prefix_caching: cache.enablePrefixCaching ? "True" : "False",
    num_cpu_blocks: String(cache.numCpuBlocks),
    num_gpu_blocks: String(cache.numGpuBlocks),
  };
  const gauge = r.gauge(
    "vllm:cache_config_info",
    "Information of the LLMEngine CacheConfig",
    Object.keys(labels),
  );
  gauge.set(Object.values(labels), 1);
  return gauge;
}

/** `metric` with its series for `labels` created (0). */
function touched<M extends { touch(values: readonly string[]): void }>(
  metric: M,
  labels: readonly string[],
): M {
  metric.touch(labels);
  return metric;
}

/** What the server observed of one engine request, for the histograms. */
export interface RequestTimings {
  /** Prompt length in tokens. */
  promptTokens: number;
  /** Tokens generated. */
  generationTokens: number;
  /** Arrival at the server to the first increment (seconds), or null when none came. */
  ttft: number | null;
  /**
   * The engine's queue time: arrival at the engine to the first scheduling (seconds); null when
   * the engine did not report one (then arrival to the first increment stands in for it).
   */
  queueTime: number | null;
  /** Gaps between consecutive increments (seconds). */
  interTokenLatencies: readonly number[];
  /** Arrival to the last increment (seconds). */
  e2e: number;
  finishReason: FinishReason;
}

/**
 * The vLLM metric set for one served model (label `model_name`). Gauges and the token and
 * prefix-cache counters are copied from {@linkcode EngineStats} at each scrape; the histograms
 * and `vllm:request_success_total` are fed by the server per finished engine request
 * ({@linkcode ServerMetrics.observeRequest}).
 *
 * The phases, as vLLM splits a request: queue (the engine's figure, `RequestOutput.queueTime`),
 * prefill (time to the first increment less the queue time; it includes the server's own work
 * before the engine), decode (first increment to last), inference (prefill and decode). Requests
 * that produced no increment are left out of the phase histograms, as vLLM leaves them out.
 */
export class ServerMetrics {
  readonly registry = new Registry();
  readonly modelName: string;
  readonly running: Gauge;
  readonly waiting: Gauge;
  readonly kvCacheUsage: Gauge;
  readonly promptTokens: Counter;
  readonly generationTokens: Counter;
  readonly requestSuccess: Counter;
  readonly prefixCacheQueries: Counter;
  readonly prefixCacheHits: Counter;
  readonly preemptions: Counter;
  readonly ttft: Histogram;
  readonly itl: Histogram;
  readonly e2e: Histogram;
  readonly queueTime: Histogram;
  readonly prefillTime: Histogram;
  readonly decodeTime: Histogram;
  readonly inferenceTime: Histogram;
  readonly requestPromptTokens: Histogram;
  readonly requestGenerationTokens: Histogram;
  /**
   * `vllm:cache_config_info`: one series of value 1 whose labels are the KV cache's
   * configuration (vLLM's label names); null until the engine reports one (a server starts
   * before its model is loaded).
   */
  get cacheConfig(): Gauge | null {
    return this.#cacheConfig;
  }
  #cacheConfig: Gauge | null = null;

  /**
   * @param modelName value of the `model_name` label.
   * @param maxModelLen upper end of the token-count histograms' buckets.
   * @param cache the KV cache's configuration, for `vllm:cache_config_info`.
   */
  constructor(modelName: string, maxModelLen: number, cache?: CacheInfo) {
    this.modelName = modelName;
    const r = this.registry;
    const L = ["model_name"];
    const m = [modelName];
    // Every series exists from the start (0), as vLLM's do.
    const gauge = (spec: MetricSpec) => touched(r.gauge(...spec, L), m);
    const counter = (spec: MetricSpec) => touched(r.counter(...spec, L), m);
    const histogram = (spec: MetricSpec, buckets: number[]) =>
      touched(r.histogram(...spec, L, buckets), m);
    this.running = gauge(METRICS.running);
    this.waiting = gauge(METRICS.waiting);
    this.kvCacheUsage = gauge(METRICS.kvCacheUsage);
    this.promptTokens = counter(METRICS.promptTokens);
    this.generationTokens = counter(METRICS.generationTokens);
    this.requestSuccess = r.counter(...METRICS.requestSuccess, ["model_name", "finished_reason"]);
    for (const reason of FINISH_REASONS) this.requestSuccess.touch([modelName, reason]);
    this.prefixCacheQueries = counter(METRICS.prefixCacheQueries);
    this.prefixCacheHits = counter(METRICS.prefixCacheHits);
    this.preemptions = counter(METRICS.preemptions);
    this.ttft = histogram(METRICS.ttft, TTFT_BUCKETS);
    this.itl = histogram(METRICS.itl, ITL_BUCKETS);
    this.e2e = histogram(METRICS.e2e, REQUEST_LATENCY_BUCKETS);
    this.queueTime = histogram(METRICS.queueTime, REQUEST_LATENCY_BUCKETS);
    this.prefillTime = histogram(METRICS.prefillTime, REQUEST_LATENCY_BUCKETS);
    this.decodeTime = histogram(METRICS.decodeTime, REQUEST_LATENCY_BUCKETS);
    this.inferenceTime = histogram(METRICS.inferenceTime, REQUEST_LATENCY_BUCKETS);
    const tokenBuckets = buckets125(Math.max(1, maxModelLen));
    this.requestPromptTokens = histogram(METRICS.requestPromptTokens, tokenBuckets);
    this.requestGenerationTokens = histogram(METRICS.requestGenerationTokens, tokenBuckets);
    this.describeCache(cache);
  }

  /** Registers `vllm:cache_config_info` for `cache`, once (later calls change nothing). */
  describeCache(cache: CacheInfo | undefined): void {
    if (cache === undefined || this.#cacheConfig !== null) return;
    this.#cacheConfig = cacheConfigInfo(this.registry, cache);
  }

  /** Records one finished (or aborted) engine request. */
  observeRequest(t: RequestTimings): void {
    const m = [this.modelName];
    this.requestSuccess.inc([this.modelName, t.finishReason]);
    if (t.ttft !== null) {
      this.ttft.observe(m, t.ttft);
      // Without the engine's figure the queue time is arrival to first output (prefill 0).
      const queue = Math.min(t.queueTime ?? t.ttft, t.ttft);
      this.queueTime.observe(m, queue);
      this.prefillTime.observe(m, t.ttft - queue);
      this.decodeTime.observe(m, Math.max(0, t.e2e - t.ttft));
      this.inferenceTime.observe(m, Math.max(0, t.e2e - queue));
    }
    for (const gap of t.interTokenLatencies) this.itl.observe(m, gap);
    this.e2e.observe(m, t.e2e);
    this.requestPromptTokens.observe(m, t.promptTokens);
    this.requestGenerationTokens.observe(m, t.generationTokens);
  }

  /** Copies the engine's gauges and cumulative counters. */
  update(stats: EngineStats): void {
    const m = [this.modelName];
    this.running.set(m, stats.numRunning);
    this.waiting.set(m, stats.numWaiting);
    this.kvCacheUsage.set(m, stats.kvCacheUsage);
    this.promptTokens.set(m, stats.promptTokensTotal);
    this.generationTokens.set(m, stats.generationTokensTotal);
    this.prefixCacheQueries.set(m, stats.prefixCacheQueries);
    this.prefixCacheHits.set(m, stats.prefixCacheHits);
    this.preemptions.set(m, stats.numPreemptions);
  }

  /** `update(stats)` (and `describeCache(cache)`) then the exposition text. */
  render(stats: EngineStats, cache?: CacheInfo): string {
    this.describeCache(cache);
    this.update(stats);
    return this.registry.format();
  }
}
