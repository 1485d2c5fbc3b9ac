/**
 * Replicas behind nginx (`main.ts cluster`, cli/nginx_config.ts), on loopback with three
 * mock-executor replicas: throughput scales, nginx adds little latency, a client disconnect frees
 * the replica's KV blocks, session keys stick to one replica (its prefix cache hits), a killed
 * replica fails only its own requests, and SIGTERM stops everything.
 *
 * Skipped, with a message, where nginx is not installed (`apt-get install nginx`; .ci/run
 * installs it), and in the suite's second pass (`WEBGPU_LLM_KERNEL_PROFILE=gpu`): the replicas
 * run the mock executor, no kernel.
 */

import assert from "node:assert/strict";
import { nginxAvailable } from "../cli/cluster.ts";
import { nginxConfig } from "../cli/nginx_config.ts";

const ROOT = new URL("../", import.meta.url).pathname;
const HAS_NGINX = await nginxAvailable("nginx");
/** Mock executors run no kernel: the suite's pass under the gpu kernel profile skips this. */
const GPU_PASS = Deno.env.get("WEBGPU_LLM_KERNEL_PROFILE") === "gpu";
if (!HAS_NGINX) {
  console.warn("tests/cluster_test.ts: nginx is not installed: the cluster tests are skipped");
}
/** Each replica runs at most 4 requests at once, so three replicas can do 3x the work of one. */
const MOCK = ["--executor", "mock", "--max-num-seqs", "4", "--mock-base-ms", "10"];

interface Proc {
  readonly child: Deno.ChildProcess;
  readonly log: string[];
  /** Resolves with the first line matching. */
  waitFor(pattern: RegExp, ms?: number): Promise<RegExpMatchArray>;
}

function spawn(args: string[]): Proc {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", ...args],
    cwd: ROOT,
    env: { XDG_RUNTIME_DIR: "/tmp" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const log: string[] = [];
  const waiters: Array<{ pattern: RegExp; resolve: (m: RegExpMatchArray) => void }> = [];
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    let rest = "";
    for await (const text of stream.pipeThrough(new TextDecoderStream())) {
      const lines = (rest + text).split("\n");
      rest = lines.pop()!;
      for (const line of lines) {
        log.push(line);
        for (const w of [...waiters]) {
          const m = line.match(w.pattern);
          if (m) {
            waiters.splice(waiters.indexOf(w), 1);
            w.resolve(m);
          }
        }
      }
    }
  };
  void pump(child.stdout);
  void pump(child.stderr);
  return {
    child,
    log,
    waitFor(pattern, ms = 60_000) {
      const seen = log.map((l) => l.match(pattern)).find((m) => m !== null);
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new Error(`no line matching ${pattern}:\n${log.join("\n")}`)),
          ms,
        );
        waiters.push({
          pattern,
          resolve: (m) => {
            clearTimeout(timer);
            resolve(m);
          },
        });
      });
    },
  };
}

/** Runs bench/serve.ts against `url`; returns its JSON report's levels. */
async function benchServe(url: string, concurrency: string, perLevel: number) {
  const json = await Deno.makeTempFile({ suffix: ".json" });
  const outDir = await Deno.makeTempDir();
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      ...["run", "-A", "bench/serve.ts", "--url", url, "--concurrency", concurrency],
      ...["--requests-per-level", String(perLevel), "--input-len", "32", "--output-len", "16"],
      ...["--no-progress", "--json", json, "--out-dir", outDir],
    ],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  const report = JSON.parse(await Deno.readTextFile(json));
  await Deno.remove(json);
  await Deno.remove(outDir, { recursive: true });
  return report.levels as Array<
    {
      concurrency: number;
      metrics: { failed: number; outputThroughput: number; ttftMs: { p50: number } };
    }
  >;
}

/** A gauge or counter of a replica's /metrics (summed over label sets). */
async function metric(replicaUrl: string, name: string): Promise<number> {
  const text = await (await fetch(`${replicaUrl}/metrics`)).text();
  return text.split("\n").filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `))
    .reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(" ") + 1)), 0);
}

async function complete(url: string, body: object, headers: Record<string, string> = {}) {
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, servedBy: res.headers.get("x-served-by"), text };
}

Deno.test("nginxConfig() for three replicas is deploy/nginx.conf, and nginx -t accepts it", {
  ignore: !HAS_NGINX,
}, async () => {
  const config = nginxConfig({
    listen: "127.0.0.1:8000",
    replicas: ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"],
  });
  assert.equal(await Deno.readTextFile(`${ROOT}deploy/nginx.conf`), config);
  const dir = await Deno.makeTempDir();
  await Deno.writeTextFile(`${dir}/nginx.conf`, config);
  const out = await new Deno.Command("nginx", {
    args: ["-t", "-p", `${dir}/`, "-c", `${dir}/nginx.conf`],
    stdout: "piped",
    stderr: "piped",
  }).output();
  await Deno.remove(dir, { recursive: true });
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
});

Deno.test(
  "three replicas behind nginx: scaling, latency, disconnects, sessions, a dead replica, shutdown",
  {
    ignore: !HAS_NGINX || GPU_PASS,
    sanitizeResources: false,
    sanitizeOps: false,
  },
  async (t) => {
    // Below Linux's ephemeral range (32768-60999), where the other tests' port-0 servers land.
    const base = 10_000 + Math.floor(Math.random() * 20_000);
    const cluster = spawn([
      "main.ts",
      "cluster",
      "--replicas",
      "3",
      "--port",
      String(base),
      "--",
      ...MOCK,
    ]);
    const single = spawn(["main.ts", "serve", "--port", "0", ...MOCK]);
    try {
      const listening = await cluster.waitFor(/^Listening on (http:\/\/\S+) .*-> (.*)$/);
      const url = listening[1]!;
      const replicas = [...listening[2]!.matchAll(/replica \d+ (http:\/\/\S+) \(pid (\d+)\)/g)]
        .map((m) => ({ url: m[1]!, pid: Number(m[2]) }));
      assert.equal(replicas.length, 3);
      await cluster.waitFor(/^\[cluster\] ready: 3 replicas healthy/);
      const singleUrl = (await single.waitFor(/Listening on (http:\/\/\S+)/))[1]!;
      await single.waitFor(/^Serving /);

      await t.step(
        "bench:serve: >= 2.5x one replica's output tok/s at concurrency 64; TTFT p50 within 5 ms at 1",
        async () => {
          // 144 requests at concurrency 64: one replica runs 4 at a time, three run 12 (12 full
          // waves). Timed figures on a shared machine: the test runs beside other test files
          // (deno test --parallel on CI's 2 cores), whose bursts can starve the five processes
          // here for a while, so a shortfall is measured again, up to 3 attempts, each printed;
          // the step fails when no attempt meets both bounds.
          const attempts: string[] = [];
          for (let attempt = 1; attempt <= 3; attempt++) {
            const [d64] = await benchServe(singleUrl, "64", 144);
            const [b64] = await benchServe(url, "64", 144);
            const [d1] = await benchServe(singleUrl, "1", 16);
            const [b1] = await benchServe(url, "1", 16);
            for (const level of [d64, b64, d1, b1]) assert.equal(level!.metrics.failed, 0);
            const ratio = b64!.metrics.outputThroughput / d64!.metrics.outputThroughput;
            const ttftGap = b1!.metrics.ttftMs.p50 - d1!.metrics.ttftMs.p50;
            const line =
              `attempt ${attempt}: concurrency 64: ${
                b64!.metrics.outputThroughput.toFixed(0)
              } output tok/s through nginx, ` +
              `${d64!.metrics.outputThroughput.toFixed(0)} one replica (${ratio.toFixed(2)}x); ` +
              `concurrency 1 TTFT p50 ${b1!.metrics.ttftMs.p50.toFixed(2)} ms through nginx, ` +
              `${d1!.metrics.ttftMs.p50.toFixed(2)} ms direct`;
            console.log(line);
            attempts.push(line);
            if (ratio >= 2.5 && ttftGap <= 5) return;
          }
          assert.fail(
            `no attempt reached >= 2.5x with nginx adding <= 5 ms of TTFT:\n${attempts.join("\n")}`,
          );
        },
      );

      await t.step(
        "a client that disconnects mid-stream leaves nothing running on any replica",
        async () => {
          const controller = new AbortController();
          const res = await fetch(`${url}/v1/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({
              prompt: [1, 2, 3],
              max_tokens: 2000,
              ignore_eos: true,
              stream: true,
            }),
            signal: controller.signal,
          });
          assert.equal(res.status, 200);
          const reader = res.body!.getReader();
          for (let i = 0; i < 3; i++) await reader.read();
          const servedBy = replicas.find((r) => r.url.endsWith(res.headers.get("x-served-by")!))!;
          assert.equal(await metric(servedBy.url, "vllm:num_requests_running"), 1);
          controller.abort();
          let left = Infinity;
          for (let i = 0; i < 100 && left > 0; i++) {
            await new Promise((r) => setTimeout(r, 50));
            left = 0;
            for (const r of replicas) {
              left += await metric(r.url, "vllm:num_requests_running") +
                await metric(r.url, "vllm:kv_cache_usage_perc");
            }
          }
          assert.equal(left, 0, "running requests or used KV blocks left on a replica");
        },
      );

      await t.step(
        "one session key stays on one replica and hits its prefix cache; keyless requests spread",
        async () => {
          const prefix = Array.from({ length: 64 }, (_, i) => 100 + i);
          const served = new Set<string | null>();
          for (let i = 0; i < 6; i++) {
            const r = await complete(url, { prompt: [...prefix, 500 + i], max_tokens: 2 }, {
              "x-session-id": "conversation-1",
            });
            assert.equal(r.status, 200, r.text);
            served.add(r.servedBy);
          }
          assert.equal(served.size, 1, `one session went to ${[...served]}`);
          const home = replicas.find((r) => r.url.endsWith([...served][0]!))!;
          const hits = await metric(home.url, "vllm:prefix_cache_hits_total");
          assert.ok(hits >= 5 * 48, `prefix cache hits on the session's replica: ${hits}`);
          const spread = new Set<string | null>();
          for (let i = 0; i < 9; i++) {
            const r = await complete(url, { prompt: [7, 8, 9 + i], max_tokens: 2 });
            assert.equal(r.status, 200, r.text);
            spread.add(r.servedBy);
          }
          assert.ok(spread.size >= 2, `keyless requests all went to ${[...spread]}`);
        },
      );

      await t.step(
        "killing a replica fails only the requests it was serving; later requests succeed",
        async () => {
          const victim = replicas[1]!;
          const runs = Array.from({ length: 24 }, async (_, i) => {
            try {
              const res = await fetch(`${url}/v1/completions`, {
                method: "POST",
                headers: { "content-type": "application/json" },
                body: JSON.stringify({
                  prompt: [5, 6, i],
                  max_tokens: 150,
                  ignore_eos: true,
                  stream: true,
                }),
              });
              const servedBy = res.headers.get("x-served-by");
              const text = await res.text().catch(() => "");
              return {
                servedBy,
                ok: res.status === 200 && text.endsWith("data: [DONE]\n\n") &&
                  !text.includes('"error"'),
              };
            } catch {
              return { servedBy: null, ok: false };
            }
          });
          await new Promise((r) => setTimeout(r, 400));
          Deno.kill(victim.pid, "SIGKILL");
          const results = await Promise.all(runs);
          const failed = results.filter((r) => !r.ok);
          assert.ok(
            failed.length > 0,
            "the killed replica was serving nothing: the step proves nothing",
          );
          for (const r of failed) {
            assert.ok(r.servedBy?.includes(new URL(victim.url).host), `a failure on ${r.servedBy}`);
          }
          await cluster.waitFor(/\[cluster\] replica 1 .* exited/);
          for (let i = 0; i < 12; i++) {
            const r = await complete(url, { prompt: [1, 2, i], max_tokens: 2 });
            assert.equal(r.status, 200, r.text);
          }
        },
      );

      await t.step("SIGTERM stops nginx and every replica; the launcher exits 0", async () => {
        cluster.child.kill("SIGTERM");
        const status = await cluster.child.status;
        assert.equal(status.code, 0, cluster.log.join("\n"));
        await assert.rejects(fetch(`${url}/health`));
        for (const r of [replicas[0]!, replicas[2]!]) {
          await assert.rejects(fetch(`${r.url}/health`));
        }
      });
    } finally {
      for (const p of [cluster, single]) {
        try {
          p.child.kill("SIGKILL");
        } catch {
          // Already gone.
        }
        await p.child.status;
      }
    }
  },
);
