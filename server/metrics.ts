/**
 * Prometheus metrics: a tiny text-format (0.0.4) registry of counters, gauges and histograms,
 * and {@linkcode ServerMetrics}, the vLLM-compatible metric set the HTTP server exposes on
 * `GET /metrics`.
 *
 * Exposition follows the Python `prometheus_client` that vLLM uses: a counter registered as
 * `vllm:prompt_tokens` is written `vllm:prompt_tokens_total` (in its HELP / TYPE lines too),
 * values are written like Python floats (`3.0`, `0.25`, `+Inf`), a histogram's `le` label comes
 * after the others, and its series are `_bucket` (cumulative), `_count` and `_sum`.
 *
 * @module
 */

import type { EngineStats, FinishReason } from "../engine/engine_api.ts";

/** Label values of one series, in the metric's label-name order. */
export type LabelValues = readonly string[];

/** A number as Python's `prometheus_client` writes it: `1.0`, `0.001`, `+Inf`, `NaN`. */
export function formatValue(v: number): string {
  if (Number.isNaN(v)) return "NaN";
  if (v === Infinity) return "+Inf";
  if (v === -Infinity) return "-Inf";
  if (Number.isInteger(v) && Math.abs(v) < 1e16) return `${v}.0`;
  return String(v);
}

function escapeLabel(value: string): string {
  return value.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("\n", "\\n");
}

function escapeHelp(value: string): string {
  return value.replaceAll("\\", "\\\\").replaceAll("\n", "\\n");
}

function labelText(names: readonly string[], values: LabelValues, extra = ""): string {
  const parts = names.map((n, i) => `${n}="${escapeLabel(values[i] ?? "")}"`);
  if (extra !== "") parts.push(extra);
  return parts.length === 0 ? "" : `{${parts.join(",")}}`;
}

const NAME_RE = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_RE = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/** Shared bookkeeping of the three metric kinds: name, help, label names, series by key. */
abstract class Metric<S> {
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly string[];
  protected readonly series = new Map<string, { values: LabelValues; state: S }>();

  constructor(name: string, help: string, labelNames: readonly string[]) {
    if (!NAME_RE.test(name)) throw new RangeError(`Invalid metric name "${name}"`);
    for (const l of labelNames) {
      if (!LABEL_RE.test(l) || l === "le") throw new RangeError(`Invalid label name "${l}"`);
    }
    this.name = name;
    this.help = help;
    this.labelNames = [...labelNames];
  }

  protected abstract initial(): S;

  /** The series for `values` (created, at zero, on first use). */
  protected at(values: LabelValues): S {
    if (values.length !== this.labelNames.length) {
      throw new RangeError(
        `Metric ${this.name} has ${this.labelNames.length} labels, got ${values.length} values`,
      );
    }
    const key = JSON.stringify(values);
    let s = this.series.get(key);
    if (s === undefined) {
      s = { values: [...values], state: this.initial() };
      this.series.set(key, s);
    }
    return s.state;
  }

  /** Creates the series for `values` at zero so it is exported before its first update. */
  touch(values: LabelValues): void {
    this.at(values);
  }

  /** The exposition lines of this metric (HELP, TYPE, samples). */
  abstract lines(): string[];
}

/** A monotonically increasing count. Exposed as `<name>_total`. */
export class Counter extends Metric<{ value: number }> {
  protected initial(): { value: number } {
    return { value: 0 };
  }

  /** Adds `amount` (>= 0). */
  inc(values: LabelValues = [], amount = 1): void {
    if (!(amount >= 0)) throw new RangeError(`Counter ${this.name}: cannot add ${amount}`);
    this.at(values).value += amount;
  }

  /** Sets the count from a cumulative source (the engine's own counters). */
  set(values: LabelValues, value: number): void {
    this.at(values).value = value;
  }

  /** Current value (0 for a series never touched). */
  get(values: LabelValues = []): number {
    return this.series.get(JSON.stringify(values))?.state.value ?? 0;
  }

  lines(): string[] {
    const name = `${this.name}_total`;
    const out = [`# HELP ${name} ${escapeHelp(this.help)}`, `# TYPE ${name} counter`];
    for (const { values, state } of this.series.values()) {
      out.push(`${name}${labelText(this.labelNames, values)} ${formatValue(state.value)}`);
    }
    return out;
  }
}

/** A value that goes up and down. */
export class Gauge extends Metric<{ value: number }> {
  protected initial(): { value: number } {
    return { value: 0 };
  }

  set(values: LabelValues, value: number): void {
    this.at(values).value = value;
  }

  get(values: LabelValues = []): number {
    return this.series.get(JSON.stringify(values))?.state.value ?? 0;
  }

  lines(): string[] {
    const out = [`# HELP ${this.name} ${escapeHelp(this.help)}`, `# TYPE ${this.name} gauge`];
    for (const { values, state } of this.series.values()) {
      out.push(`${this.name}${labelText(this.labelNames, values)} ${formatValue(state.value)}`);
    }
    return out;
  }
}

interface HistogramState {
  /** Non-cumulative count per bucket; the last entry is +Inf. */
  counts: number[];
  sum: number;
  count: number;
}

/** Observations counted into fixed buckets (upper bounds, inclusive). */
export class Histogram extends Metric<HistogramState> {
  /** Finite upper bounds, increasing (+Inf is implicit). */
  readonly buckets: readonly number[];

  constructor(name: string, help: string, labelNames: readonly string[], buckets: number[]) {
    super(name, help, labelNames);
    const finite = buckets.filter((b) => b !== Infinity);
    for (let i = 0; i < finite.length; i++) {
      const b = finite[i]!;
      if (!Number.isFinite(b) || (i > 0 && b <= finite[i - 1]!)) {
        throw new RangeError(`Histogram ${name}: buckets must be finite and increasing`);
      }
    }
    this.buckets = finite;
  }

  protected initial(): HistogramState {
    return { counts: new Array<number>(this.buckets.length + 1).fill(0), sum: 0, count: 0 };
  }

  observe(values: LabelValues, v: number): void {
    const s = this.at(values);
    let i = 0;
    while (i < this.buckets.length && v > this.buckets[i]!) i++;
    s.counts[i]! += 1;
    s.sum += v;
    s.count += 1;
  }

  /** Number of observations of a series. */
  count(values: LabelValues = []): number {
    return this.series.get(JSON.stringify(values))?.state.count ?? 0;
  }

  lines(): string[] {
    const n = this.name;
    const out = [`# HELP ${n} ${escapeHelp(this.help)}`, `# TYPE ${n} histogram`];
    for (const { values, state } of this.series.values()) {
      let acc = 0;
      for (let i = 0; i <= this.buckets.length; i++) {
        acc += state.counts[i]!;
        const le = `le="${formatValue(this.buckets[i] ?? Infinity)}"`;
        out.push(`${n}_bucket${labelText(this.labelNames, values, le)} ${formatValue(acc)}`);
      }
      out.push(`${n}_count${labelText(this.labelNames, values)} ${formatValue(state.count)}`);
      out.push(`${n}_sum${labelText(this.labelNames, values)} ${formatValue(state.sum)}`);
    }
    return out;
  }
}

/** An ordered set of metrics written together. */
export class Registry {
  readonly #metrics: Metric<unknown>[] = [];
  readonly #names = new Set<string>();

  #add<M extends Metric<unknown>>(m: M): M {
    if (this.#names.has(m.name)) throw new RangeError(`Metric ${m.name} is already registered`);
    this.#names.add(m.name);
    this.#metrics.push(m);
    return m;
  }

  counter(name: string, help: string, labelNames: readonly string[] = []): Counter {
    return this.#add(new Counter(name, help, labelNames));
  }

  gauge(name: string, help: string, labelNames: readonly string[] = []): Gauge {
    return this.#add(new Gauge(name, help, labelNames));
  }

  histogram(
    name: string,
    help: string,
    labelNames: readonly string[],
    buckets: number[],
  ): Histogram {
    return this.#add(new Histogram(name, help, labelNames, buckets));
  }

  /** The text exposition (format 0.0.4), one metric after another, ending with a newline. */
  format(): string {
    const lines: string[] = [];
    for (const m of this.#metrics) lines.push(...m.lines());
    return lines.length === 0 ? "" : lines.join("\n") + "\n";
  }
}

/** Content-Type of the text exposition format. */
export const PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

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
/** vLLM's request latency buckets (seconds): e2e and queue time. */
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

/** What the server observed of one engine request, for the histograms. */
export interface RequestTimings {
  /** Prompt length in tokens. */
  promptTokens: number;
  /** Tokens generated. */
  generationTokens: number;
  /** Arrival at the server to the first increment (seconds), or null when none came. */
  ttft: number | null;
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
 * `vllm:request_queue_time_seconds` is approximated: the engine API reports no per-request
 * scheduling time, so it records arrival to first increment (which also contains the prefill).
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
  readonly requestPromptTokens: Histogram;
  readonly requestGenerationTokens: Histogram;

  /**
   * @param modelName value of the `model_name` label.
   * @param maxModelLen upper end of the token-count histograms' buckets.
   */
  constructor(modelName: string, maxModelLen: number) {
    this.modelName = modelName;
    const r = this.registry;
    const L = ["model_name"];
    this.running = r.gauge(
      "vllm:num_requests_running",
      "Number of requests in model execution batches.",
      L,
    );
    this.waiting = r.gauge(
      "vllm:num_requests_waiting",
      "Number of requests waiting to be processed.",
      L,
    );
    this.kvCacheUsage = r.gauge(
      "vllm:kv_cache_usage_perc",
      "KV-cache usage. 1 means 100 percent usage.",
      L,
    );
    this.promptTokens = r.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", L);
    this.generationTokens = r.counter(
      "vllm:generation_tokens",
      "Number of generation tokens processed.",
      L,
    );
    this.requestSuccess = r.counter(
      "vllm:request_success",
      "Count of successfully processed requests.",
      ["model_name", "finished_reason"],
    );
    this.prefixCacheQueries = r.counter(
      "vllm:prefix_cache_queries",
      "Prefix cache queries, in terms of number of queried tokens.",
      L,
    );
    this.prefixCacheHits = r.counter(
      "vllm:prefix_cache_hits",
      "Prefix cache hits, in terms of number of cached tokens.",
      L,
    );
    this.preemptions = r.counter(
      "vllm:num_preemptions",
      "Cumulative number of preemption from the engine.",
      L,
    );
    this.ttft = r.histogram(
      "vllm:time_to_first_token_seconds",
      "Histogram of time to first token in seconds.",
      L,
      TTFT_BUCKETS,
    );
    this.itl = r.histogram(
      "vllm:inter_token_latency_seconds",
      "Histogram of inter-token latency in seconds.",
      L,
      ITL_BUCKETS,
    );
    this.e2e = r.histogram(
      "vllm:e2e_request_latency_seconds",
      "Histogram of e2e request latency in seconds.",
      L,
      REQUEST_LATENCY_BUCKETS,
    );
    this.queueTime = r.histogram(
      "vllm:request_queue_time_seconds",
      "Histogram of time spent waiting in the queue in seconds (approximated: arrival to first output).",
      L,
      REQUEST_LATENCY_BUCKETS,
    );
    const tokenBuckets = buckets125(Math.max(1, maxModelLen));
    this.requestPromptTokens = r.histogram(
      "vllm:request_prompt_tokens",
      "Number of prefill tokens processed.",
      L,
      tokenBuckets,
    );
    this.requestGenerationTokens = r.histogram(
      "vllm:request_generation_tokens",
      "Number of generation tokens processed.",
      L,
      tokenBuckets,
    );
    const m = [modelName];
    for (const g of [this.running, this.waiting, this.kvCacheUsage]) g.touch(m);
    for (const c of [this.promptTokens, this.generationTokens]) c.touch(m);
    for (const reason of FINISH_REASONS) this.requestSuccess.touch([modelName, reason]);
    for (const c of [this.prefixCacheQueries, this.prefixCacheHits, this.preemptions]) c.touch(m);
    for (
      const h of [
        this.ttft,
        this.itl,
        this.e2e,
        this.queueTime,
        this.requestPromptTokens,
        this.requestGenerationTokens,
      ]
    ) h.touch(m);
  }

  /** Records one finished (or aborted) engine request. */
  observeRequest(t: RequestTimings): void {
    const m = [this.modelName];
    this.requestSuccess.inc([this.modelName, t.finishReason]);
    if (t.ttft !== null) {
      this.ttft.observe(m, t.ttft);
      this.queueTime.observe(m, t.ttft);
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

  /** `update(stats)` then the exposition text. */
  render(stats: EngineStats): string {
    this.update(stats);
    return this.registry.format();
  }
}
