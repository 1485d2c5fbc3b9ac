/**
 * What makes the server safe to expose (server/security.ts, the timeouts, cli/serve_flags.ts):
 * the API key, CORS, the Host check against DNS rebinding, JSON-only bodies, the body read
 * timeout and the whole-request timeout.
 */

import assert from "node:assert/strict";
import { LLMEngine } from "../engine/llm_engine.ts";
import { API_KEY_ENV, serveSettingsFromFlags } from "../cli/serve_flags.ts";
import { constantTimeEqual, hostName, isLoopbackHost } from "../server/security.ts";
import { createHandler, type ServerOptions } from "../server/server.ts";
import { FakeEngine, tinyTokenizer, withServer } from "./support/fake_engine.ts";

const JSON_HEADERS = { "content-type": "application/json" };
const completion = JSON.stringify({ prompt: "hello", max_tokens: 2 });

async function handlerFor(options: ServerOptions) {
  const engine = new FakeEngine(await tinyTokenizer());
  return createHandler(engine, { onError: () => {}, ...options }).handler;
}

async function errorOf(res: Response): Promise<{ status: number; code: string | null }> {
  const body = await res.json();
  assert.equal(typeof body.error.message, "string");
  return { status: res.status, code: body.error.code };
}

Deno.test("createHandler() answers 401 without the right API key and keeps /health, /ping, /version and /metrics open", async () => {
  const handler = await handlerFor({ apiKey: "s3cret" });
  const post = (headers: Record<string, string>, path = "/v1/completions") =>
    handler(
      new Request(`http://localhost${path}`, {
        method: "POST",
        headers: { ...JSON_HEADERS, ...headers },
        body: path === "/detokenize" ? '{"tokens": [1]}' : completion,
      }),
    );
  const missing = await post({});
  assert.equal(missing.headers.get("www-authenticate"), "Bearer");
  assert.deepEqual(await errorOf(missing), { status: 401, code: "invalid_api_key" });
  assert.deepEqual(await errorOf(await post({ authorization: "Bearer s3cre" })), {
    status: 401,
    code: "invalid_api_key",
  });
  assert.deepEqual(await errorOf(await post({ authorization: "Basic s3cret" })), {
    status: 401,
    code: "invalid_api_key",
  });
  for (const path of ["/detokenize", "/invocations"]) {
    assert.deepEqual(await errorOf(await post({}, path)), {
      status: 401,
      code: "invalid_api_key",
    }, path);
  }
  const ok = await post({ authorization: "Bearer s3cret" });
  assert.equal(ok.status, 200);
  await ok.body?.cancel();
  for (const path of ["/v1/models", "/v1/models/fake-model"]) {
    const models = await handler(new Request(`http://localhost${path}`));
    assert.equal(models.status, 401, path);
    await models.body?.cancel();
  }
  for (const path of ["/health", "/metrics", "/ping", "/version"]) {
    const res = await handler(new Request(`http://localhost${path}`));
    assert.equal(res.status, 200, path);
    await res.body?.cancel();
  }
  assert.throws(() => createHandler(new FakeEngine(null), { apiKey: "" }), RangeError);
});

Deno.test("constantTimeEqual() compares whole strings, whatever their lengths", () => {
  assert.ok(constantTimeEqual("abc", "abc"));
  assert.ok(!constantTimeEqual("abc", "abd"));
  assert.ok(!constantTimeEqual("abc", "abcd"));
  assert.ok(!constantTimeEqual("", "a"));
  assert.ok(constantTimeEqual("ключ🔑", "ключ🔑"));
});

Deno.test("createHandler() sends no CORS headers by default and answers preflights with 405", async () => {
  const handler = await handlerFor({});
  const pre = await handler(
    new Request("http://localhost/v1/completions", {
      method: "OPTIONS",
      headers: { origin: "https://app.example", "access-control-request-method": "POST" },
    }),
  );
  assert.equal(pre.status, 405);
  assert.equal(pre.headers.get("access-control-allow-origin"), null);
  await pre.body?.cancel();
  const res = await handler(
    new Request("http://localhost/v1/models", { headers: { origin: "https://app.example" } }),
  );
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("access-control-allow-origin"), null);
  await res.body?.cancel();
});

Deno.test("createHandler() with allowedOrigins answers preflights and marks responses, streams and errors", async () => {
  const handler = await handlerFor({ allowedOrigins: ["https://app.example"] });
  const preflight = (origin: string) =>
    handler(
      new Request("http://localhost/v1/chat/completions", {
        method: "OPTIONS",
        headers: {
          origin,
          "access-control-request-method": "POST",
          "access-control-request-headers": "authorization, content-type",
        },
      }),
    );
  const ok = await preflight("https://app.example");
  assert.equal(ok.status, 204);
  assert.equal(ok.headers.get("access-control-allow-origin"), "https://app.example");
  assert.match(ok.headers.get("access-control-allow-methods") ?? "", /POST/);
  assert.match(ok.headers.get("access-control-allow-headers") ?? "", /authorization/);
  assert.match(ok.headers.get("access-control-allow-headers") ?? "", /content-type/);
  assert.deepEqual(await errorOf(await preflight("https://evil.example")), {
    status: 403,
    code: "origin_not_allowed",
  });
  const from = (origin: string, body: string) =>
    handler(
      new Request("http://localhost/v1/completions", {
        method: "POST",
        headers: { ...JSON_HEADERS, origin },
        body,
      }),
    );
  const stream = await from(
    "https://app.example",
    JSON.stringify({ prompt: "hi", max_tokens: 2, stream: true }),
  );
  assert.equal(stream.headers.get("access-control-allow-origin"), "https://app.example");
  assert.equal(stream.headers.get("vary"), "origin");
  assert.match(await stream.text(), /data: \[DONE\]/);
  const bad = await from("https://app.example", "{");
  assert.equal(bad.status, 400);
  assert.equal(bad.headers.get("access-control-allow-origin"), "https://app.example");
  await bad.body?.cancel();
  const other = await from("https://evil.example", completion);
  assert.equal(other.headers.get("access-control-allow-origin"), null);
  await other.body?.cancel();
  const any = await handlerFor({ allowedOrigins: "*" });
  const star = await any(
    new Request("http://localhost/v1/models", { headers: { origin: "https://x.example" } }),
  );
  assert.equal(star.headers.get("access-control-allow-origin"), "*");
  await star.body?.cancel();
});

Deno.test("createHandler() bound to loopback refuses non-loopback Host names (DNS rebinding)", async () => {
  const get = async (handler: (r: Request) => Promise<Response>, host: string) => {
    const res = await handler(new Request(`http://${host}/v1/models`));
    const status = res.status;
    if (status === 403) assert.equal((await errorOf(res)).code, "host_not_allowed");
    else await res.body?.cancel();
    return status;
  };
  const loopback = await handlerFor({ bindHost: "127.0.0.1" });
  assert.equal(await get(loopback, "evil.example"), 403);
  assert.equal(await get(loopback, "evil.example:8000"), 403);
  assert.equal(await get(loopback, "192.168.1.5:8000"), 403);
  for (const host of ["localhost:8000", "127.0.0.1:8000", "127.0.0.2", "[::1]:8000", "LOCALHOST"]) {
    assert.equal(await get(loopback, host), 200, host);
  }
  const widened = await handlerFor({ bindHost: "127.0.0.1", allowedHosts: ["llm.internal"] });
  assert.equal(await get(widened, "llm.internal:8000"), 200);
  assert.equal(await get(widened, "evil.example"), 403);
  const any = await handlerFor({ bindHost: "127.0.0.1", allowedHosts: "*" });
  assert.equal(await get(any, "evil.example"), 200);
  const exposed = await handlerFor({ bindHost: "0.0.0.0" });
  assert.equal(await get(exposed, "evil.example"), 200);
  assert.equal(hostName("[::1]:80"), "::1");
  assert.equal(hostName("Example.COM:443"), "example.com");
  assert.ok(isLoopbackHost("::1") && isLoopbackHost("127.9.9.9") && !isLoopbackHost("128.0.0.1"));
});

Deno.test("createHandler() answers 415 to a POST body that is not declared JSON", async () => {
  const handler = await handlerFor({});
  const post = (headers: Record<string, string>) =>
    handler(
      new Request("http://localhost/v1/completions", { method: "POST", headers, body: completion }),
    );
  for (const type of ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]) {
    assert.deepEqual(await errorOf(await post({ "content-type": type })), {
      status: 415,
      code: "unsupported_media_type",
    });
  }
  // A body with no Content-Type at all (fetch adds text/plain for strings; a Request with a
  // Uint8Array body has none).
  const none = await handler(
    new Request("http://localhost/tokenize", {
      method: "POST",
      body: new TextEncoder().encode('{"prompt": "x"}'),
    }),
  );
  assert.deepEqual(await errorOf(none), { status: 415, code: "unsupported_media_type" });
  for (const type of ["application/json; charset=utf-8", "Application/JSON"]) {
    const ok = await post({ "content-type": type });
    assert.equal(ok.status, 200, type);
    await ok.body?.cancel();
  }
});

Deno.test("createHandler() answers 408 when a request body does not arrive in time", async () => {
  const handler = await handlerFor({ requestReadTimeoutMs: 150 });
  let cancelled = false;
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      c.enqueue(new TextEncoder().encode('{"prompt": "hel'));
    },
    cancel() {
      cancelled = true;
    },
  });
  const t0 = performance.now();
  const res = await handler(
    new Request("http://localhost/v1/completions", { method: "POST", headers: JSON_HEADERS, body }),
  );
  assert.deepEqual(await errorOf(res), { status: 408, code: "request_timeout" });
  assert.ok(performance.now() - t0 < 2000);
  assert.ok(cancelled, "the body stream was cancelled");
});

Deno.test("the request timeout ends a slow generation with 504 or an SSE error event and frees its KV blocks", async () => {
  const engine = LLMEngine.createMock({ mockBaseMs: 20, mockPerTokenMs: 0, numKvBlocks: 64 });
  try {
    await withServer(engine, { requestTimeoutMs: 300 }, async (url) => {
      const post = (stream: boolean) =>
        fetch(`${url}/v1/completions`, {
          method: "POST",
          headers: JSON_HEADERS,
          body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 500, ignore_eos: true, stream }),
        });
      const [plain, streamed] = await Promise.all([post(false), post(true)]);
      assert.deepEqual(await errorOf(plain), { status: 504, code: "request_timeout" });
      assert.equal(streamed.status, 200);
      const events = (await streamed.text()).split("\n\n").filter((e) => e !== "");
      assert.equal(events.at(-1), "data: [DONE]");
      assert.equal(JSON.parse(events.at(-2)!.slice(6)).error.code, "request_timeout");
      for (let i = 0; i < 50 && engine.stats().numRunning > 0; i++) {
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.equal(engine.stats().numRunning, 0);
      assert.equal(engine.stats().kvBlocksUsed, 0);
      // A short request still succeeds.
      const quick = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: JSON_HEADERS,
        body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 2 }),
      });
      assert.equal(quick.status, 200);
      await quick.body?.cancel();
    });
  } finally {
    await engine.shutdown();
  }
});

Deno.test("serveSettingsFromFlags() reads the key from the flag or the environment and rejects bad values", () => {
  const env = (value: string | undefined) => (name: string) =>
    name === API_KEY_ENV ? value : undefined;
  assert.equal(serveSettingsFromFlags({}, env(undefined)).server.apiKey, null);
  assert.equal(serveSettingsFromFlags({}, env("from-env")).server.apiKey, "from-env");
  assert.equal(
    serveSettingsFromFlags({ "api-key": "flag" }, env("from-env")).server.apiKey,
    "flag",
  );
  const s = serveSettingsFromFlags({
    "allowed-origins": "https://a.example, https://b.example",
    "allowed-hosts": "*",
    "request-read-timeout-s": "2.5",
    "request-timeout-s": "60",
    "keep-alive-timeout-s": "0.5",
  }, env(undefined));
  assert.deepEqual(s.server.allowedOrigins, ["https://a.example", "https://b.example"]);
  assert.equal(s.server.allowedHosts, "*");
  assert.equal(s.server.requestReadTimeoutMs, 2500);
  assert.equal(s.server.requestTimeoutMs, 60_000);
  assert.equal(s.server.keepAliveTimeoutMs, 500);
  assert.throws(
    () => serveSettingsFromFlags({ "keep-alive-timeout-s": "0" }, env(undefined)),
    /--keep-alive-timeout-s expects seconds > 0/,
  );
  assert.equal(serveSettingsFromFlags({}, env(undefined)).server.requestReadTimeoutMs, 30_000);
  assert.throws(
    () => serveSettingsFromFlags({ "api-key": " " }, env(undefined)),
    /must not be empty/,
  );
  assert.throws(
    () => serveSettingsFromFlags({ "request-timeout-s": "-1" }, env(undefined)),
    /--request-timeout-s/,
  );
  assert.throws(
    () => serveSettingsFromFlags({ "allowed-origins": "," }, env(undefined)),
    /--allowed-origins/,
  );
  // vLLM's form: a JSON list.
  const json = (text: string) =>
    serveSettingsFromFlags({ "allowed-origins": text }, env(undefined)).server.allowedOrigins;
  assert.deepEqual(json('["https://a.example", " https://b.example"]'), [
    "https://a.example",
    "https://b.example",
  ]);
  assert.equal(json('["*"]'), "*");
  assert.throws(() => json('["a", 1]'), /--allowed-origins expects .* a JSON list of strings/);
  assert.throws(() => json("[not json"), /--allowed-origins expects/);
  assert.throws(() => serveSettingsFromFlags({ port: "99999" }, env(undefined)), /--port/);
});
