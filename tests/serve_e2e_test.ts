/**
 * `main.ts serve` end to end: a real server process with the real engine on a tiny model
 * (WebGPU through lavapipe), driven over loopback by the official `openai` client and by fetch.
 *
 * @module
 */

import assert from "node:assert/strict";
// deno-lint-ignore no-import-prefix
import OpenAI from "npm:openai@7.57.0";
import { makeModel } from "../tools/make_model.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { type ServerProcess, startServe, stopServe } from "./support/serve_process.ts";

async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name}{`));
  assert.ok(line !== undefined, `metric ${name} missing`);
  return Number(line.split(" ").at(-1));
}

Deno.test(
  "serve answers the openai client, and 64 concurrent greedy streams equal each request alone",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    await makeModel({ out: dir, preset: "tiny-qwen3", seed: 7 });
    const server = await startServe(dir, ["--max-num-seqs", "64"]);
    try {
      // The server says where it listens before the model is loaded, then that it serves.
      const listening = server.log.findIndex((l) => l.startsWith("Listening on"));
      const serving = server.log.findIndex((l) => l.startsWith("Serving"));
      assert.ok(listening >= 0 && serving > listening, server.log.join("\n"));
      assert.ok(
        server.log.some((l) => /^KV cache: [\d,]+ blocks x 16 tokens = [\d,]+ tokens$/.test(l)),
      );
      assert.ok(
        server.log.some((l) =>
          /^Maximum concurrency for [\d,]+ tokens per request: [\d.]+x$/.test(l)
        ),
      );
      // 8 sub-batches of the 64 logits rows (min(2,048 tokens, 8 x 64)).
      assert.ok(
        server.log.some((l) => l.startsWith("Sampler: 512 rows per step")),
        server.log.join("\n"),
      );

      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused" });
      const models = await client.models.list();
      const name = models.data[0]!.id;
      const chat = await client.chat.completions.create({
        model: name,
        messages: [{ role: "user", content: "Hello there" }],
        max_completion_tokens: 8,
        temperature: 0,
      });
      assert.equal(
        chat.choices[0]!.finish_reason === "length" || chat.choices[0]!.finish_reason === "stop",
        true,
      );
      assert.ok((chat.usage?.completion_tokens ?? 0) >= 1);

      // 8 distinct prompts, each sent by 8 of the 64 concurrent streams.
      const prompt = (i: number) =>
        `Request number ${i % 8}: tell me about ${"abc".repeat((i % 8) % 5)}`;
      const alone = async (i: number) => {
        const r = await client.completions.create({
          model: name,
          prompt: prompt(i),
          max_tokens: 12,
          temperature: 0,
        });
        return r.choices[0]!.text;
      };
      const streamed = async (i: number) => {
        const stream = await client.completions.create({
          model: name,
          prompt: prompt(i),
          max_tokens: 12,
          temperature: 0,
          stream: true,
        });
        let text = "";
        for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
        return text;
      };
      const expected: string[] = [];
      for (let i = 0; i < 8; i++) expected.push(await alone(i));
      const all = await Promise.all(Array.from({ length: 64 }, (_, i) => streamed(i)));
      all.forEach((text, i) => assert.equal(text, expected[i % 8], `stream ${i}`));
      assert.equal(await metric(server.url, "vllm:num_requests_running"), 0);
      assert.equal(await metric(server.url, "vllm:kv_cache_usage_perc"), 0);
    } finally {
      const status = await stopServe(server);
      assert.equal(status.code, 0, server.log.join("\n"));
      await Deno.remove(dir, { recursive: true });
    }
  },
);

Deno.test(
  "serve frees a request's KV blocks when its client disconnects, and drains on SIGTERM",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    await makeModel({ out: dir, preset: "tiny-gpt2", seed: 3 });
    const server = await startServe(dir, ["--shutdown-timeout", "20"]);
    try {
      const body = JSON.stringify({
        prompt: "x",
        max_tokens: 1500,
        ignore_eos: true,
        stream: true,
      });
      const ac = new AbortController();
      const res = await fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body,
        signal: ac.signal,
      });
      const reader = res.body!.getReader();
      await reader.read(); // the first chunk arrived: the request is running
      assert.equal(await metric(server.url, "vllm:num_requests_running"), 1);
      ac.abort(); // the client goes away mid-stream
      await reader.cancel().catch(() => {});
      let running = 1;
      let usage = 1;
      for (let i = 0; i < 100 && (running > 0 || usage > 0); i++) {
        await new Promise((r) => setTimeout(r, 20));
        running = await metric(server.url, "vllm:num_requests_running");
        usage = await metric(server.url, "vllm:kv_cache_usage_perc");
      }
      assert.equal(running, 0);
      assert.equal(usage, 0);

      // An in-flight request finishes although SIGTERM arrives while it runs.
      const inFlight = fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "y", max_tokens: 40, ignore_eos: true }),
      }).then((r) => r.json());
      await new Promise((r) => setTimeout(r, 100));
      server.child.kill("SIGTERM");
      const done = await inFlight;
      assert.equal(done.choices[0].finish_reason, "length");
      assert.equal(done.usage.completion_tokens, 40);
      const status = await server.exited;
      assert.equal(status.code, 0, server.log.join("\n"));
    } finally {
      try {
        server.child.kill("SIGKILL");
      } catch { /* already exited */ }
      await server.exited;
      await Deno.remove(dir, { recursive: true });
    }
  },
);

/** Starts `main.ts serve --executor mock` (no GPU, no model: token-id prompts only). */
function startMockServe(flags: string[]): Promise<ServerProcess> {
  return startServe("", ["--executor", "mock", ...flags]);
}

async function complete(url: string, body: unknown): Promise<Response> {
  return await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
}

Deno.test("serve answers 429 with Retry-After when the waiting queue is full, and 400 for a request no KV cache could hold", async () => {
  const server = await startMockServe([
    "--max-num-seqs",
    "1",
    "--max-waiting-requests",
    "1",
    "--mock-base-ms",
    "20",
    "--num-kv-blocks",
    "8",
  ]);
  try {
    const body = { prompt: [1, 2, 3], max_tokens: 20, ignore_eos: true };
    const responses = await Promise.all(
      Array.from({ length: 6 }, () => complete(server.url, body)),
    );
    const statuses = responses.map((r) => r.status).sort();
    assert.ok(statuses.includes(200), `statuses ${statuses}`);
    const overloaded = responses.filter((r) => r.status === 429);
    responses.sort((a, b) => (a === overloaded[0] ? -1 : b === overloaded[0] ? 1 : 0));
    assert.ok(overloaded.length >= 1, `statuses ${statuses}`);
    assert.equal(overloaded[0]!.headers.get("retry-after"), "1");
    const error = (await overloaded[0]!.json()).error;
    assert.match(error.message, /overloaded/);
    await Promise.all(responses.slice(1).map((r) => r.bodyUsed ? null : r.body?.cancel()));
    // 8 blocks x 16 tokens = 128 slots: a 120-token prompt with 40 new tokens never fits.
    const tooBig = await complete(server.url, { prompt: new Array(120).fill(5), max_tokens: 40 });
    assert.equal(tooBig.status, 400);
    assert.match((await tooBig.json()).error.message, /the cache holds 128/);
  } finally {
    assert.equal((await stopServe(server)).code, 0);
  }
});

Deno.test("serve fails in-flight requests and turns /health 503 when the device is lost, without hanging", async () => {
  // Kept alive to observe the 503s (by default the process exits with status 1: see below).
  const server = await startMockServe([
    "--mock-base-ms",
    "5",
    "--mock-fail-at-step",
    "10",
    "--keep-alive-on-fatal",
  ]);
  try {
    assert.equal((await fetch(`${server.url}/health`)).status, 200);
    const res = await complete(server.url, {
      prompt: [1, 2, 3],
      max_tokens: 100,
      ignore_eos: true,
      stream: true,
    });
    // The stream starts, then ends with an error event (and [DONE]) when the step fails.
    assert.equal(res.status, 200);
    const text = await res.text();
    assert.match(text, /"error"/);
    assert.match(text, /GPU device lost/);
    const health = await fetch(`${server.url}/health`);
    await health.body?.cancel();
    assert.equal(health.status, 503);
    const after = await complete(server.url, { prompt: [1], max_tokens: 2 });
    assert.equal(after.status, 503);
    await after.body?.cancel();
  } finally {
    assert.equal((await stopServe(server)).code, 0);
  }
});

Deno.test(
  "serve with the real engine: seeds reproduce, n > 1, stop strings and logprobs through the openai client",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    await makeModel({ out: dir, preset: "tiny-llama", seed: 11 });
    const server = await startServe(dir);
    try {
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused" });
      const model = (await client.models.list()).data[0]!.id;
      const sampled = (seed: number) =>
        client.completions.create({
          model,
          prompt: "Once upon a time",
          max_tokens: 12,
          temperature: 1,
          top_p: 0.9,
          seed,
          n: 3,
        });
      const a = await sampled(42);
      const b = await sampled(42);
      const c = await sampled(43);
      assert.equal(a.choices.length, 3);
      assert.deepEqual(
        a.choices.map((x) => x.text),
        b.choices.map((x) => x.text),
        "same seed, same texts",
      );
      assert.notDeepEqual(
        a.choices.map((x) => x.text),
        c.choices.map((x) => x.text),
        "another seed differs",
      );
      assert.equal(new Set(a.choices.map((x) => x.index)).size, 3);

      // A stop string taken from the greedy output ends the text right before it.
      const greedy = await client.completions.create({
        model,
        prompt: "Hello",
        max_tokens: 24,
        temperature: 0,
      });
      const full = greedy.choices[0]!.text;
      const stop = full.slice(6, 9);
      assert.ok(
        stop.length === 3 && full.indexOf(stop) >= 0,
        `greedy text ${JSON.stringify(full)}`,
      );
      const stopped = await client.completions.create({
        model,
        prompt: "Hello",
        max_tokens: 24,
        temperature: 0,
        stop: [stop],
      });
      assert.equal(stopped.choices[0]!.text, full.slice(0, full.indexOf(stop)));
      assert.equal(stopped.choices[0]!.finish_reason, "stop");

      // Chat logprobs: one entry per token, each with the requested number of alternatives.
      const chat = await client.chat.completions.create({
        model,
        messages: [{ role: "user", content: "Hi" }],
        max_completion_tokens: 5,
        temperature: 0,
        logprobs: true,
        top_logprobs: 3,
      });
      const content = chat.choices[0]!.logprobs?.content ?? [];
      assert.equal(content.length, chat.usage?.completion_tokens);
      for (const entry of content) {
        assert.ok(entry.logprob <= 0);
        assert.equal(entry.top_logprobs.length, 3);
        // Greedy: the chosen token is the most likely one.
        assert.ok(Math.abs(entry.top_logprobs[0]!.logprob - entry.logprob) < 1e-4);
      }
    } finally {
      assert.equal((await stopServe(server)).code, 0);
      await Deno.remove(dir, { recursive: true });
    }
  },
);

Deno.test("serve exits with status 1 within 5 s of a fatal engine error, saying why in one line", async () => {
  // The mock executor's 3rd step fails as a lost device would.
  const server = await startServe("", ["--executor", "mock", "--mock-fail-at-step", "3"]);
  const res = await fetch(`${server.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 8, ignore_eos: true }),
  });
  const body = await res.json();
  assert.ok(res.status === 503 || res.status === 500, JSON.stringify(body));
  const t0 = performance.now();
  const timeout = new Promise<"timeout">((r) =>
    Deno.unrefTimer(setTimeout(() => r("timeout"), 5000))
  );
  const status = await Promise.race([server.exited, timeout]);
  if (status === "timeout") server.child.kill("SIGKILL");
  assert.notEqual(status, "timeout", `still running after 5 s: ${server.log.join("\n")}`);
  assert.equal((status as Deno.CommandStatus).code, 1);
  assert.ok(performance.now() - t0 < 5000);
  const fatal = server.log.filter((l) => l.startsWith("[engine] fatal:"));
  assert.equal(fatal.length, 1, server.log.join("\n"));
  // Deno's current request-abort behaviour (deno.json "unstable": ["no-legacy-abort"]): no
  // warning about request.signal.
  assert.ok(!server.log.some((l) => /legacy behavior/.test(l)), server.log.join("\n"));
  assert.match(fatal[0]!, /GPU device lost/);
});

Deno.test("serve --keep-alive-on-fatal answers 503 after a fatal engine error instead of exiting", async () => {
  const server = await startServe("", [
    "--executor",
    "mock",
    "--mock-fail-at-step",
    "2",
    "--keep-alive-on-fatal",
  ]);
  try {
    const post = () =>
      fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 8, ignore_eos: true }),
      });
    await (await post()).body?.cancel();
    await new Promise((r) => setTimeout(r, 300));
    const health = await fetch(`${server.url}/health`);
    await health.body?.cancel();
    assert.equal(health.status, 503);
    const again = await post();
    assert.equal(again.status, 503);
    assert.equal((await again.json()).error.code, "engine_dead");
    assert.equal(server.log.filter((l) => l.startsWith("[engine] fatal:")).length, 1);
  } finally {
    const status = await stopServe(server);
    assert.equal(status.code, 0);
  }
});
