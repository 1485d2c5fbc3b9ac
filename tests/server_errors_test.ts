/**
 * HTTP server error handling: every bad input gets its exact status code and an OpenAI-style
 * error body naming the parameter; engine errors map to 400 / 429 / 503 / 500.
 */

import assert from "node:assert/strict";
import { EngineDeadError, EngineOverloadedError } from "../engine/engine_api.ts";
import { kernelSeed } from "../scheduler/sampling_params.ts";
import { FakeEngine, tinyTokenizer, withServer } from "./support/fake_engine.ts";
import { post } from "./support/http.ts";

interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

async function expectError(
  res: Response,
  status: number,
  param: string | null,
  code: string | null,
  context: string,
): Promise<ErrorBody> {
  const text = await res.text();
  assert.equal(res.status, status, `${context}: status (body ${text})`);
  assert.match(res.headers.get("content-type") ?? "", /application\/json/, context);
  const body: unknown = JSON.parse(text);
  assert.ok(typeof body === "object" && body !== null && "error" in body, context);
  const err = (body as ErrorBody).error;
  assert.deepEqual(Object.keys(err).sort(), ["code", "message", "param", "type"], context);
  assert.equal(typeof err.message, "string");
  assert.ok(err.message.length > 0, context);
  assert.ok(!/\n\s+at /.test(err.message), `${context}: no stack trace in ${err.message}`);
  assert.equal(err.param, param, `${context}: param`);
  if (code !== null) assert.equal(err.code, code, `${context}: code`);
  return body as ErrorBody;
}

const chat = (extra: Record<string, unknown>) => ({
  messages: [{ role: "user", content: "hi" }],
  ...extra,
});
const completion = (extra: Record<string, unknown>) => ({ prompt: "hello", ...extra });

Deno.test("invalid request bodies answer 400 with the offending parameter named", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  const C = "/v1/completions";
  const CH = "/v1/chat/completions";
  const cases: [string, string, unknown, string | null, string][] = [
    ["malformed JSON", C, "{", null, "invalid_json"],
    ["not an object", C, "[1, 2]", null, "invalid_type"],
    ["missing prompt", C, {}, "prompt", "missing_required_parameter"],
    ["missing messages", CH, {}, "messages", "missing_required_parameter"],
    ["prompt of wrong type", C, { prompt: 5 }, "prompt", "invalid_value"],
    ["empty message list", CH, { messages: [] }, "messages", "invalid_value"],
    [
      "content of wrong type",
      CH,
      { messages: [{ role: "user", content: 5 }] },
      "messages.0.content",
      "invalid_value",
    ],
    [
      "missing role",
      CH,
      { messages: [{ content: "x" }] },
      "messages.0.role",
      "missing_required_parameter",
    ],
    ["temperature string", C, completion({ temperature: "hot" }), "temperature", "invalid_type"],
    ["temperature < 0", C, completion({ temperature: -0.1 }), "temperature", "invalid_value"],
    ["top_p 0", C, completion({ top_p: 0 }), "top_p", "invalid_value"],
    ["top_p > 1", CH, chat({ top_p: 1.5 }), "top_p", "invalid_value"],
    ["top_k < -1", C, completion({ top_k: -2 }), "top_k", "invalid_value"],
    ["min_p > 1", C, completion({ min_p: 2 }), "min_p", "invalid_value"],
    ["n 0", C, completion({ n: 0 }), "n", "invalid_value"],
    ["n fractional", CH, chat({ n: 1.5 }), "n", "invalid_type"],
    ["max_tokens 0", C, completion({ max_tokens: 0 }), "max_tokens", "invalid_value"],
    [
      "max_completion_tokens 0",
      CH,
      chat({ max_completion_tokens: 0 }),
      "max_completion_tokens",
      "invalid_value",
    ],
    ["min_tokens < 0", C, completion({ min_tokens: -1 }), "min_tokens", "invalid_value"],
    [
      "presence_penalty > 2",
      C,
      completion({ presence_penalty: 3 }),
      "presence_penalty",
      "invalid_value",
    ],
    [
      "frequency_penalty < -2",
      C,
      completion({ frequency_penalty: -3 }),
      "frequency_penalty",
      "invalid_value",
    ],
    [
      "repetition_penalty 0",
      C,
      completion({ repetition_penalty: 0 }),
      "repetition_penalty",
      "invalid_value",
    ],
    ["logprobs > 20", C, completion({ logprobs: 21 }), "logprobs", "invalid_value"],
    ["chat logprobs int", CH, chat({ logprobs: 3 }), "logprobs", "invalid_type"],
    [
      "top_logprobs without logprobs",
      CH,
      chat({ top_logprobs: 2 }),
      "top_logprobs",
      "invalid_value",
    ],
    ["stop of wrong type", C, completion({ stop: 3 }), "stop", "invalid_value"],
    [
      "stop_token_ids negative",
      C,
      completion({ stop_token_ids: [-1] }),
      "stop_token_ids.0",
      "invalid_value",
    ],
    ["seed string", C, completion({ seed: "x" }), "seed", "invalid_type"],
    ["stream string", C, completion({ stream: "yes" }), "stream", "invalid_type"],
    [
      "logit_bias value",
      C,
      completion({ logit_bias: { "5": 200 } }),
      "logit_bias.5",
      "invalid_value",
    ],
    ["logit_bias key", C, completion({ logit_bias: { "abc": 1 } }), "logit_bias", "invalid_value"],
    [
      "logit_bias id out of vocab",
      C,
      completion({ logit_bias: { "999999": 1 } }),
      "logit_bias",
      "invalid_value",
    ],
    ["empty prompt", C, completion({ prompt: "" }), "prompt", "invalid_value"],
    ["empty token list", C, completion({ prompt: [] }), "prompt", "invalid_value"],
    ["token id out of vocab", C, completion({ prompt: [1, 999999] }), "prompt.1", "invalid_value"],
    [
      "token id out of vocab, nested",
      C,
      completion({ prompt: [[1], [2, 999999]] }),
      "prompt.1.1",
      "invalid_value",
    ],
    ["seed not an integer", C, completion({ seed: 1.5 }), "seed", "invalid_value"],
    ["best_of above n", C, completion({ best_of: 1000 }), "best_of", "not_supported"],
    ["empty stop string", C, completion({ stop: [""] }), "stop.0", "invalid_value"],
    ["empty stop string alone", C, completion({ stop: "" }), "stop.0", "invalid_value"],
    [
      "too many stop strings",
      C,
      completion({ stop: Array.from({ length: 10_000 }, (_, i) => `s${i}`) }),
      "stop",
      "invalid_value",
    ],
    [
      "stop_token_ids out of vocab",
      C,
      completion({ stop_token_ids: [1, 999999] }),
      "stop_token_ids.1",
      "invalid_value",
    ],
    [
      "min_tokens above max_tokens",
      C,
      completion({ min_tokens: 5, max_tokens: 2 }),
      "min_tokens",
      "invalid_value",
    ],
    [
      "min_tokens above chat budget",
      CH,
      chat({ min_tokens: 9, max_completion_tokens: 3 }),
      "min_tokens",
      "invalid_value",
    ],
    [
      "max_completion_tokens 0",
      CH,
      chat({ max_completion_tokens: 0 }),
      "max_completion_tokens",
      "invalid_value",
    ],
    [
      "top_logprobs 21",
      CH,
      chat({ logprobs: true, top_logprobs: 21 }),
      "top_logprobs",
      "invalid_value",
    ],
    ["n 0", C, completion({ n: 0 }), "n", "invalid_value"],
    ["n 129", C, completion({ n: 129 }), "n", "invalid_value"],
    ["top_k -2", C, completion({ top_k: -2 }), "top_k", "invalid_value"],
    [
      "chat role outside OpenAI's set",
      CH,
      { messages: [{ role: "alien", content: "x" }] },
      "messages.0.role",
      "invalid_value",
    ],
    [
      "response_format of an unknown type",
      CH,
      chat({ response_format: { type: "xml" } }),
      "response_format",
      "invalid_value",
    ],
    [
      "structured_outputs with no choice",
      C,
      completion({ structured_outputs: { choice: [] } }),
      "structured_outputs.choice",
      "invalid_value",
    ],
    [
      "two structured-output constraints",
      C,
      completion({ guided_regex: "[a-z]+", guided_choice: ["a", "b"] }),
      "guided_choice",
      "invalid_value",
    ],
    [
      "a tool without a name",
      CH,
      chat({ tools: [{ type: "function", function: { parameters: {} } }] }),
      "tools.0.function.name",
      "invalid_value",
    ],
    [
      "tool_choice required without tools",
      CH,
      chat({ tool_choice: "required" }),
      "tool_choice",
      "invalid_value",
    ],
    [
      "guided_json that is not JSON",
      C,
      completion({ guided_json: "{not json" }),
      "guided_json",
      "invalid_value",
    ],
    [
      "detokenize out of vocab",
      "/detokenize",
      { tokens: [1, 999999] },
      "tokens.1",
      "invalid_value",
    ],
    [
      "prompt too long",
      C,
      completion({ prompt: Array(64).fill(5) }),
      "prompt",
      "context_length_exceeded",
    ],
    [
      "chat prompt too long",
      CH,
      chat({ messages: [{ role: "user", content: "word ".repeat(80) }] }),
      "messages",
      "context_length_exceeded",
    ],
    [
      "max_tokens past context",
      C,
      completion({ prompt: [1, 2, 3], max_tokens: 62 }),
      "max_tokens",
      "context_length_exceeded",
    ],
    [
      "prompt_logprobs above 20",
      C,
      completion({ prompt_logprobs: 21 }),
      "prompt_logprobs",
      "invalid_value",
    ],
    [
      "prompt_logprobs negative",
      CH,
      chat({ prompt_logprobs: -1 }),
      "prompt_logprobs",
      "invalid_value",
    ],
    [
      "prompt_logprobs not an integer",
      C,
      completion({ prompt_logprobs: 1.5 }),
      "prompt_logprobs",
      "invalid_type",
    ],
    [
      "prompt_logprobs negative with echo and logprobs",
      C,
      completion({ echo: true, logprobs: 1, prompt_logprobs: -1 }),
      "prompt_logprobs",
      "invalid_value",
    ],
    [
      "logprobs above 20 with echo",
      C,
      completion({ echo: true, logprobs: 21, prompt_logprobs: 1 }),
      "logprobs",
      "invalid_value",
    ],
    [
      "stream_options without stream",
      CH,
      chat({ stream_options: { include_usage: true } }),
      "stream_options",
      "invalid_value",
    ],
    ["tokenize bad", "/tokenize", { prompt: 3 }, "prompt", "invalid_type"],
    ["detokenize bad", "/detokenize", { tokens: ["a"] }, "tokens.0", "invalid_type"],
  ];
  await withServer(engine, {}, async (url) => {
    for (const [name, path, body, param, code] of cases) {
      await expectError(await post(url, path, body), 400, param, code, name);
    }
    // Unknown model: 404 naming `model`.
    for (const path of [C, CH, "/tokenize"]) {
      const body = path === CH ? chat({ model: "gpt-9" }) : completion({ model: "gpt-9" });
      const { error } = await expectError(
        await post(url, path, body),
        404,
        "model",
        "model_not_found",
        path,
      );
      assert.match(error.message, /gpt-9/);
    }
    // Accepted as they are honoured: any integer seed (n > 1 too), best_of equal to n,
    // response_format text, tool_choice none without tools, a known chat role.
    for (
      const body of [
        completion({ seed: -1, max_tokens: 2 }),
        completion({ seed: 4294967296, max_tokens: 2 }),
        completion({ seed: 4294967295, n: 2, max_tokens: 2 }),
        completion({ seed: -(2 ** 62), n: 3, best_of: 3, max_tokens: 2 }),
        chat({ response_format: { type: "text" }, tool_choice: "none", max_tokens: 2 }),
        chat({ messages: [{ role: "developer", content: "be brief" }], max_tokens: 2 }),
      ]
    ) {
      const path = "messages" in body ? CH : C;
      const res = await post(url, path, body);
      assert.equal(res.status, 200, `${JSON.stringify(body)}: ${await res.text()}`);
    }
    // The boundary is accepted: 63 prompt tokens + 1 = max_model_len.
    const ok = await post(url, C, completion({ prompt: Array(63).fill(5), max_tokens: 1 }));
    assert.equal(ok.status, 200);
    await ok.body?.cancel();
  });
  assert.equal(engine.active, 0);
  // 1 + 2 + 3 + 1 + 1 engine requests above, then the boundary one.
  assert.equal(engine.requests.length, 10, "no invalid request reached the engine");
  const seeds = engine.requests.slice(0, 7).map((r) => r.params.seed);
  // Choice i uses seed + i, exactly, then mapped into 32 bits (4294967295 + 1 = 2^32).
  assert.deepEqual(seeds.slice(0, 5), [
    kernelSeed(-1),
    kernelSeed(2 ** 32),
    4294967295,
    kernelSeed(2 ** 32),
    kernelSeed(-(2 ** 62)),
  ]);
});

Deno.test("oversized bodies answer 413, with or without Content-Length; methods and paths 405 / 404", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok);
  await withServer(engine, { maxBodyBytes: 1000 }, async (url) => {
    const big = JSON.stringify(completion({ user: "x".repeat(2000) }));
    await expectError(
      await post(url, "/v1/completions", big),
      413,
      null,
      "request_too_large",
      "content-length",
    );
    // A chunked body (no Content-Length) is refused while reading: the 413 arrives although the
    // client never finishes its body.
    const conn = await Deno.connect({
      hostname: "127.0.0.1",
      port: new URL(url).port === "" ? 80 : Number(new URL(url).port),
    });
    const enc = new TextEncoder();
    await conn.write(enc.encode(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n" +
        "Content-Type: application/json\r\n\r\n",
    ));
    const chunk = "x".repeat(500);
    for (let i = 0; i < 4; i++) {
      await conn.write(enc.encode(`${chunk.length.toString(16)}\r\n${chunk}\r\n`));
    }
    const buf = new Uint8Array(4096);
    const n = await conn.read(buf);
    conn.close();
    const head = new TextDecoder().decode(buf.subarray(0, n ?? 0));
    assert.match(head, /^HTTP\/1\.1 413 /, head);
    assert.match(head, /request_too_large/, head);
    // Just under the limit is fine.
    const small = JSON.stringify(completion({ max_tokens: 1, user: "x".repeat(900) }));
    const ok = await post(url, "/v1/completions", small);
    assert.equal(ok.status, 200);
    await ok.body?.cancel();

    const get = await fetch(`${url}/v1/chat/completions`);
    await expectError(get, 405, null, "method_not_allowed", "GET chat");
    assert.equal(get.headers.get("allow"), "POST");
    const del = await fetch(`${url}/health`, { method: "POST" });
    await expectError(del, 405, null, "method_not_allowed", "POST health");
    assert.equal(del.headers.get("allow"), "GET");
    await expectError(await fetch(`${url}/v2/nothing`), 404, null, "not_found", "unknown path");
  });
});

Deno.test("engine errors map to 400, 429 with Retry-After, 503 and 500, thrown at once or at the first output", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok);
  const errors: unknown[] = [];
  await withServer(
    engine,
    { retryAfterSeconds: 3, onError: (e) => errors.push(e) },
    async (url) => {
      const cases: [Error, number, string][] = [
        [new RangeError("Cannot generate: prompt too long for the KV cache"), 400, "invalid_value"],
        [new TypeError("Cannot generate: bad params"), 400, "invalid_value"],
        [new EngineOverloadedError("waiting queue full"), 429, "model_overloaded"],
        [new EngineDeadError("device lost"), 503, "engine_dead"],
        [new Error("boom"), 500, "internal_error"],
      ];
      for (const mode of ["sync", "async"] as const) {
        for (const [error, status, code] of cases) {
          for (const stream of [false, true]) {
            engine.failNext = { error, mode };
            const res = await post(url, "/v1/completions", completion({ stream }));
            const context = `${error.name} ${mode} stream=${stream}`;
            const { error: e } = await expectError(res, status, null, code, context);
            if (status === 400) assert.equal(e.message, error.message, context);
            if (status === 429) assert.equal(res.headers.get("retry-after"), "3", context);
            if (status === 500) assert.equal(e.message, "Internal server error (Error: boom)");
          }
        }
      }
      assert.equal(errors.length, 4, "unexpected errors are reported to onError");
      assert.equal(engine.active, 0);
      // n = 3 where the third choice is refused: the first two are aborted.
      engine.failNext = { error: new EngineOverloadedError("full"), mode: "sync", after: 2 };
      await expectError(
        await post(url, "/v1/completions", completion({ n: 3 })),
        429,
        null,
        null,
        "n=3",
      );
      assert.equal(engine.active, 0);
      assert.equal(engine.aborted.length, 2);

      // A dead engine: 503 for inference, /health 503.
      assert.equal((await fetch(`${url}/health`)).status, 200);
      engine.kill(new Error("device lost"));
      const dead = await post(url, "/v1/chat/completions", chat({}));
      const { error } = await expectError(dead, 503, null, "engine_dead", "dead engine");
      assert.match(error.message, /device lost/);
      const health = await fetch(`${url}/health`);
      assert.equal(health.status, 503);
      assert.equal(await health.text(), "");
    },
  );
});
