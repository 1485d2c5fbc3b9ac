/**
 * Serving-benchmark metrics, computed from per-request client-side timings the same way
 * `vllm bench serve` defines them:
 *
 * - TTFT: time from sending the request to the first streamed chunk that carries text.
 * - TPOT: `(E2E - TTFT) / (output_tokens - 1)`, per request (undefined for 1-token outputs).
 * - ITL: every gap between consecutive text-carrying chunks, pooled over all requests.
 * - E2E: time from sending the request to the end of its stream, on the client.
 * - Goodput: successful requests that meet every SLO given (TTFT and/or TPOT), per second of
 *   the level's wall time. A request whose TPOT is undefined meets the TPOT SLO.
 *
 * Percentiles interpolate linearly between the two nearest order statistics, like numpy's default
 * (`method="linear"`): the p-th percentile of sorted `x[0..n-1]` sits at rank `r = p/100 * (n-1)`
 * and is `x[floor r] + (x[ceil r] - x[floor r]) * (r - floor r)`.
 *
 * @module
 */

/** What the client measured for one request. Times are milliseconds. */
export interface RequestResult {
  /** Position of the request in its level's workload. */
  readonly index: number;
  /** True when the stream completed (`data: [DONE]`) with at least one token and no error. */
  readonly ok: boolean;
  /** Why the request failed (HTTP status and server message, timeout, protocol error). */
  readonly error?: string;
  /** Send time relative to the level's start. */
  readonly startMs: number;
  /** Time to the first text-carrying chunk; null when none arrived. */
  readonly ttftMs: number | null;
  /** Send to end of stream (or to the failure). */
  readonly e2eMs: number;
  /** Gaps between consecutive text-carrying chunks (length = chunks - 1). */
  readonly itlMs: readonly number[];
  /** Prompt length in tokens: the server's `usage.prompt_tokens`, else the planned length. */
  readonly promptTokens: number;
  /** Generated tokens: the server's `usage.completion_tokens`, else the streamed chunks counted. */
  readonly outputTokens: number;
  /** True when the server sent a usage chunk (token counts are exact). */
  readonly usageReported: boolean;
}

/** Order statistics of one metric. */
export interface Summary {
  readonly count: number;
  readonly min: number;
  readonly mean: number;
  readonly p50: number;
  readonly p95: number;
  readonly p99: number;
  readonly max: number;
}

/** Service-level objectives for goodput; an absent field is not checked. */
export interface Slo {
  readonly ttftMs?: number;
  readonly tpotMs?: number;
}

/** One failure message and how many requests of the level failed with it. */
export interface ErrorCount {
  readonly message: string;
  readonly count: number;
}

/** Everything reported for one concurrency level (or request rate). */
export interface LevelMetrics {
  readonly totalRequests: number;
  readonly successful: number;
  readonly failed: number;
  /** Wall time from the level's first send to its last completion, seconds. */
  readonly durationS: number;
  /** Successful requests per second. */
  readonly requestThroughput: number;
  /** Generated tokens of successful requests per second. */
  readonly outputThroughput: number;
  /** Prompt plus generated tokens of successful requests per second. */
  readonly totalThroughput: number;
  readonly totalInputTokens: number;
  readonly totalOutputTokens: number;
  /** Null when no successful request produced a sample. */
  readonly ttftMs: Summary | null;
  readonly tpotMs: Summary | null;
  readonly itlMs: Summary | null;
  readonly e2eMs: Summary | null;
  readonly outputTokens: Summary | null;
  /** Successful requests meeting the SLOs; null when no SLO was given. */
  readonly goodRequests: number | null;
  /** `goodRequests / durationS`; null when no SLO was given. */
  readonly goodput: number | null;
  /** True when every successful request's token counts came from a usage chunk. */
  readonly usageReported: boolean;
  /** Distinct failure messages, most frequent first. */
  readonly errors: readonly ErrorCount[];
}

/**
 * The `p`-th percentile (0..100) of `sorted` (ascending), by linear interpolation between
 * order statistics (numpy's default). Throws RangeError on an empty array or `p` out of range.
 */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) throw new RangeError("Cannot take a percentile of no samples");
  if (!(p >= 0 && p <= 100)) throw new RangeError(`Percentile must be in 0..100, got ${p}`);
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  const a = sorted[lo]!;
  const b = sorted[hi]!;
  return a + (b - a) * (rank - lo);
}

/** Min, mean, p50, p95, p99 and max of `values` (any order); null when empty. */
export function summarize(values: readonly number[]): Summary | null {
  if (values.length === 0) return null;
  const sorted = [...values].sort((x, y) => x - y);
  let sum = 0;
  for (const v of sorted) sum += v;
  return {
    count: sorted.length,
    min: sorted[0]!,
    mean: sum / sorted.length,
    p50: percentile(sorted, 50),
    p95: percentile(sorted, 95),
    p99: percentile(sorted, 99),
    max: sorted[sorted.length - 1]!,
  };
}

/** A request's TPOT, `(E2E - TTFT) / (outputTokens - 1)`; null below 2 tokens or without TTFT. */
export function tpotMs(r: RequestResult): number | null {
  if (r.ttftMs === null || r.outputTokens < 2) return null;
  return (r.e2eMs - r.ttftMs) / (r.outputTokens - 1);
}

/** True when a successful request meets every SLO given. */
export function meetsSlo(r: RequestResult, slo: Slo): boolean {
  if (!r.ok) return false;
  if (slo.ttftMs !== undefined && (r.ttftMs === null || r.ttftMs > slo.ttftMs)) return false;
  const tpot = tpotMs(r);
  if (slo.tpotMs !== undefined && tpot !== null && tpot > slo.tpotMs) return false;
  return true;
}

/**
 * Aggregates one level's requests. `durationMs` is the level's wall time (first send to last
 * completion); throughputs divide by it. Failed requests count in `failed` and `errors` only.
 */
export function levelMetrics(
  results: readonly RequestResult[],
  durationMs: number,
  slo: Slo = {},
): LevelMetrics {
  if (!(durationMs > 0)) {
    throw new RangeError(`Cannot compute throughput: level duration is ${durationMs} ms`);
  }
  const ok = results.filter((r) => r.ok);
  const durationS = durationMs / 1000;
  let input = 0;
  let output = 0;
  for (const r of ok) {
    input += r.promptTokens;
    output += r.outputTokens;
  }
  const errors = new Map<string, number>();
  for (const r of results) {
    if (!r.ok) {
      const message = r.error ?? "unknown error";
      errors.set(message, (errors.get(message) ?? 0) + 1);
    }
  }
  const hasSlo = slo.ttftMs !== undefined || slo.tpotMs !== undefined;
  const good = hasSlo ? ok.filter((r) => meetsSlo(r, slo)).length : null;
  return {
    totalRequests: results.length,
    successful: ok.length,
    failed: results.length - ok.length,
    durationS,
    requestThroughput: ok.length / durationS,
    outputThroughput: output / durationS,
    totalThroughput: (input + output) / durationS,
    totalInputTokens: input,
    totalOutputTokens: output,
    ttftMs: summarize(ok.flatMap((r) => (r.ttftMs === null ? [] : [r.ttftMs]))),
    tpotMs: summarize(ok.flatMap((r) => {
      const t = tpotMs(r);
      return t === null ? [] : [t];
    })),
    itlMs: summarize(ok.flatMap((r) => r.itlMs)),
    e2eMs: summarize(ok.map((r) => r.e2eMs)),
    outputTokens: summarize(ok.map((r) => r.outputTokens)),
    goodRequests: good,
    goodput: good === null ? null : good / durationS,
    usageReported: ok.every((r) => r.usageReported),
    errors: [...errors].map(([message, count]) => ({ message, count }))
      .sort((a, b) => b.count - a.count),
  };
}
