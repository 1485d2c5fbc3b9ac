/**
 * HTTP server lifecycle: client disconnects abort engine requests, overload answers 429,
 * readiness and `/health`, graceful shutdown, `/batch/test` with a fake mock-engine factory, and
 * the small endpoints (`/v1/models`, `/tokenize`, `/detokenize`).
 */

import assert from "node:assert/strict";
// The client is pinned here rather than in deno.json: only the server tests use it.
// deno-lint-ignore no-import-prefix
import OpenAI from "npm:openai@7.57.0";
import { percentile } from "../server/batch_test.ts";
import { type BatchTestConfig, startServer } from "../server/server.ts";
import { VERSION } from "../server/version.ts";
import { FakeEngine, tinyTokenizer, withServer } from "./support/fake_engine.ts";

/** Polls `cond` every 5 ms for up to `ms`. */
async function waitFor(cond: () => boolean | Promise<boolean>, ms: number, what: string) {
  const end = performance.now() + ms;
  while (!(await cond())) {
    if (performance.now() > end) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Reads SSE `data:` payloads until the stream ends (or `limit` events were read). */
async function readEvents(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  limit = Infinity,
): Promise<string[]> {
  const dec = new TextDecoder();
  const events: string[] = [];
  let buf = "";
  while (events.length < limit) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let at;
    while ((at = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, at);
      buf = buf.slice(at + 2);
      assert.ok(event.startsWith("data: "), event);
      events.push(event.slice(6));
    }
  }
  return events;
}

function startStream(url: string, body: Record<string, unknown>, signal?: AbortSignal) {
  return fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: "hello there", stream: true, ...body }),
    signal,
  });
}

const metricValue = async (url: string, line: string): Promise<number | null> => {
  const text = await (await fetch(`${url}/metrics`)).text();
  const found = text.split("\n").find((l) => l.startsWith(line + " "));
  return found === undefined ? null : Number(found.slice(line.length + 1));
};

Deno.test("a client disconnect mid-stream or mid-request aborts the engine request at once", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { stepMs: 5 });
  await withServer(engine, {}, async (url) => {
    // Streaming: read two chunks, then cancel the body.
    const res = await startStream(url, { max_tokens: 200 });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-type"), "text/event-stream; charset=utf-8");
    const reader = res.body!.getReader();
    const first = await readEvents(reader, 2);
    assert.equal(first.length, 2);
    assert.equal(engine.active, 1);
    const t0 = performance.now();
    await reader.cancel();
    await waitFor(() => engine.active === 0, 500, "the engine request to end");
    assert.ok(performance.now() - t0 < 500);
    assert.equal(engine.aborted.length, 1);
    const running = 'vllm:num_requests_running{model_name="fake-model"}';
    assert.equal(await metricValue(url, running), 0);
    const abortLine = 'vllm:request_success_total{model_name="fake-model",finished_reason="abort"}';
    await waitFor(async () => (await metricValue(url, abortLine)) === 1, 500, "abort counted");

    // Non-streaming: the client gives up while the engine is generating.
    const ac = new AbortController();
    const pending = fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "hello", max_tokens: 200 }),
      signal: ac.signal,
    }).catch((e: unknown) => e);
    await waitFor(() => engine.active === 1, 500, "the request to start");
    await new Promise((r) => setTimeout(r, 30));
    ac.abort();
    assert.ok((await pending) instanceof Error);
    await waitFor(() => engine.active === 0, 500, "the non-streaming request to end");
    assert.equal(engine.aborted.length, 2);
    assert.equal(await metricValue(url, running), 0);
  });
});

Deno.test("an overloaded engine answers 429 with Retry-After (also through the openai client)", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { stepMs: 5, maxActive: 1 });
  await withServer(engine, { retryAfterSeconds: 2 }, async (url) => {
    const ac = new AbortController();
    const busy = await startStream(url, { max_tokens: 200 }, ac.signal);
    assert.equal(busy.status, 200);
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "again" }),
    });
    assert.equal(res.status, 429);
    assert.equal(res.headers.get("retry-after"), "2");
    const body = await res.json();
    assert.equal(body.error.code, "model_overloaded");
    assert.equal(body.error.type, "rate_limit_error");
    const oa = new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0 });
    await assert.rejects(
      oa.chat.completions.create({
        model: "fake-model",
        messages: [{ role: "user", content: "x" }],
      }),
      (e: unknown) => e instanceof OpenAI.RateLimitError && e.status === 429,
    );
    ac.abort();
    await busy.body?.cancel().catch(() => {});
    await waitFor(() => engine.active === 0, 500, "the busy request to end");
  });
});

Deno.test("/health is 503 until ready, 200 with an empty body when ready", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok);
  await withServer(engine, { ready: false }, async (url, server) => {
    const h1 = await fetch(`${url}/health`);
    assert.equal(h1.status, 503);
    await h1.body?.cancel();
    const r = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "x" }),
    });
    assert.equal(r.status, 503);
    assert.equal((await r.json()).error.code, "model_not_ready");
    server.handle.setReady(true);
    const h2 = await fetch(`${url}/health`);
    assert.equal(h2.status, 200);
    assert.equal(await h2.text(), "");
    assert.equal(server.handle.ready, true);
  });
});

Deno.test("graceful shutdown finishes in-flight streams, refuses new requests, aborts after the grace period", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { stepMs: 4 });
  {
    const server = startServer(engine, { port: 0, onError: () => {} });
    const streams = await Promise.all(
      [0, 1, 2].map(() => startStream(server.url, { max_tokens: 40, temperature: 0 })),
    );
    const shut = server.shutdown(5000);
    const refused = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "late" }),
    });
    assert.equal(refused.status, 503);
    assert.equal((await refused.json()).error.code, "server_shutting_down");
    const health = await fetch(`${server.url}/health`);
    assert.equal(health.status, 503);
    await health.body?.cancel();
    for (const s of streams) {
      const events = await readEvents(s.body!.getReader());
      assert.equal(events.at(-1), "[DONE]");
      const last = JSON.parse(events.at(-2)!);
      assert.equal(last.choices[0].finish_reason, "length");
    }
    await shut;
    await server.finished;
    assert.equal(engine.active, 0);
    assert.equal(server.handle.inFlight, 0);
  }
  {
    const server = startServer(engine, { port: 0, onError: () => {} });
    const s = await startStream(server.url, { max_tokens: 250 });
    const reader = s.body!.getReader();
    const t0 = performance.now();
    const [events] = await Promise.all([readEvents(reader), server.shutdown(50)]);
    assert.ok(performance.now() - t0 < 800, "aborted after the grace period");
    assert.equal(events.at(-1), "[DONE]");
    assert.equal(JSON.parse(events.at(-2)!).error.code, "request_aborted");
    assert.equal(engine.active, 0);
    assert.equal(engine.aborted.length, 1);
  }
});

Deno.test("POST /batch/test runs the experiment on the factory's mock engine and answers seed 000's fields", async () => {
  const configs: BatchTestConfig[] = [];
  const mocks: FakeEngine[] = [];
  let maxActive = Infinity;
  const factory = (config: BatchTestConfig) => {
    configs.push(config);
    const mock = new FakeEngine(null, {
      name: "mock",
      stepMs: config.latencyMs,
      maxModelLen: 64,
      vocabSize: 100,
      maxActive,
    });
    mocks.push(mock);
    return mock;
  };
  const tok = await tinyTokenizer();
  await withServer(new FakeEngine(tok), { batchTest: factory }, async (url) => {
    const run = (body: unknown) =>
      fetch(`${url}/batch/test`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
    const res = await run({ batch_size: 4, num_requests: 10, latency_ms: 5 });
    assert.equal(res.status, 200);
    const r = await res.json();
    assert.deepEqual(Object.keys(r), [
      "batch_size",
      "num_requests",
      "total_requests",
      "successful",
      "failed",
      "avg_server_latency_ms",
      "min_server_latency_ms",
      "max_server_latency_ms",
      "p50_server_latency_ms",
      "p90_server_latency_ms",
      "p99_server_latency_ms",
      "total_time_ms",
      "throughput_requests_per_sec",
      "scheduler",
    ]);
    assert.deepEqual(
      [r.batch_size, r.num_requests, r.total_requests, r.successful, r.failed, r.scheduler],
      [4, 10, 10, 10, 0, "dynamic"],
    );
    assert.ok(r.min_server_latency_ms >= 4, `min ${r.min_server_latency_ms}`);
    assert.ok(r.min_server_latency_ms <= r.p50_server_latency_ms);
    assert.ok(r.p50_server_latency_ms <= r.p90_server_latency_ms);
    assert.ok(r.p90_server_latency_ms <= r.p99_server_latency_ms);
    assert.ok(r.p99_server_latency_ms <= r.max_server_latency_ms);
    assert.ok(r.min_server_latency_ms <= r.avg_server_latency_ms);
    assert.ok(r.avg_server_latency_ms <= r.max_server_latency_ms);
    assert.ok(r.max_server_latency_ms <= r.total_time_ms + 0.01);
    const expectedQps = 10 / (r.total_time_ms / 1000);
    assert.ok(Math.abs(r.throughput_requests_per_sec - expectedQps) / expectedQps < 0.01);
    assert.deepEqual(configs[0], { scheduler: "dynamic", batchSize: 4, latencyMs: 5 });
    const mock = mocks[0]!;
    assert.ok(mock.isShutDown, "the mock engine is shut down afterwards");
    assert.equal(mock.active, 0);
    assert.equal(mock.requests.length, 10);
    for (const req of mock.requests) {
      assert.equal(req.promptTokenIds.length, 16);
      assert.ok(req.promptTokenIds.every((id) => id > 0 && id < 100));
      assert.equal(req.params.maxTokens, 1);
      assert.equal(req.params.ignoreEos, true);
    }

    const c = await (await run({
      batch_size: 2,
      num_requests: 3,
      latency_ms: 1,
      scheduler: "continuous",
      prompt_len: 4,
      output_len: 3,
    })).json();
    assert.equal(c.scheduler, "continuous");
    assert.deepEqual(configs[1], { scheduler: "continuous", batchSize: 2, latencyMs: 1 });
    assert.ok(
      mocks[1]!.requests.every((q) => q.promptTokenIds.length === 4 && q.params.maxTokens === 3),
    );

    // Requests the mock refuses count as failed.
    maxActive = 4;
    const f = await (await run({ batch_size: 4, num_requests: 6, latency_ms: 1 })).json();
    assert.deepEqual([f.successful, f.failed, f.total_requests], [4, 2, 6]);

    for (
      const [body, param] of [
        [{ num_requests: 1, latency_ms: 1 }, "batch_size"],
        [{ batch_size: 0, num_requests: 1, latency_ms: 1 }, "batch_size"],
        [{ batch_size: 1, num_requests: 1, latency_ms: -1 }, "latency_ms"],
        [{ batch_size: 1, num_requests: 1, latency_ms: 1, scheduler: "fifo" }, "scheduler"],
        [
          { batch_size: 1, num_requests: 1, latency_ms: 1, prompt_len: 60, output_len: 10 },
          "prompt_len",
        ],
      ] as const
    ) {
      const bad = await run(body);
      assert.equal(bad.status, 400, JSON.stringify(body));
      assert.equal((await bad.json()).error.param, param);
    }
  });
  await withServer(new FakeEngine(tok), {}, async (url) => {
    const res = await fetch(`${url}/batch/test`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(res.status, 501);
    await res.body?.cancel();
  });
  assert.equal(percentile([1, 2, 3, 4], 50), 2.5);
  assert.equal(percentile([10, 20, 30, 40, 50], 90), 46);
  assert.equal(percentile([7], 99), 7);
});

Deno.test("/v1/models, /tokenize and /detokenize answer vLLM's shapes", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 128 });
  await withServer(engine, { servedModelNames: ["tiny", "tiny-alias"] }, async (url) => {
    const models = await (await fetch(`${url}/v1/models`)).json();
    assert.equal(models.object, "list");
    assert.deepEqual(models.data.map((m: { id: string }) => m.id), ["tiny", "tiny-alias"]);
    assert.equal(models.data[0].object, "model");
    assert.equal(models.data[0].max_model_len, 128);
    assert.equal(models.data[0].vocab_size, engine.model.vocabSize);
    assert.equal(typeof models.data[0].created, "number");
    assert.equal(typeof models.data[0].owned_by, "string");
    const oa = new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0 });
    const listed = [];
    for await (const m of oa.models.list()) listed.push(m.id);
    assert.deepEqual(listed, ["tiny", "tiny-alias"]);
    // One model (OpenAI's retrieve): the list's entry; an id that is not served is a 404.
    assert.deepEqual(await oa.models.retrieve("tiny-alias"), models.data[1]);
    const missing = await fetch(`${url}/v1/models/tiny-other`);
    assert.equal(missing.status, 404);
    const { error } = await missing.json();
    assert.deepEqual([error.param, error.code], ["model", "model_not_found"]);
    const posted = await fetch(`${url}/v1/models/tiny`, { method: "POST" });
    assert.equal(posted.status, 405);
    await posted.body?.cancel();
    // vLLM's /version and SageMaker's /ping (GET or POST, no body), like /health.
    const config = JSON.parse(await Deno.readTextFile(new URL("../deno.json", import.meta.url)));
    assert.equal(VERSION, config.version, "server/version.ts follows deno.json");
    assert.deepEqual(await (await fetch(`${url}/version`)).json(), { version: config.version });
    for (const method of ["GET", "POST"]) {
      const ping = await fetch(`${url}/ping`, { method });
      assert.equal(ping.status, 200, method);
      assert.equal(await ping.text(), "");
    }

    const post = async (path: string, body: unknown) =>
      await (await fetch(`${url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      })).json();
    const text = "Hello, world! 你好";
    const t = await post("/tokenize", { model: "tiny", prompt: text });
    assert.deepEqual(t, {
      count: tok.encode(text).length,
      max_model_len: 128,
      tokens: tok.encode(text),
    });
    const messages = [{ role: "user", content: "hi" }];
    const m = await post("/tokenize", { messages });
    const rendered = tok.applyChatTemplate(messages, { addGenerationPrompt: true });
    assert.deepEqual(m.tokens, tok.encode(rendered, { addSpecialTokens: false }));
    const d = await post("/detokenize", { tokens: t.tokens });
    assert.deepEqual(d, { prompt: text });
    const both = await fetch(`${url}/tokenize`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "x", messages }),
    });
    assert.equal(both.status, 400);
    assert.equal((await both.json()).error.param, "messages");
    // SageMaker's /invocations (as vLLM serves it): chat or completions by the body.
    const direct = {
      chat: await post("/v1/chat/completions", { messages, max_tokens: 3, temperature: 0 }),
      completion: await post("/v1/completions", { prompt: text, max_tokens: 3, temperature: 0 }),
    };
    const via = {
      chat: await post("/invocations", { messages, max_tokens: 3, temperature: 0 }),
      completion: await post("/invocations", { prompt: text, max_tokens: 3, temperature: 0 }),
    };
    assert.equal(via.chat.object, "chat.completion");
    assert.equal(via.chat.choices[0].message.content, direct.chat.choices[0].message.content);
    assert.equal(via.completion.object, "text_completion");
    assert.equal(via.completion.choices[0].text, direct.completion.choices[0].text);
    const neither = await post("/invocations", { input: "x" });
    assert.equal(neither.error.param, "messages");
    const get = await fetch(`${url}/invocations`);
    assert.equal(get.status, 405);
    await get.body?.cancel();
  });
});

Deno.test("streaming sends a chunk for every increment with tokens, even when its text is empty", async () => {
  // Special tokens are left out of the text: echoing them yields increments with a token and no
  // text. vLLM streams those chunks, and `vllm bench serve` times them.
  const tokenizer = await tinyTokenizer();
  const special = [...tokenizer.specialIds][0]!;
  const engine = new FakeEngine(tokenizer);
  await withServer(engine, {}, async (url) => {
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt: [special, special, special],
        max_tokens: 3,
        temperature: 0,
        stream: true,
      }),
    });
    const events = (await res.text()).split("\n\n").filter((e) => e.startsWith("data: {"));
    const choices = events.map((e) => JSON.parse(e.slice(6)).choices[0]).filter((c) => c);
    assert.equal(choices.length, 3, JSON.stringify(choices));
    for (const c of choices) assert.equal(c.text, "");
    assert.equal(choices.at(-1).finish_reason, "length");
  });
});
