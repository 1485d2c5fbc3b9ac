import assert from "node:assert/strict";
import { z } from "zod";
import { UsageError } from "../bench/bench_io.ts";
import { runServeBench } from "../bench/serve.ts";
import { startFakeServer } from "../bench/serve/fake_server.ts";
import { startLocalServer } from "../bench/serve/local_server.ts";

/** The fields of report.json this test checks (parsed, not cast). */
const ReportView = z.object({
  schema: z.string(),
  servedModelName: z.string(),
  serverModels: z.array(z.string()),
  command: z.string(),
  levels: z.array(z.object({
    concurrency: z.number(),
    metrics: z.object({
      totalRequests: z.number(),
      successful: z.number(),
      failed: z.number(),
      totalOutputTokens: z.number(),
      requestThroughput: z.number(),
      ttftMs: z.object({ p50: z.number(), p95: z.number() }).nullable(),
      tpotMs: z.object({ p50: z.number() }).nullable(),
      itlMs: z.object({ count: z.number() }).nullable(),
      goodput: z.number().nullable(),
    }),
    preemptions: z.number().nullable(),
    requests: z.array(z.object({
      ok: z.boolean(),
      outputTokens: z.number(),
      promptTokens: z.number(),
    })),
  })),
  observations: z.array(z.string()),
});

const SERVE = new URL("../bench/serve.ts", import.meta.url).pathname;

/** Runs the benchmark in-process with the progress bar off; returns exit status and log. */
async function bench(argv: string[]): Promise<{ code: number; log: string[] }> {
  const log: string[] = [];
  const code = await runServeBench(argv, {
    log: (l) => log.push(l),
    stderr: null,
    stderrIsTerminal: false,
  });
  return { code, log };
}

/**
 * Checks that `svg` is a single well-formed element tree: it opens with <svg, every tag is
 * closed in order, and attribute values are quoted.
 */
function assertWellFormedSvg(svg: string, name: string): void {
  assert.ok(svg.startsWith("<svg "), `${name} starts with <svg`);
  assert.ok(svg.trimEnd().endsWith("</svg>"), `${name} ends with </svg>`);
  const stack: string[] = [];
  for (const m of svg.matchAll(/<(\/?)([a-zA-Z]+)((?:\s+[\w:-]+="[^"<>]*")*)\s*(\/?)>/g)) {
    const [, close, tag, , self] = m;
    if (close) assert.equal(stack.pop(), tag, `${name}: </${tag}> closes the open tag`);
    else if (!self) stack.push(tag!);
  }
  assert.deepEqual(stack, [], `${name}: every tag is closed`);
  const tags = svg.match(/</g)?.length ?? 0;
  const parsed = [...svg.matchAll(/<\/?[a-zA-Z]+(?:\s+[\w:-]+="[^"<>]*")*\s*\/?>/g)].length;
  assert.equal(parsed, tags, `${name}: every '<' starts a well-formed tag`);
}

Deno.test("bench/serve.ts sweeps concurrency 1,2 against a fake server and writes md, json and svg", async () => {
  const fake = startFakeServer({ modelId: "tiny", ttftMs: 5, itlMs: 1 });
  const dir = await Deno.makeTempDir({ prefix: "bench_serve_" });
  try {
    const { code, log } = await bench([
      "--url",
      fake.url,
      "--concurrency",
      "1,2",
      "--requests-per-level",
      "4",
      "--input-len",
      "4:8",
      "--output-len",
      "5",
      "--slo-ttft-ms",
      "5000",
      "--out-dir",
      dir,
      "--json",
      `${dir}/copy.json`,
      "--seed",
      "3",
    ]);
    assert.equal(code, 0, log.join("\n"));
    assert.equal(fake.received(), 1 + 4 + 4, "one warm-up request plus 4 per level");
    const json: unknown = JSON.parse(await Deno.readTextFile(`${dir}/report.json`));
    assert.deepEqual(JSON.parse(await Deno.readTextFile(`${dir}/copy.json`)), json);
    const report = ReportView.parse(json);
    assert.equal(report.schema, "webgpu-llm/bench-serve/1");
    assert.equal(report.servedModelName, "tiny");
    assert.deepEqual(report.serverModels, ["tiny"]);
    assert.match(report.command, /--concurrency 1,2/);
    assert.deepEqual(report.levels.map((l) => l.concurrency), [1, 2]);
    for (const l of report.levels) {
      const m = l.metrics;
      assert.equal(m.totalRequests, 4);
      assert.equal(m.successful, 4);
      assert.equal(m.failed, 0);
      assert.equal(m.totalOutputTokens, 20, "ignore_eos: 5 tokens each");
      assert.ok(m.requestThroughput > 0);
      assert.ok(m.ttftMs !== null && m.ttftMs.p50 >= 4, `TTFT p50 ${m.ttftMs?.p50}`);
      assert.ok(m.tpotMs !== null && m.tpotMs.p50 > 0);
      assert.equal(m.itlMs?.count, 16, "4 gaps per 5-token request");
      assert.ok(m.goodput !== null && m.goodput > 0);
      assert.equal(l.requests.length, 4);
      for (const r of l.requests) {
        assert.ok(r.ok);
        assert.ok(r.promptTokens >= 4 && r.promptTokens <= 8, `prompt ${r.promptTokens}`);
      }
    }
    assert.ok(report.observations.length >= 2);
    // The fake server has no /metrics here: no preemption count.
    assert.deepEqual(report.levels.map((l) => l.preemptions), [null, null]);
    const md = await Deno.readTextFile(`${dir}/report.md`);
    for (
      const s of [
        "# Serving benchmark: tiny",
        "## Concurrency Level: 1",
        "## Concurrency Level: 2",
        "| TTFT (ms) |",
        "| TPOT (ms) |",
        "| ITL (ms) |",
        "| E2E Latency (ms) |",
        "# Analysis",
        "### Observations",
        "throughput_vs_concurrency.svg",
        "**Preemptions (server /metrics):** not reported",
      ]
    ) assert.ok(md.includes(s), `report.md contains '${s}'`);
    assert.ok(md.indexOf("## Concurrency Level: 2") < md.indexOf("# Analysis"));
    const svgs = {
      "throughput_vs_concurrency.svg": [
        "Concurrency (requests in flight)",
        "Throughput (tokens/s)",
      ],
      "ttft_vs_concurrency.svg": ["Concurrency (requests in flight)", "TTFT (ms)", "TTFT p95"],
      "latency_vs_throughput.svg": ["Output throughput (tokens/s)", "E2E latency (ms)", "c=2"],
    };
    for (const [name, labels] of Object.entries(svgs)) {
      const svg = await Deno.readTextFile(`${dir}/${name}`);
      assertWellFormedSvg(svg, name);
      for (const label of labels) assert.ok(svg.includes(`>${label}<`), `${name} has '${label}'`);
      assert.match(svg, /<polyline /, `${name} draws lines`);
    }
  } finally {
    await fake.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("bench/serve.ts reports each level's preemptions from the server's /metrics", async () => {
  // One preemption per 2 finished completions: the warm-up request leaves the counter at 0, the
  // first level's 4 requests take it to 2, the second's to 4.
  const fake = startFakeServer({ modelId: "tiny", ttftMs: 1, itlMs: 1, preemptEvery: 2 });
  const dir = await Deno.makeTempDir({ prefix: "bench_serve_" });
  try {
    const { code, log } = await bench([
      "--url",
      fake.url,
      "--concurrency",
      "1,2",
      "--requests-per-level",
      "4",
      "--input-len",
      "4",
      "--output-len",
      "3",
      "--out-dir",
      dir,
    ]);
    assert.equal(code, 0, log.join("\n"));
    const json: unknown = JSON.parse(await Deno.readTextFile(`${dir}/report.json`));
    const report = ReportView.parse(json);
    assert.deepEqual(report.levels.map((l) => l.preemptions), [2, 2]);
    assert.ok(
      log.some((l) => /^concurrency 2: 4\/4 ok, .*, 2 preemptions \(server \/metrics\)$/.test(l)),
    );
    assert.ok(
      report.observations.some((o) =>
        o.startsWith("The server preempted requests 2 times at concurrency 2")
      ),
    );
    const md = await Deno.readTextFile(`${dir}/report.md`);
    assert.ok(md.includes("**Preemptions (server /metrics):** 2"));
  } finally {
    await fake.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("bench/serve.ts open-loop rate level and an all-failed level (exit 1, errors reported)", async () => {
  const fake = startFakeServer({ modelId: "tiny", ttftMs: 1, itlMs: 1 });
  const dir = await Deno.makeTempDir({ prefix: "bench_serve_" });
  try {
    const rate = await bench([
      "--url",
      fake.url,
      "--request-rate",
      "40",
      "--num-requests",
      "5",
      "--max-concurrency",
      "2",
      "--output-len",
      "3",
      "--input-len",
      "4",
      "--prompt-kind",
      "words",
      "--warmup",
      "0",
      "--out-dir",
      dir,
    ]);
    assert.equal(rate.code, 0, rate.log.join("\n"));
    const md = await Deno.readTextFile(`${dir}/report.md`);
    assert.match(md, /## Request Rate: 40 req\/s \(max concurrency 2\)/);
    assert.match(
      await Deno.readTextFile(`${dir}/throughput_vs_concurrency.svg`),
      />Request rate \(req\/s\)</,
    );

    const failed = await bench([
      "--url",
      fake.url,
      "--served-model-name",
      "missing",
      "--concurrency",
      "2",
      "--requests-per-level",
      "3",
      "--warmup",
      "0",
      "--out-dir",
      dir,
    ]);
    assert.equal(failed.code, 1, "no request succeeded");
    const report = await Deno.readTextFile(`${dir}/report.md`);
    assert.match(report, /3x HTTP 404: The model 'missing' does not exist\./);
    assert.match(report, /3 of 3 requests failed at concurrency 2 \(most common: "HTTP 404/);
    assertWellFormedSvg(await Deno.readTextFile(`${dir}/ttft_vs_concurrency.svg`), "empty chart");
  } finally {
    await fake.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("bench/serve.ts rejects bad input with a UsageError, and the CLI exits 2 with one line", async () => {
  const cases: [string[], RegExp][] = [
    [["--concurrency", "1"], /pass exactly one of --url URL or --model DIR/],
    [["--url", "http://x", "--model", "m"], /exactly one of/],
    [["--url", "http://x", "--concurrency", "1,0"], /--concurrency must be an integer >= 1/],
    [["--url", "http://x", "--input-len", "9:3"], /--input-len range 9:3 is empty/],
    [["--url", "http://x", "--request-rate", "2", "--concurrency", "4"], /--max-concurrency/],
    [["--url", "http://x", "--prompt-kind", "emoji"], /--prompt-kind must be tokens or words/],
    [["--url", "http://x", "--", "--max-num-seqs", "8"], /engine flags after '--' need --model/],
    [["--url", "http://x", "stray"], /unexpected argument 'stray'/],
    [["--url", "http://x", "--frobnicate"], /frobnicate/],
    // Flags another choice would make ignored.
    [["--url", "http://x", "--burstiness", "2"], /--burstiness applies to --request-rate/],
    [["--url", "http://x", "--num-requests", "3"], /--num-requests applies to --request-rate/],
    [["--url", "http://x", "--startup-timeout-s", "5"], /--startup-timeout-s applies to a server/],
  ];
  for (const [argv, message] of cases) {
    await assert.rejects(bench(argv), (e) => e instanceof UsageError && message.test(e.message));
  }
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", SERVE, "--url", "http://127.0.0.1:1", "--output-len", "0"],
    env: { XDG_RUNTIME_DIR: "/tmp" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 2);
  assert.equal(
    new TextDecoder().decode(out.stderr),
    "error: --output-len must be at least 1, got 0 (see 'deno task bench:serve --help')\n",
  );
});

Deno.test("startLocalServer() parses 'Listening on', waits for /health 200, and stops the process", async () => {
  const dir = await Deno.makeTempDir({ prefix: "bench_serve_local_" });
  try {
    // A stand-in for `main.ts serve`: /health says 503 twice (loading), then 200.
    const script = `${dir}/server.ts`;
    await Deno.writeTextFile(
      script,
      `let polls = 0;
const s = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, () =>
  new Response(null, { status: ++polls > 2 ? 200 : 503 }));
console.error("loading weights ...");
console.log("INFO server: Listening on http://127.0.0.1:" + s.addr.port);
`,
    );
    const server = await startLocalServer({
      command: [Deno.execPath(), "run", "-A", script],
      startupTimeoutMs: 20_000,
      pollMs: 20,
    });
    assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+$/);
    const res = await fetch(`${server.url}/health`);
    await res.body?.cancel();
    assert.equal(res.status, 200);
    await server.close();
    await assert.rejects(fetch(`${server.url}/health`), "the process is gone after close()");

    const broken = `${dir}/broken.ts`;
    await Deno.writeTextFile(broken, `console.error("no such model dir"); Deno.exit(3);\n`);
    await assert.rejects(
      startLocalServer({
        command: [Deno.execPath(), "run", "-A", broken],
        startupTimeoutMs: 20_000,
      }),
      /exited with code 3 before printing 'Listening on'; last output: no such model dir/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
