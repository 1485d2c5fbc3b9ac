/**
 * The Prometheus text formatter (exact output) and `GET /metrics` after a known sequence of
 * requests (exact lines for gauges, counters and token histograms; structure and counts for the
 * latency histograms, whose values depend on timing).
 */

import assert from "node:assert/strict";
import {
  buckets125,
  ITL_BUCKETS,
  REQUEST_LATENCY_BUCKETS,
  ServerMetrics,
  TTFT_BUCKETS,
} from "../server/metrics.ts";
import { formatValue, PROMETHEUS_CONTENT_TYPE, Registry } from "../server/prometheus.ts";
import { FakeEngine, tinyTokenizer, withServer } from "./support/fake_engine.ts";

Deno.test("Registry.format() writes the exact 0.0.4 text exposition", () => {
  const r = new Registry();
  const c = r.counter("app:requests", 'Requests \\ seen.\nSecond "line"', ["code"]);
  c.inc(["200"]);
  c.inc(["200"], 2);
  c.inc(['a"b\\c\nd'], 0.5);
  const g = r.gauge("app_temp", "Temperature.");
  g.set([], -1.5);
  const h = r.histogram("app_latency_seconds", "Latency.", ["route", "method"], [0.1, 1, 5]);
  h.observe(["/x", "GET"], 0.1);
  h.observe(["/x", "GET"], 0.5);
  h.observe(["/x", "GET"], 7);
  h.touch(["/y", "POST"]);
  const expected = [
    '# HELP app:requests_total Requests \\\\ seen.\\nSecond "line"',
    "# TYPE app:requests_total counter",
    'app:requests_total{code="200"} 3.0',
    'app:requests_total{code="a\\"b\\\\c\\nd"} 0.5',
    "# HELP app_temp Temperature.",
    "# TYPE app_temp gauge",
    "app_temp -1.5",
    "# HELP app_latency_seconds Latency.",
    "# TYPE app_latency_seconds histogram",
    'app_latency_seconds_bucket{route="/x",method="GET",le="0.1"} 1.0',
    'app_latency_seconds_bucket{route="/x",method="GET",le="1.0"} 2.0',
    'app_latency_seconds_bucket{route="/x",method="GET",le="5.0"} 2.0',
    'app_latency_seconds_bucket{route="/x",method="GET",le="+Inf"} 3.0',
    'app_latency_seconds_count{route="/x",method="GET"} 3.0',
    'app_latency_seconds_sum{route="/x",method="GET"} 7.6',
    'app_latency_seconds_bucket{route="/y",method="POST",le="0.1"} 0.0',
    'app_latency_seconds_bucket{route="/y",method="POST",le="1.0"} 0.0',
    'app_latency_seconds_bucket{route="/y",method="POST",le="5.0"} 0.0',
    'app_latency_seconds_bucket{route="/y",method="POST",le="+Inf"} 0.0',
    'app_latency_seconds_count{route="/y",method="POST"} 0.0',
    'app_latency_seconds_sum{route="/y",method="POST"} 0.0',
    "",
  ].join("\n");
  assert.equal(r.format(), expected);
  assert.equal(c.get(["200"]), 3);
  assert.equal(h.count(["/x", "GET"]), 3);
  assert.equal(new Registry().format(), "");
});

Deno.test("metrics refuse invalid names, label counts, negative increments and bad buckets", () => {
  const r = new Registry();
  assert.throws(() => r.counter("bad-name", "x"), RangeError);
  assert.throws(() => r.gauge("ok", "x", ["le"]), RangeError);
  assert.throws(() => r.gauge("ok2", "x", ["0bad"]), RangeError);
  const c = r.counter("c", "x", ["a"]);
  assert.throws(() => c.inc([]), /has 1 labels, got 0 values/);
  assert.throws(() => c.inc(["v"], -1), RangeError);
  assert.throws(() => r.counter("c", "again"), /already registered/);
  assert.throws(() => r.histogram("h", "x", [], [1, 1]), RangeError);
  assert.throws(() => r.histogram("h2", "x", [], [2, 1]), RangeError);
  assert.deepEqual(buckets125(100), [1, 2, 5, 10, 20, 50, 100]);
  assert.deepEqual(buckets125(4), [1, 2]);
  assert.deepEqual(
    [1, 0.25, 1e21, -0, Infinity, -Infinity, NaN].map(formatValue),
    ["1.0", "0.25", "1e+21", "0.0", "+Inf", "-Inf", "NaN"],
  );
});

/** The lines of one metric family (from its HELP line to the next HELP line). */
function family(text: string, name: string): string[] {
  const lines = text.split("\n");
  const start = lines.findIndex((l) => l.startsWith(`# HELP ${name} `));
  assert.ok(start >= 0, `family ${name} present`);
  let end = start + 1;
  while (end < lines.length && !lines[end]!.startsWith("# HELP ") && lines[end] !== "") end++;
  return lines.slice(start, end);
}

function tokenHistogram(name: string, values: number[], buckets: number[]): string[] {
  const out = [`# TYPE ${name} histogram`];
  for (const le of [...buckets, Infinity]) {
    const n = values.filter((v) => v <= le).length;
    out.push(`${name}_bucket{model_name="m1",le="${formatValue(le)}"} ${formatValue(n)}`);
  }
  out.push(`${name}_count{model_name="m1"} ${formatValue(values.length)}`);
  out.push(`${name}_sum{model_name="m1"} ${formatValue(values.reduce((a, b) => a + b, 0))}`);
  return out;
}

Deno.test("GET /metrics shows vLLM's metrics exactly after a known sequence of requests", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { stepMs: 1, maxModelLen: 256 });
  await withServer(engine, { servedModelNames: ["m1", "alias"] }, async (url) => {
    const post = async (body: unknown) => {
      const res = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      assert.equal(res.status, 200);
      return await res.json();
    };
    // 1: 5 prompt tokens, 4 generated, "length". 2: 5 prompt tokens, stops on token 3 (3rd).
    const a = await post({ model: "m1", prompt: [1, 2, 3, 4, 5], max_tokens: 4, temperature: 0 });
    assert.equal(a.choices[0].finish_reason, "length");
    const b = await post({
      model: "alias",
      prompt: [1, 2, 3, 4, 5],
      max_tokens: 10,
      temperature: 0,
      stop_token_ids: [3],
    });
    assert.equal(b.choices[0].finish_reason, "stop");
    assert.equal(b.choices[0].stop_reason, 3);
    assert.equal(b.model, "alias");

    const res = await fetch(`${url}/metrics`);
    assert.equal(res.headers.get("content-type"), PROMETHEUS_CONTENT_TYPE);
    const text = await res.text();
    assert.ok(text.endsWith("\n"));
    const scalar = (name: string, type: string, help: string, lines: string[]) => {
      assert.deepEqual(family(text, name), [
        `# HELP ${name} ${help}`,
        `# TYPE ${name} ${type}`,
        ...lines,
      ]);
    };
    scalar("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", [
      'vllm:num_requests_running{model_name="m1"} 0.0',
    ]);
    scalar("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [
      'vllm:num_requests_waiting{model_name="m1"} 0.0',
    ]);
    scalar("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", [
      'vllm:kv_cache_usage_perc{model_name="m1"} 0.0',
    ]);
    scalar("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", [
      'vllm:prompt_tokens_total{model_name="m1"} 10.0',
    ]);
    scalar("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", [
      'vllm:generation_tokens_total{model_name="m1"} 7.0',
    ]);
    scalar("vllm:request_success_total", "counter", "Count of successfully processed requests.", [
      'vllm:request_success_total{model_name="m1",finished_reason="stop"} 1.0',
      'vllm:request_success_total{model_name="m1",finished_reason="length"} 1.0',
      'vllm:request_success_total{model_name="m1",finished_reason="abort"} 0.0',
    ]);
    scalar(
      "vllm:prefix_cache_queries_total",
      "counter",
      "Prefix cache queries, in terms of number of queried tokens.",
      ['vllm:prefix_cache_queries_total{model_name="m1"} 10.0'],
    );
    scalar(
      "vllm:prefix_cache_hits_total",
      "counter",
      "Prefix cache hits, in terms of number of cached tokens.",
      ['vllm:prefix_cache_hits_total{model_name="m1"} 0.0'],
    );
    scalar(
      "vllm:num_preemptions_total",
      "counter",
      "Cumulative number of preemption from the engine.",
      [
        'vllm:num_preemptions_total{model_name="m1"} 0.0',
      ],
    );
    const tokenBuckets = [1, 2, 5, 10, 20, 50, 100, 200];
    assert.deepEqual(
      family(text, "vllm:request_prompt_tokens").slice(1),
      tokenHistogram("vllm:request_prompt_tokens", [5, 5], tokenBuckets),
    );
    assert.deepEqual(
      family(text, "vllm:request_generation_tokens").slice(1),
      tokenHistogram("vllm:request_generation_tokens", [4, 3], tokenBuckets),
    );
    // Latency histograms: every bucket line, cumulative counts, +Inf = count.
    const latency: [string, number[], number][] = [
      ["vllm:time_to_first_token_seconds", TTFT_BUCKETS, 2],
      ["vllm:inter_token_latency_seconds", ITL_BUCKETS, 3 + 2],
      ["vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS, 2],
      ["vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS, 2],
      ["vllm:request_prefill_time_seconds", REQUEST_LATENCY_BUCKETS, 2],
      ["vllm:request_decode_time_seconds", REQUEST_LATENCY_BUCKETS, 2],
      ["vllm:request_inference_time_seconds", REQUEST_LATENCY_BUCKETS, 2],
    ];
    // The fake engine reports no queue time: arrival to first output stands in, prefill is 0.
    const zeroSum = new Set(["vllm:request_prefill_time_seconds"]);
    for (const [name, buckets, count] of latency) {
      const lines = family(text, name);
      assert.equal(lines[1], `# TYPE ${name} histogram`);
      assert.equal(lines.length, 2 + buckets.length + 1 + 2, name);
      let prev = 0;
      [...buckets, Infinity].forEach((le, i) => {
        const m = lines[2 + i]!.match(/^(.+)_bucket\{model_name="m1",le="([^"]+)"\} (\d+)\.0$/);
        assert.ok(m !== null, lines[2 + i]);
        assert.equal(m[1], name);
        assert.equal(m[2], formatValue(le));
        const n = Number(m[3]);
        assert.ok(n >= prev, `${name} cumulative`);
        prev = n;
      });
      assert.equal(prev, count, `${name} +Inf bucket`);
      assert.equal(lines.at(-2), `${name}_count{model_name="m1"} ${formatValue(count)}`);
      const sum = Number(lines.at(-1)!.split(" ")[1]);
      if (zeroSum.has(name)) assert.equal(sum, 0, `${name} sum`);
      else assert.ok(sum > 0 && sum < 10, `${name} sum ${sum}`);
    }
    // Family order as registered, and nothing else in the exposition.
    const helps = text.split("\n").filter((l) => l.startsWith("# HELP ")).map((l) =>
      l.split(" ")[2]
    );
    assert.deepEqual(helps, [
      "vllm:num_requests_running",
      "vllm:num_requests_waiting",
      "vllm:kv_cache_usage_perc",
      "vllm:prompt_tokens_total",
      "vllm:generation_tokens_total",
      "vllm:request_success_total",
      "vllm:prefix_cache_queries_total",
      "vllm:prefix_cache_hits_total",
      "vllm:num_preemptions_total",
      "vllm:time_to_first_token_seconds",
      "vllm:inter_token_latency_seconds",
      "vllm:e2e_request_latency_seconds",
      "vllm:request_queue_time_seconds",
      "vllm:request_prefill_time_seconds",
      "vllm:request_decode_time_seconds",
      "vllm:request_inference_time_seconds",
      "vllm:request_prompt_tokens",
      "vllm:request_generation_tokens",
    ]);
  });
});

Deno.test("ServerMetrics.observeRequest() splits a request into vLLM's phases by the engine's queue time", () => {
  const metrics = new ServerMetrics("m", 64);
  const base = {
    promptTokens: 4,
    generationTokens: 3,
    interTokenLatencies: [],
    finishReason: "stop" as const,
  };
  // Queued 0.5 s, first output at 0.8 s, last at 2.0 s.
  metrics.observeRequest({ ...base, ttft: 0.8, queueTime: 0.5, e2e: 2.0 });
  // No queue time from the engine: arrival to first output stands in for it.
  metrics.observeRequest({ ...base, ttft: 0.25, queueTime: null, e2e: 1.0 });
  // No output at all: only e2e and the counters.
  metrics.observeRequest({ ...base, ttft: null, queueTime: null, e2e: 0.1, finishReason: "abort" });
  const text = metrics.registry.format();
  const sum = (name: string) =>
    Number(text.split("\n").find((l) => l.startsWith(`${name}_sum{`))!.split(" ")[1]);
  const count = (name: string) =>
    Number(text.split("\n").find((l) => l.startsWith(`${name}_count{`))!.split(" ")[1]);
  const close = (a: number, b: number, what: string) =>
    assert.ok(Math.abs(a - b) < 1e-9, `${what}: ${a} vs ${b}`);
  close(sum("vllm:request_queue_time_seconds"), 0.5 + 0.25, "queue");
  close(sum("vllm:request_prefill_time_seconds"), 0.3 + 0, "prefill");
  close(sum("vllm:request_decode_time_seconds"), 1.2 + 0.75, "decode");
  close(sum("vllm:request_inference_time_seconds"), 1.5 + 0.75, "inference");
  for (const name of ["queue", "prefill", "decode", "inference"]) {
    assert.equal(count(`vllm:request_${name}_time_seconds`), 2, name);
  }
  assert.equal(count("vllm:e2e_request_latency_seconds"), 3);
});

Deno.test("ServerMetrics reports the KV cache's configuration as vLLM's cache_config_info", () => {
  const metrics = new ServerMetrics("m", 64, {
    blockSize: 16,
    numGpuBlocks: 585,
    numCpuBlocks: 12,
    cacheDtype: "fp8_e4m3",
    enablePrefixCaching: true,
  });
  assert.deepEqual(family(metrics.registry.format(), "vllm:cache_config_info"), [
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
    "# TYPE vllm:cache_config_info gauge",
    'vllm:cache_config_info{block_size="16",cache_dtype="fp8_e4m3",enable_prefix_caching="True",' +
    'num_cpu_blocks="12",num_gpu_blocks="585"} 1.0',
  ]);
  assert.equal(new ServerMetrics("m", 64).cacheConfig, null);
});
