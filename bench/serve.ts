/**
 * `deno task bench:serve`: the serving benchmark, client side, in the style of
 * `vllm bench serve`. It streams `POST /v1/completions` requests at an OpenAI-compatible server
 * and reports TTFT, TPOT, ITL, E2E latency, throughput and goodput per load level, as Markdown
 * (`report.md`), JSON (`report.json`) and SVG charts in `--out-dir`.
 *
 * Load: a closed-loop sweep over `--concurrency` levels (each keeps c requests in flight), or an
 * open-loop sweep over `--request-rate` values (gamma/Poisson arrivals, optional
 * `--max-concurrency` cap). Prompts are random token-id arrays (or random words) with lengths
 * uniform in `--input-len`; `--output-len` sets `max_tokens` (with `ignore_eos` so it holds).
 *
 * Server: `--url URL`, or `--model DIR [-- engine flags]`, which runs
 * `deno run -A main.ts serve --model DIR --port 0 <engine flags>` and talks to it (contract in
 * bench/serve/local_server.ts: it must print `Listening on http://HOST:PORT` and answer
 * `GET /health` with 200 when ready). The process is stopped at the end.
 *
 * Exit status: 0 after a run in which some request succeeded; 1 when none did or the server is
 * unreachable; 2 for bad command-line input (one `error:` line on stderr).
 *
 * @module
 */

import { parseArgs } from "node:util";
import { reportUsage, UsageError } from "./bench_io.ts";
import { levelMetrics, type Slo } from "./serve/metrics.ts";
import { ProgressBar, type SyncWriter } from "./serve/progress.ts";
import {
  analyze,
  type BenchConfig,
  type BenchReport,
  type LevelReport,
  num,
} from "./serve/report.ts";
import { renderMarkdown } from "./serve/report_markdown.ts";
import { reportCharts } from "./serve/report_svg.ts";
import { type ClientConfig, type LevelPlan, runLevel } from "./serve/runner.ts";
import { type LocalServer, startLocalServer } from "./serve/local_server.ts";
import { tpotMs } from "./serve/metrics.ts";
import {
  arrivalTimesMs,
  parseRange,
  planRequests,
  type PromptKind,
  Rng,
} from "./serve/workload.ts";
import { streamCompletion } from "./serve/sse_client.ts";

const USAGE = `usage: deno task bench:serve (--url URL | --model DIR) [options] [-- engine flags]

server:
  --url URL                 OpenAI-compatible server base URL (e.g. http://127.0.0.1:8000)
  --model DIR               start 'main.ts serve --model DIR --port 0 <engine flags>' instead
  --served-model-name NAME  'model' field of requests (default: first id of GET /v1/models)
  --startup-timeout-s S     bound on the local server's start-up (default 600)
load:
  --concurrency LIST        closed-loop levels, e.g. 1,4,8,16,32,64 (default)
  --requests-per-level N    requests per level (default max(4*c, 16))
  --request-rate LIST       open-loop levels in req/s ('inf' = all at once) instead
  --burstiness B            gamma shape of arrival gaps; 1 = Poisson (default 1)
  --num-requests N          requests per open-loop level (default 64)
  --max-concurrency N       cap on requests in flight in open-loop levels
workload:
  --input-len N|A:B         prompt tokens, uniform in A..B (default 256)
  --output-len N|A:B        max_tokens, uniform in A..B (default 128)
  --prompt-kind K           tokens (random token ids) or words (random words) (default tokens)
  --vocab-range A:B         token ids drawn from A..B (default 100:5000, cut to the served
                            model's vocabulary when /v1/models reports vocab_size)
  --ignore-eos / --no-ignore-eos   send ignore_eos (default on, so lengths hold)
  --temperature T           sampling temperature (default 0)
  --seed N                  workload seed (default 0)
  --warmup N                uncounted requests before the first level (default 1)
  --timeout-s S             per-request deadline (default 600)
report:
  --slo-ttft-ms MS          goodput SLO on TTFT
  --slo-tpot-ms MS          goodput SLO on TPOT
  --out-dir DIR             report.md, report.json, *.svg (default bench/results/serve-<time>/)
  --json FILE               also write the JSON report to FILE
  --progress / --no-progress   progress bar on stderr (default: when stderr is a terminal)`;

/** Where the benchmark writes; tests pass buffers, the CLI the process streams. */
export interface ServeIo {
  /** Report lines (summary per level, file paths). */
  readonly log: (line: string) => void;
  /** Progress bar target; null disables the bar unless --progress forces it. */
  readonly stderr: SyncWriter | null;
  /** Whether stderr is a terminal (progress default). */
  readonly stderrIsTerminal: boolean;
}

const OPTIONS = {
  url: { type: "string" },
  model: { type: "string" },
  "served-model-name": { type: "string" },
  "startup-timeout-s": { type: "string", default: "600" },
  concurrency: { type: "string" },
  "requests-per-level": { type: "string" },
  "request-rate": { type: "string" },
  burstiness: { type: "string", default: "1" },
  "num-requests": { type: "string", default: "64" },
  "max-concurrency": { type: "string" },
  "input-len": { type: "string", default: "256" },
  "output-len": { type: "string", default: "128" },
  "prompt-kind": { type: "string", default: "tokens" },
  "vocab-range": { type: "string" },
  "ignore-eos": { type: "boolean", default: true },
  temperature: { type: "string", default: "0" },
  seed: { type: "string", default: "0" },
  warmup: { type: "string", default: "1" },
  "timeout-s": { type: "string", default: "600" },
  "slo-ttft-ms": { type: "string" },
  "slo-tpot-ms": { type: "string" },
  "out-dir": { type: "string" },
  json: { type: "string" },
  progress: { type: "boolean" },
  help: { type: "boolean", short: "h", default: false },
} as const;

function positiveNumber(text: string, flag: string, allowZero = false): number {
  const v = Number(text);
  if (text.trim() === "" || !Number.isFinite(v) || v < 0 || (!allowZero && v === 0)) {
    throw new UsageError(
      `--${flag} must be a ${allowZero ? "non-negative" : "positive"} number, got '${text}'`,
    );
  }
  return v;
}

function integer(text: string, flag: string, least: number): number {
  if (!/^\d+$/.test(text.trim()) || Number(text) < least) {
    throw new UsageError(`--${flag} must be an integer >= ${least}, got '${text}'`);
  }
  return Number(text);
}

function list<T>(text: string, flag: string, item: (s: string) => T): T[] {
  const parts = text.split(",").map((s) => s.trim());
  if (parts.some((p) => p === "")) throw new UsageError(`--${flag} has an empty item: '${text}'`);
  return parts.map(item);
}

function range(text: string, flag: string, least: number) {
  try {
    return parseRange(text, `--${flag}`, least);
  } catch (e) {
    throw new UsageError(e instanceof Error ? e.message : String(e));
  }
}

function shellQuote(arg: string): string {
  return /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, `'\\''`)}'`;
}

function timestamp(d: Date): string {
  return d.toISOString().replace(/\.\d+Z$/, "").replace(/:/g, "-");
}

/** Token ids prompts are drawn from when `--vocab-range` is not given. */
const DEFAULT_VOCAB_RANGE = "100:5000";

/**
 * The default prompt-id range for a served vocabulary of `vocabSize` ids (null: unknown):
 * 100..5000, cut to the vocabulary (all of it when it has at most 100 ids).
 */
export function defaultVocabRange(vocabSize: number | null): [number, number] {
  if (vocabSize === null) return [100, 5000];
  if (vocabSize <= 100) return [0, vocabSize - 1];
  return [100, Math.min(5000, vocabSize - 1)];
}

/** GET /v1/models: the listed ids, the first model's `vocab_size` if given, the `server` header. */
async function fetchModels(
  url: string,
): Promise<{ ids: string[]; vocabSize: number | null; server: string | null }> {
  const res = await fetch(`${url}/v1/models`, { signal: AbortSignal.timeout(30_000) });
  const body: unknown = await res.json().catch(() => null);
  if (res.status !== 200) throw new Error(`GET ${url}/v1/models answered ${res.status}`);
  const ids: string[] = [];
  let vocabSize: number | null = null;
  if (typeof body === "object" && body !== null && "data" in body && Array.isArray(body.data)) {
    for (const m of body.data) {
      if (typeof m === "object" && m !== null && "id" in m && typeof m.id === "string") {
        ids.push(m.id);
        const v = (m as { vocab_size?: unknown }).vocab_size;
        if (vocabSize === null && typeof v === "number" && Number.isInteger(v) && v > 0) {
          vocabSize = v;
        }
      }
    }
  }
  return { ids, vocabSize, server: res.headers.get("server") };
}

/** The parsed command line. */
interface Settings {
  readonly url: string | undefined;
  readonly modelDir: string | undefined;
  /** Whether `--vocab-range` was given (else it follows the served vocabulary). */
  readonly vocabGiven: boolean;
  readonly engineFlags: string[];
  readonly servedModelName: string | undefined;
  readonly startupTimeoutMs: number;
  readonly config: BenchConfig;
  readonly outDir: string | undefined;
  readonly json: string | undefined;
  readonly progress: boolean | undefined;
}

function parse(argv: string[]): Settings | "help" {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: OPTIONS,
      strict: true,
      allowPositionals: true,
      allowNegative: true,
      tokens: true,
    });
  } catch (e) {
    throw new UsageError(e instanceof Error ? e.message.split("\n")[0]! : String(e));
  }
  const { values, tokens } = parsed;
  if (values.help) return "help";
  const terminator = tokens.findIndex((t) => t.kind === "option-terminator");
  const stray = tokens.find((t, i) =>
    t.kind === "positional" && (terminator < 0 || i < terminator)
  );
  if (stray !== undefined && stray.kind === "positional") {
    throw new UsageError(`unexpected argument '${stray.value}' (engine flags go after '--')`);
  }
  // Every positional comes after "--" (checked above): they are the engine's flags.
  const engineFlags = parsed.positionals;
  if ((values.url === undefined) === (values.model === undefined)) {
    throw new UsageError("pass exactly one of --url URL or --model DIR");
  }
  if (values.url !== undefined && !/^https?:\/\/[^\s/]+/.test(values.url)) {
    throw new UsageError(`--url must be http(s)://host[:port], got '${values.url}'`);
  }
  if (values.url !== undefined && engineFlags.length > 0) {
    throw new UsageError("engine flags after '--' need --model (the server is started here)");
  }
  const rates = values["request-rate"] === undefined
    ? []
    : list(values["request-rate"], "request-rate", (s) =>
      s === "inf" ? Infinity : positiveNumber(s, "request-rate"));
  const mode = rates.length > 0 ? "rate" : "concurrency";
  if (mode === "rate" && values.concurrency !== undefined) {
    throw new UsageError(
      "--concurrency is a closed-loop sweep; with --request-rate use --max-concurrency",
    );
  }
  if (mode === "concurrency" && values["max-concurrency"] !== undefined) {
    throw new UsageError("--max-concurrency applies to --request-rate levels only");
  }
  if (mode === "rate" && values["requests-per-level"] !== undefined) {
    throw new UsageError(
      "--requests-per-level applies to --concurrency levels; use --num-requests",
    );
  }
  const concurrency = mode === "concurrency"
    ? list(
      values.concurrency ?? "1,4,8,16,32,64",
      "concurrency",
      (s) => integer(s, "concurrency", 1),
    )
    : values["max-concurrency"] === undefined
    ? []
    : [integer(values["max-concurrency"], "max-concurrency", 1)];
  const fixedPerLevel = values["requests-per-level"] === undefined
    ? undefined
    : integer(values["requests-per-level"], "requests-per-level", 1);
  const numRequests = integer(values["num-requests"], "num-requests", 1);
  const requestsPerLevel = mode === "concurrency"
    ? concurrency.map((c) => fixedPerLevel ?? Math.max(4 * c, 16))
    : rates.map(() => numRequests);
  const promptKind = values["prompt-kind"];
  if (promptKind !== "tokens" && promptKind !== "words") {
    throw new UsageError(`--prompt-kind must be tokens or words, got '${promptKind}'`);
  }
  const kind: PromptKind = promptKind;
  const slo: Slo = {
    ...(values["slo-ttft-ms"] === undefined
      ? {}
      : { ttftMs: positiveNumber(values["slo-ttft-ms"], "slo-ttft-ms") }),
    ...(values["slo-tpot-ms"] === undefined
      ? {}
      : { tpotMs: positiveNumber(values["slo-tpot-ms"], "slo-tpot-ms") }),
  };
  const config: BenchConfig = {
    mode,
    concurrency,
    requestRates: rates,
    burstiness: positiveNumber(values.burstiness, "burstiness"),
    requestsPerLevel,
    inputLen: range(values["input-len"], "input-len", 1),
    outputLen: range(values["output-len"], "output-len", 1),
    promptKind: kind,
    vocab: range(values["vocab-range"] ?? DEFAULT_VOCAB_RANGE, "vocab-range", 0),
    ignoreEos: values["ignore-eos"],
    temperature: positiveNumber(values.temperature, "temperature", true),
    seed: integer(values.seed, "seed", 0),
    slo,
    timeoutS: positiveNumber(values["timeout-s"], "timeout-s"),
    warmupRequests: integer(values.warmup, "warmup", 0),
  };
  return {
    url: values.url?.replace(/\/+$/, ""),
    modelDir: values.model,
    vocabGiven: values["vocab-range"] !== undefined,
    engineFlags,
    servedModelName: values["served-model-name"],
    startupTimeoutMs: positiveNumber(values["startup-timeout-s"], "startup-timeout-s") * 1000,
    config,
    outDir: values["out-dir"],
    json: values.json,
    progress: values.progress,
  };
}

/** The argv of the local server for `--model DIR` (see local_server.ts for the contract). */
export function localServerCommand(modelDir: string, engineFlags: readonly string[]): string[] {
  const main = new URL("../main.ts", import.meta.url).pathname;
  return [
    Deno.execPath(),
    "run",
    "-A",
    main,
    "serve",
    "--model",
    modelDir,
    "--port",
    "0",
    ...engineFlags,
  ];
}

/**
 * Runs the benchmark with command-line `argv`; returns the exit status. Throws
 * {@linkcode UsageError} for bad input and Error when the server cannot be reached.
 */
export async function runServeBench(argv: string[], io: ServeIo): Promise<number> {
  const settings = parse(argv);
  if (settings === "help") {
    io.log(USAGE);
    return 0;
  }
  let { config } = settings;
  const started = new Date();
  let local: LocalServer | undefined;
  try {
    let url = settings.url;
    if (settings.modelDir !== undefined) {
      io.log(`starting local server for ${settings.modelDir} ...`);
      local = await startLocalServer({
        command: localServerCommand(settings.modelDir, settings.engineFlags),
        startupTimeoutMs: settings.startupTimeoutMs,
      });
      url = local.url;
      io.log(`local server ready at ${url}`);
    }
    if (url === undefined) throw new UsageError("no server URL");
    let models: Awaited<ReturnType<typeof fetchModels>> = {
      ids: [],
      vocabSize: null,
      server: null,
    };
    try {
      models = await fetchModels(url);
    } catch (e) {
      if (settings.servedModelName === undefined) {
        throw new Error(
          `Cannot list models at ${url}/v1/models (${e instanceof Error ? e.message : e}); ` +
            "is the server running? (or pass --served-model-name)",
        );
      }
    }
    if (!settings.vocabGiven) {
      const [lo, hi] = defaultVocabRange(models.vocabSize);
      config = { ...config, vocab: { min: lo, max: hi } };
    }
    const model = settings.servedModelName ?? models.ids[0];
    if (model === undefined) {
      throw new Error(`GET ${url}/v1/models lists no model; pass --served-model-name`);
    }
    const client: ClientConfig = {
      baseUrl: url,
      model,
      ignoreEos: config.ignoreEos,
      temperature: config.temperature,
      timeoutMs: config.timeoutS * 1000,
    };
    const rng = new Rng(config.seed);
    const workload = { inputLen: config.inputLen, outputLen: config.outputLen };
    const common = { ...workload, promptKind: config.promptKind, vocab: config.vocab };
    // Warm-up (uncounted): compiles pipelines, checks the endpoint end to end.
    const warm = planRequests({ ...common, count: config.warmupRequests }, rng);
    for (const w of warm) {
      const r = await streamCompletion({
        ...client,
        prompt: w.prompt,
        promptTokens: w.promptTokens,
        maxTokens: w.maxTokens,
      });
      if (!r.ok) io.log(`warm-up request failed: ${r.error}`);
    }
    const showProgress = settings.progress ?? io.stderrIsTerminal;
    const levels: LevelReport[] = [];
    const count = config.mode === "concurrency"
      ? config.concurrency.length
      : config.requestRates.length;
    for (let i = 0; i < count; i++) {
      const n = config.requestsPerLevel[i]!;
      // Fresh prompts per level: identical prompts would hit the server's prefix cache.
      const requests = planRequests({ ...common, count: n }, rng);
      let plan: LevelPlan;
      let label: string;
      let rate: number | null = null;
      if (config.mode === "concurrency") {
        const c = config.concurrency[i]!;
        plan = { concurrency: c, requests };
        label = `concurrency ${c}`;
      } else {
        rate = config.requestRates[i]!;
        const cap = config.concurrency[0] ?? null;
        plan = {
          concurrency: cap,
          requests,
          arrivalsMs: arrivalTimesMs(n, rate, config.burstiness, rng),
        };
        label = `rate ${Number.isFinite(rate) ? rate : "inf"} req/s` +
          (cap === null ? "" : ` (cap ${cap})`);
      }
      const bar = new ProgressBar(showProgress ? io.stderr : null, label, n);
      const run = await runLevel(plan, client, bar);
      bar.finish();
      const metrics = levelMetrics(run.results, run.durationMs, config.slo);
      levels.push({
        label,
        concurrency: plan.concurrency,
        requestRate: rate,
        startedAt: run.startedAt.toISOString(),
        metrics,
        requests: run.results.map((r) => ({
          index: r.index,
          ok: r.ok,
          ...(r.error === undefined ? {} : { error: r.error }),
          startMs: r.startMs,
          ttftMs: r.ttftMs,
          tpotMs: tpotMs(r),
          e2eMs: r.e2eMs,
          promptTokens: r.promptTokens,
          outputTokens: r.outputTokens,
        })),
      });
      io.log(
        `${label}: ${metrics.successful}/${metrics.totalRequests} ok, ` +
          `${num(metrics.requestThroughput)} req/s, ${
            num(metrics.outputThroughput)
          } output tok/s, ` +
          `TTFT p50 ${num(metrics.ttftMs?.p50)} ms p95 ${num(metrics.ttftMs?.p95)} ms, ` +
          `TPOT p50 ${num(metrics.tpotMs?.p50)} ms, E2E p50 ${num(metrics.e2eMs?.p50)} ms` +
          (metrics.errors[0] ? ` (first error: ${metrics.errors[0].message})` : ""),
      );
    }
    const report: BenchReport = {
      schema: "webgpu-llm/bench-serve/1",
      command: ["deno", "run", "-A", "bench/serve.ts", ...argv].map(shellQuote).join(" "),
      date: started.toISOString(),
      url,
      modelDir: settings.modelDir ?? null,
      servedModelName: model,
      serverModels: models.ids,
      serverHeader: models.server,
      config,
      levels,
      observations: analyze(levels, config.slo),
    };
    const outDir = settings.outDir ??
      new URL(`./results/serve-${timestamp(started)}`, import.meta.url).pathname;
    await Deno.mkdir(outDir, { recursive: true });
    const json = JSON.stringify(report, (_k, v) => (v === Infinity ? "inf" : v), 2) + "\n";
    await Deno.writeTextFile(`${outDir}/report.md`, renderMarkdown(report));
    await Deno.writeTextFile(`${outDir}/report.json`, json);
    for (const [name, svg] of reportCharts(report)) {
      await Deno.writeTextFile(`${outDir}/${name}`, svg);
    }
    if (settings.json !== undefined) await Deno.writeTextFile(settings.json, json);
    io.log(`report: ${outDir}/report.md (JSON: ${settings.json ?? `${outDir}/report.json`})`);
    return levels.some((l) => l.metrics.successful > 0) ? 0 : 1;
  } finally {
    await local?.close();
  }
}

if (import.meta.main) {
  let code: number;
  try {
    code = await runServeBench(Deno.args, {
      log: (line) => console.log(line),
      stderr: Deno.stderr,
      stderrIsTerminal: Deno.stderr.isTerminal(),
    });
  } catch (e) {
    if (e instanceof UsageError) {
      code = reportUsage(e, { log: console.log, err: console.error }, "bench:serve");
    } else {
      console.error(`error: ${(e instanceof Error ? e.message : String(e)).split("\n")[0]}`);
      code = 1;
    }
  }
  Deno.exit(code);
}
