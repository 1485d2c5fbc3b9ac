import assert from "node:assert/strict";
import { type CompletionRequest, SseParser, streamCompletion } from "../bench/serve/sse_client.ts";

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Runs `fn` against a loopback server answering with `handler`, then shuts it down. */
async function withServer(
  handler: (req: Request) => Response | Promise<Response>,
  fn: (url: string) => Promise<void>,
): Promise<void> {
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, handler);
  try {
    await fn(`http://127.0.0.1:${server.addr.port}`);
  } finally {
    await server.shutdown();
  }
}

/** A streaming response that writes `pieces` one network write at a time, `gapMs` apart. */
function slowStream(pieces: readonly string[], gapMs: number, status = 200): Response {
  const enc = new TextEncoder();
  const body = new ReadableStream<Uint8Array>({
    async start(controller) {
      for (const p of pieces) {
        controller.enqueue(enc.encode(p));
        await sleep(gapMs);
      }
      controller.close();
    },
  });
  return new Response(body, { status, headers: { "content-type": "text/event-stream" } });
}

const chunk = (text: string) =>
  `data: ${JSON.stringify({ object: "text_completion", choices: [{ index: 0, text }] })}\r\n\r\n`;
const usage = (prompt: number, completion: number) =>
  `data: ${
    JSON.stringify({
      choices: [],
      usage: { prompt_tokens: prompt, completion_tokens: completion },
    })
  }\n\n`;

function request(url: string, over: Partial<CompletionRequest> = {}): CompletionRequest {
  return {
    baseUrl: url,
    model: "m",
    prompt: [1, 2, 3],
    promptTokens: 3,
    maxTokens: 3,
    ignoreEos: true,
    temperature: 0,
    timeoutMs: 10_000,
    ...over,
  };
}

/** Splits `s` into pieces of at most `n` characters. */
function pieces(s: string, n: number): string[] {
  const out: string[] = [];
  for (let i = 0; i < s.length; i += n) out.push(s.slice(i, i + n));
  return out;
}

Deno.test("SseParser joins events split anywhere, with LF, CRLF or CR line ends", () => {
  const text = ': comment\r\ndata: {"a":1}\r\n\r\nevent: x\ndata: line1\ndata: line2\n\n' +
    "data: c1\r\ndata: c2\r\n\r\ndata:[DONE]\r\r";
  for (const size of [1, 2, 3, 7, text.length]) {
    const p = new SseParser();
    const got = pieces(text, size).flatMap((s) => p.push(s));
    got.push(...p.end());
    assert.deepEqual(got, ['{"a":1}', "line1\nline2", "c1\nc2", "[DONE]"], `piece size ${size}`);
  }
  const tail = new SseParser();
  assert.deepEqual(tail.push("data: last"), []);
  assert.deepEqual(tail.end(), ["last"], "an unterminated final event still counts");
});

Deno.test("streamCompletion() times chunks split across network writes and reads the usage chunk", async () => {
  let body: unknown;
  await withServer(async (req) => {
    body = await req.json();
    // Each event is cut into 5-character network writes, 3 ms apart; the first token comes
    // after a 60 ms pause and the next ones 40 ms apart.
    const events = [chunk(" a"), chunk(" b"), chunk(" c"), usage(3, 3), "data: [DONE]\n\n"];
    const enc = new TextEncoder();
    return new Response(
      new ReadableStream<Uint8Array>({
        async start(c) {
          await sleep(60);
          for (const [i, e] of events.entries()) {
            if (i > 0 && i < 3) await sleep(40);
            for (const p of pieces(e, 5)) {
              c.enqueue(enc.encode(p));
              await sleep(3);
            }
          }
          c.close();
        },
      }),
      { headers: { "content-type": "text/event-stream" } },
    );
  }, async (url) => {
    const r = await streamCompletion(request(url), 7, 0);
    assert.equal(r.ok, true, r.error);
    assert.equal(r.index, 7);
    assert.equal(r.text, " a b c");
    assert.equal(r.outputTokens, 3);
    assert.equal(r.promptTokens, 3);
    assert.equal(r.usageReported, true);
    assert.ok(r.ttftMs !== null && r.ttftMs >= 55, `TTFT ${r.ttftMs} ms (server waited 60)`);
    assert.equal(r.itlMs.length, 2);
    for (const gap of r.itlMs) assert.ok(gap >= 35, `ITL ${gap} ms (server waited 40+)`);
    assert.ok(r.e2eMs >= r.ttftMs! + r.itlMs[0]! + r.itlMs[1]!, "E2E covers TTFT and the gaps");
  });
  assert.deepEqual(body, {
    model: "m",
    prompt: [1, 2, 3],
    max_tokens: 3,
    temperature: 0,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  });
});

Deno.test("streamCompletion() counts every chunk carrying a choice as a token when the server sends no usage", async () => {
  await withServer(
    () => slowStream([chunk("x"), chunk(""), chunk("y"), "data: [DONE]\n\n"], 1),
    async (url) => {
      const r = await streamCompletion(request(url));
      assert.equal(r.ok, true, r.error);
      // As `vllm bench serve`: a chunk with empty text is still a token (e.g. a special token).
      assert.equal(r.outputTokens, 3, "empty-text chunks are tokens");
      assert.equal(r.usageReported, false);
      assert.equal(r.itlMs.length, 2, "three chunks, two gaps");
    },
  );
});

Deno.test("streamCompletion() fails a request with the server's error status and message", async () => {
  await withServer(
    () =>
      Response.json({ error: { message: "Model is overloaded", type: "overloaded", code: 429 } }, {
        status: 429,
      }),
    async (url) => {
      const r = await streamCompletion(request(url));
      assert.equal(r.ok, false);
      assert.equal(r.error, "HTTP 429: Model is overloaded");
      assert.equal(r.ttftMs, null);
      assert.equal(r.outputTokens, 0);
    },
  );
  await withServer(() => new Response("upstream\nbroke", { status: 502 }), async (url) => {
    const r = await streamCompletion(request(url));
    assert.equal(r.error, "HTTP 502: upstream broke");
  });
});

Deno.test("streamCompletion() fails on an error chunk, a missing [DONE] and a refused connection", async () => {
  await withServer(
    () => slowStream([chunk("a"), 'data: {"error": {"message": "KV cache exhausted"}}\n\n'], 1),
    async (url) => {
      const r = await streamCompletion(request(url));
      assert.equal(r.ok, false);
      assert.equal(r.error, "stream error: KV cache exhausted");
    },
  );
  await withServer(() => slowStream([chunk("a"), chunk("b")], 1), async (url) => {
    const r = await streamCompletion(request(url));
    assert.equal(r.ok, false);
    assert.equal(r.error, "stream ended without data: [DONE]");
    assert.equal(r.outputTokens, 2);
  });
  let closedUrl = "";
  await withServer(() => new Response(null, { status: 204 }), (url) => {
    closedUrl = url;
    return Promise.resolve();
  });
  const r = await streamCompletion(request(closedUrl));
  assert.equal(r.ok, false);
  assert.ok(r.error !== undefined && r.error.length > 0, "the network error is reported");
});

Deno.test("streamCompletion() fails a request that exceeds its deadline", async () => {
  let release: () => void = () => {};
  const released = new Promise<void>((resolve) => (release = resolve));
  await withServer(() => {
    const enc = new TextEncoder();
    return new Response(
      new ReadableStream<Uint8Array>({
        async start(c) {
          c.enqueue(enc.encode(chunk("first")));
          await released; // hangs after the first token until the test ends
          try {
            c.close();
          } catch {
            // Already cancelled by the client's abort.
          }
        },
      }),
      { headers: { "content-type": "text/event-stream" } },
    );
  }, async (url) => {
    const t0 = performance.now();
    const r = await streamCompletion(request(url, { timeoutMs: 300 }));
    const waited = performance.now() - t0;
    release();
    assert.equal(r.ok, false);
    assert.equal(r.error, "timed out after 0.3 s");
    assert.ok(r.ttftMs !== null, "the first token arrived before the deadline");
    assert.ok(waited >= 290 && waited < 3000, `gave up after ${waited} ms`);
  });
});
