/**
 * HTTPS: `startServer` with `tls` (behind the connection guard and without it), `serve`'s
 * `--ssl-certfile` / `--ssl-keyfile` (vLLM's flags), with the self-signed `localhost`
 * certificate of tests/fixtures/tls, and `cluster` refusing them for its replicas.
 *
 * @module
 */

import assert from "node:assert/strict";
import { clusterSettingsFromArgs } from "../cli/cluster_settings.ts";
import { serveSettingsFromFlags } from "../cli/serve_flags.ts";
import { UsageError } from "../cli/usage.ts";
import { startServer } from "../server/server.ts";
import { FakeEngine, tinyTokenizer } from "./support/fake_engine.ts";
import { startServe, stopServe } from "./support/serve_process.ts";

const FIXTURES = new URL("./fixtures/tls/", import.meta.url).pathname;
const CERT_FILE = `${FIXTURES}localhost.crt`;
const KEY_FILE = `${FIXTURES}localhost.key`;
const TLS = { cert: Deno.readTextFileSync(CERT_FILE), key: Deno.readTextFileSync(KEY_FILE) };

/** A client that trusts the fixture certificate. */
function trustingClient(): Deno.HttpClient {
  return Deno.createHttpClient({ caCerts: [TLS.cert] });
}

for (const [guard, requestReadTimeoutMs] of [["behind the guard", 30_000], ["without it", 0]]) {
  Deno.test(`startServer() with tls serves HTTPS ${guard}, and no plain HTTP`, async () => {
    const engine = new FakeEngine(await tinyTokenizer(), { stepMs: 1 });
    const server = startServer(engine, {
      port: 0,
      onError: () => {},
      tls: TLS,
      requestReadTimeoutMs: requestReadTimeoutMs as number,
    });
    const client = trustingClient();
    try {
      assert.match(server.url, /^https:\/\/127\.0\.0\.1:\d+$/);
      const health = await fetch(`${server.url}/health`, { client });
      assert.equal(health.status, 200);
      await health.body?.cancel();
      const r = await fetch(`${server.url}/v1/completions`, {
        client,
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "hello", max_tokens: 3, temperature: 0 }),
      });
      assert.equal(r.status, 200);
      assert.equal((await r.json()).usage.completion_tokens, 3);
      // Plain HTTP to the same port gets no answer, and an untrusting client refuses the
      // self-signed certificate.
      await assert.rejects(() => fetch(server.url.replace("https:", "http:") + "/health"));
      await assert.rejects(() => fetch(`${server.url}/health`));
    } finally {
      client.close();
      await server.shutdown(0);
      await server.finished;
    }
  });
}

Deno.test("startServer() with tls cuts a connection that never begins its handshake at the header deadline", async () => {
  const engine = new FakeEngine(await tinyTokenizer(), { stepMs: 1 });
  const server = startServer(engine, {
    port: 0,
    onError: () => {},
    tls: TLS,
    requestReadTimeoutMs: 300,
  });
  const client = trustingClient();
  try {
    // Deno keeps a socket whose TLS handshake is under way open after its TLS connection is
    // closed (server/tls_front.ts): these would otherwise stay connected for good.
    const silent = await Promise.all(
      Array.from({ length: 5 }, () => Deno.connect({ port: server.port })),
    );
    const t0 = performance.now();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<string>((r) => timer = setTimeout(() => r("open after 6 s"), 6000));
    const reads = await Promise.all(
      silent.map((c) => Promise.race([c.read(new Uint8Array(64)).catch(() => null), late])),
    );
    clearTimeout(timer);
    const waited = performance.now() - t0;
    for (const c of silent) c.close();
    assert.deepEqual(reads, [null, null, null, null, null], "closed by the server");
    assert.ok(waited >= 250 && waited < 4000, `closed after ${waited.toFixed(0)} ms`);
    assert.equal(server.guardStats?.headerTimeouts, 5);
    assert.equal(server.guardStats?.open, 0);
    const health = await fetch(`${server.url}/health`, { client });
    assert.equal(health.status, 200);
    await health.body?.cancel();
  } finally {
    client.close();
    await server.shutdown(0);
    await server.finished;
  }
});

Deno.test("startServer() with tls lets a stream in flight finish at a graceful shutdown", async () => {
  const engine = new FakeEngine(await tinyTokenizer(), { stepMs: 4 });
  const server = startServer(engine, { port: 0, onError: () => {}, tls: TLS });
  const client = trustingClient();
  try {
    const res = await fetch(`${server.url}/v1/completions`, {
      client,
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "hello", max_tokens: 40, temperature: 0, stream: true }),
    });
    assert.equal(res.status, 200);
    const shut = server.shutdown(5000);
    const text = await res.text();
    await shut;
    await server.finished;
    const events = text.split("\n\n").filter((e) => e.startsWith("data: ")).map((e) => e.slice(6));
    assert.equal(events.at(-1), "[DONE]");
    assert.equal(JSON.parse(events.at(-2)!).choices[0].finish_reason, "length");
  } finally {
    client.close();
  }
});

Deno.test("serveSettingsFromFlags() reads --ssl-certfile and --ssl-keyfile together, in one line when wrong", () => {
  assert.equal(serveSettingsFromFlags({}, () => undefined).server.tls, null);
  const both = serveSettingsFromFlags(
    { "ssl-certfile": CERT_FILE, "ssl-keyfile": KEY_FILE },
    () => undefined,
  );
  assert.deepEqual(both.server.tls, TLS);
  assert.throws(
    () => serveSettingsFromFlags({ "ssl-certfile": CERT_FILE }, () => undefined),
    (e) =>
      e instanceof TypeError &&
      e.message ===
        "--ssl-certfile and --ssl-keyfile go together: --ssl-certfile was given alone",
  );
  assert.throws(
    () =>
      serveSettingsFromFlags(
        { "ssl-certfile": CERT_FILE, "ssl-keyfile": "/no/such.key" },
        () => undefined,
      ),
    (e) =>
      e instanceof TypeError &&
      e.message === "--ssl-keyfile: cannot read /no/such.key (no such file)",
  );
});

Deno.test("serve --ssl-certfile --ssl-keyfile listens on https", async () => {
  const server = await startServe("", [
    "--executor",
    "mock",
    "--ssl-certfile",
    CERT_FILE,
    "--ssl-keyfile",
    KEY_FILE,
  ], trustingClient);
  try {
    assert.match(server.url, /^https:\/\/127\.0\.0\.1:\d+$/);
    const client = trustingClient();
    try {
      const models = await fetch(`${server.url}/v1/models`, { client });
      assert.equal(models.status, 200);
      assert.equal((await models.json()).data[0].id, "mock");
    } finally {
      client.close();
    }
  } finally {
    assert.equal((await stopServe(server)).code, 0, server.log.join("\n"));
  }
});

Deno.test("clusterSettingsFromArgs() refuses TLS flags for the replicas behind nginx", () => {
  for (const flag of ["--ssl-certfile", "--ssl-keyfile=/k.pem"]) {
    assert.throws(
      () => clusterSettingsFromArgs(["--replicas", "2", "--", flag, "/c.pem"]),
      (e) =>
        e instanceof UsageError &&
        e.message.startsWith(`${flag.split("=")[0]}: the replicas sit behind nginx over loopback`),
    );
  }
  assert.throws(
    () => clusterSettingsFromArgs(["--", "--port", "9000"]),
    (e) =>
      e instanceof UsageError && e.message === "--port is the launcher's flag: put it before '--'",
  );
});
