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

import { reportUsage, UsageError } from "./bench_io.ts";
import type { SyncWriter } from "./serve/progress.ts";
import { analyze } from "./serve/analysis.ts";
import type { BenchConfig, BenchReport, LevelReport } from "./serve/report.ts";
import { renderMarkdown } from "./serve/report_markdown.ts";
import { reportCharts } from "./serve/report_svg.ts";
import type { ClientConfig } from "./serve/runner.ts";
import { type LocalServer, startLocalServer } from "./serve/local_server.ts";
import { parseServeArgs, type Settings, USAGE } from "./serve/options.ts";
import {
  defaultVocabRange,
  fetchModels,
  NO_MODELS,
  type ServerModels,
} from "./serve/server_models.ts";
import { runSweep } from "./serve/sweep.ts";

/** Where the benchmark writes; tests pass buffers, the CLI the process streams. */
export interface ServeIo {
  /** Report lines (summary per level, file paths). */
  readonly log: (line: string) => void;
  /** Progress bar target; null disables the bar unless --progress forces it. */
  readonly stderr: SyncWriter | null;
  /** Whether stderr is a terminal (progress default). */
  readonly stderrIsTerminal: boolean;
}

function shellQuote(arg: string): string {
  return /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, `'\\''`)}'`;
}

function timestamp(d: Date): string {
  return d.toISOString().replace(/\.\d+Z$/, "").replace(/:/g, "-");
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

/** The server's models, the model to request, and the config with the vocabulary it implies. */
interface Target {
  readonly models: ServerModels;
  readonly model: string;
  readonly config: BenchConfig;
}

/**
 * Asks the server at `url` for its models: the first one is requested unless
 * `--served-model-name` names one (then an unreadable list is no error), and prompt ids follow
 * its vocabulary unless `--vocab-range` was given.
 */
async function resolveTarget(url: string, settings: Settings): Promise<Target> {
  let models = NO_MODELS;
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
  let config = settings.config;
  if (!settings.vocabGiven) {
    const [lo, hi] = defaultVocabRange(models.vocabSize);
    config = { ...config, vocab: { min: lo, max: hi } };
  }
  const model = settings.servedModelName ?? models.ids[0];
  if (model === undefined) {
    throw new Error(`GET ${url}/v1/models lists no model; pass --served-model-name`);
  }
  return { models, model, config };
}

/** Writes report.md, report.json and the charts to the output folder (and `--json FILE`). */
async function writeReport(report: BenchReport, settings: Settings, started: Date) {
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
  return outDir;
}

/** Starts the local server of `--model DIR`, logging its progress. */
async function startServer(settings: Settings, modelDir: string, io: ServeIo) {
  io.log(`starting local server for ${modelDir} ...`);
  const local = await startLocalServer({
    command: localServerCommand(modelDir, settings.engineFlags),
    startupTimeoutMs: settings.startupTimeoutMs,
  });
  io.log(`local server ready at ${local.url}`);
  return local;
}

/**
 * Runs the benchmark with command-line `argv`; returns the exit status. Throws
 * {@linkcode UsageError} for bad input and Error when the server cannot be reached.
 */
export async function runServeBench(argv: string[], io: ServeIo): Promise<number> {
  const settings = parseServeArgs(argv);
  if (settings === "help") {
    io.log(USAGE);
    return 0;
  }
  const started = new Date();
  let local: LocalServer | undefined;
  try {
    if (settings.modelDir !== undefined) local = await startServer(settings, settings.modelDir, io);
    const url = local?.url ?? settings.url;
    if (url === undefined) throw new UsageError("no server URL");
    const { models, model, config } = await resolveTarget(url, settings);
    const client: ClientConfig = {
      baseUrl: url,
      model,
      ignoreEos: config.ignoreEos,
      temperature: config.temperature,
      timeoutMs: config.timeoutS * 1000,
    };
    const showProgress = settings.progress ?? io.stderrIsTerminal;
    const levels: LevelReport[] = await runSweep(config, client, {
      log: io.log,
      progress: showProgress ? io.stderr : null,
    });
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
    const outDir = await writeReport(report, settings, started);
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
