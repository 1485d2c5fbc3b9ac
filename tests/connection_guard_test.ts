/**
 * The TCP front of the server (server/connection_guard.ts, server/http1_framer.ts): message
 * boundaries found in any split of the byte stream, and the header, keep-alive and head-size
 * bounds enforced on real sockets while long generations and keep-alive reuse go on untouched.
 */

import assert from "node:assert/strict";
import {
  type BodyFraming,
  Http1Framer,
  HttpFramingError,
  type MessageHead,
  requestBodyFraming,
  responseBodyFraming,
} from "../server/http1_framer.ts";
import { LLMEngine } from "../engine/llm_engine.ts";
import { FakeEngine, withServer } from "./support/fake_engine.ts";

const enc = new TextEncoder();

/** Feeds `text` in pieces of `piece` bytes; returns the events as strings. */
function frame(
  text: string,
  piece: number,
  decide: (head: MessageHead) => BodyFraming = requestBodyFraming,
): string[] {
  const events: string[] = [];
  const framer = new Http1Framer({
    headStart: () => events.push("start"),
    head: (head) => {
      events.push(`head ${head.startLine}`);
      return decide(head);
    },
    messageEnd: () => events.push("end"),
  });
  const bytes = enc.encode(text);
  for (let i = 0; i < bytes.length; i += piece) framer.push(bytes.subarray(i, i + piece));
  return events;
}

Deno.test("Http1Framer finds the same message boundaries whatever the chunking", () => {
  const stream = "POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello" +
    "\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n" +
    "POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\nA\r\n0123456789\r\n" +
    "0\r\nTrailer: t\r\n\r\n" +
    "GET /d HTTP/1.1\r\n\r\n";
  const expected = [
    ...["start", "head POST /a HTTP/1.1", "end"],
    ...["start", "head GET /b HTTP/1.1", "end"],
    ...["start", "head POST /c HTTP/1.1", "end"],
    ...["start", "head GET /d HTTP/1.1", "end"],
  ];
  for (const piece of [1, 2, 3, 7, 64, 10_000]) {
    assert.deepEqual(frame(stream, piece), expected, `pieces of ${piece} bytes`);
  }
  // A head still coming reports its start only.
  assert.deepEqual(frame("GET / HTTP/1.1\r\nHost: a", 5), ["start"]);
  // A body still coming: no end.
  assert.deepEqual(frame("POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc", 4), [
    "start",
    "head POST / HTTP/1.1",
  ]);
});

Deno.test("responseBodyFraming() follows RFC 9112: HEAD, 1xx, 204, 304 have no body; else chunked, length or close", () => {
  const head = (line: string, ...fields: [string, string][]): MessageHead => ({
    startLine: line,
    fields,
  });
  assert.deepEqual(responseBodyFraming(head("HTTP/1.1 200 OK", ["content-length", "9"]), "HEAD"), {
    kind: "none",
  });
  assert.deepEqual(responseBodyFraming(head("HTTP/1.1 100 Continue"), "POST"), { kind: "none" });
  assert.deepEqual(responseBodyFraming(head("HTTP/1.1 204 No Content"), "GET"), { kind: "none" });
  assert.deepEqual(responseBodyFraming(head("HTTP/1.1 304 Not Modified"), "GET"), { kind: "none" });
  assert.deepEqual(
    responseBodyFraming(head("HTTP/1.1 200 OK", ["transfer-encoding", "chunked"]), "POST"),
    { kind: "chunked" },
  );
  assert.deepEqual(responseBodyFraming(head("HTTP/1.1 200 OK", ["content-length", "12"]), "GET"), {
    kind: "length",
    bytes: 12,
  });
  assert.deepEqual(responseBodyFraming(head("HTTP/1.1 200 OK"), "GET"), { kind: "until-close" });
  // A response stream: interim 100, then a chunked answer.
  const events = frame(
    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" +
      "5\r\ndata:\r\n0\r\n\r\n",
    3,
    (h) => responseBodyFraming(h, "POST"),
  );
  assert.deepEqual(events, [
    ...["start", "head HTTP/1.1 100 Continue", "end"],
    ...["start", "head HTTP/1.1 200 OK", "end"],
  ]);
});

Deno.test("Http1Framer rejects bad chunk sizes, conflicting lengths and oversized heads", () => {
  const bad = [
    "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
    "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
    "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
  ];
  for (const text of bad) assert.throws(() => frame(text, 5), HttpFramingError, text);
  const big = new Http1Framer({ headStart() {}, head: requestBodyFraming, messageEnd() {} }, 100);
  assert.throws(
    () => big.push(enc.encode(`GET / HTTP/1.1\r\nX: ${"a".repeat(200)}\r\n\r\n`)),
    (e: unknown) => e instanceof HttpFramingError && e.status === 431,
  );
});

/** Reads from `conn` until it closes (or `ms` pass); returns the text and whether it closed. */
async function readUntilClosed(
  conn: Deno.Conn,
  ms: number,
): Promise<{ text: string; closed: boolean }> {
  const chunks: Uint8Array[] = [];
  const buffer = new Uint8Array(4096);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<"timeout">((r) => timer = setTimeout(() => r("timeout"), ms));
  let closed = false;
  try {
    for (;;) {
      const n = await Promise.race([conn.read(buffer).catch(() => null), timeout]);
      if (n === "timeout") break;
      if (n === null) {
        closed = true;
        break;
      }
      chunks.push(buffer.slice(0, n));
    }
  } finally {
    clearTimeout(timer);
  }
  const text = new TextDecoder().decode(
    new Uint8Array(chunks.flatMap((c) => [...c])),
  );
  return { text, closed };
}

async function writeText(conn: Deno.Conn, text: string): Promise<void> {
  const bytes = enc.encode(text);
  let offset = 0;
  while (offset < bytes.length) offset += await conn.write(bytes.subarray(offset));
}

Deno.test("a connection whose request head does not arrive in time gets 408 JSON and is closed", async () => {
  const engine = new FakeEngine(null);
  await withServer(engine, { requestReadTimeoutMs: 300 }, async (_url, server) => {
    // Half a head, then nothing (slowloris).
    const slow = await Deno.connect({ port: server.port });
    await writeText(slow, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
    const t0 = performance.now();
    const answer = await readUntilClosed(slow, 5000);
    const waited = performance.now() - t0;
    slow.close();
    assert.ok(answer.closed, "the guard closed the connection");
    assert.ok(waited >= 250 && waited < 3000, `closed after ${waited.toFixed(0)} ms`);
    assert.match(answer.text, /^HTTP\/1\.1 408 /);
    const body = JSON.parse(answer.text.slice(answer.text.indexOf("\r\n\r\n") + 4));
    assert.equal(body.error.code, "request_timeout");
    // A connection that sends nothing at all is closed the same way.
    const silent = await Deno.connect({ port: server.port });
    const nothing = await readUntilClosed(silent, 5000);
    silent.close();
    assert.ok(nothing.closed);
    assert.match(nothing.text, /^HTTP\/1\.1 408 /);
    assert.equal(server.guardStats?.headerTimeouts, 2);
    // Normal requests are unaffected.
    const res = await fetch(`${server.url}/health`);
    assert.equal(res.status, 200);
    await res.body?.cancel();
  });
});

Deno.test("an idle keep-alive connection is closed after the keep-alive time; a reused one serves every request", async () => {
  const engine = new FakeEngine(null);
  await withServer(engine, { keepAliveTimeoutMs: 300 }, async (_url, server) => {
    const conn = await Deno.connect({ port: server.port });
    const request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    // Two pipelined requests and a third after a pause shorter than the keep-alive time.
    await writeText(conn, request + request);
    await new Promise((r) => setTimeout(r, 100));
    await writeText(conn, request);
    const t0 = performance.now();
    const answer = await readUntilClosed(conn, 5000);
    conn.close();
    assert.equal(answer.text.match(/HTTP\/1\.1 200 /g)?.length, 3, answer.text);
    assert.ok(answer.closed, "closed once idle");
    assert.ok(performance.now() - t0 >= 250, "not before the keep-alive time");
    assert.equal(server.guardStats?.idleTimeouts, 1);
  });
});

Deno.test("a generation longer than both deadlines streams to its end through the guard", async () => {
  const engine = LLMEngine.createMock({ mockBaseMs: 30, mockPerTokenMs: 0, numKvBlocks: 64 });
  try {
    await withServer(
      engine,
      { requestReadTimeoutMs: 200, keepAliveTimeoutMs: 200 },
      async (url) => {
        for (const stream of [true, false]) {
          const res = await fetch(`${url}/v1/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 20, ignore_eos: true, stream }),
          });
          assert.equal(res.status, 200);
          const text = await res.text();
          if (stream) assert.ok(text.endsWith("data: [DONE]\n\n"));
          else assert.equal(JSON.parse(text).usage.completion_tokens, 20);
        }
      },
    );
  } finally {
    await engine.shutdown();
  }
});

Deno.test("an oversized or malformed request head gets 431 or 400 JSON and the connection is closed", async () => {
  const engine = new FakeEngine(null);
  await withServer(engine, {}, async (_url, server) => {
    const cases: Array<[string, RegExp, string]> = [
      [
        `GET /health HTTP/1.1\r\nX-Big: ${"a".repeat(70_000)}\r\n\r\n`,
        /^HTTP\/1\.1 431 /,
        "header_too_large",
      ],
      [
        "POST /v1/completions HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        /^HTTP\/1\.1 400 /,
        "bad_request",
      ],
    ];
    for (const [text, status, code] of cases) {
      const conn = await Deno.connect({ port: server.port });
      await writeText(conn, text).catch(() => {});
      const answer = await readUntilClosed(conn, 5000);
      conn.close();
      assert.ok(answer.closed);
      assert.match(answer.text, status);
      assert.equal(
        JSON.parse(answer.text.slice(answer.text.indexOf("\r\n\r\n") + 4)).error.code,
        code,
      );
    }
    assert.equal(server.guardStats?.rejected, 2);
  });
});
