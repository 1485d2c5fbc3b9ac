/**
 * `main.ts serve`: the OpenAI-compatible server. It listens at once (`/health` answers 503 while
 * the model loads), loads the engine, then turns ready. SIGINT / SIGTERM stop accepting new
 * requests, let in-flight ones finish for `--shutdown-timeout` seconds, abort the rest and exit
 * 0. A fatal engine error (device lost, a broken invariant) prints one line
 * (`[engine] fatal: ...`), fails the in-flight requests, and exits with status 1 within 5 s so
 * that a supervisor restarts the process; `--keep-alive-on-fatal` keeps it answering 503
 * instead. The line `Listening on http://HOST:PORT` is printed once the socket is bound
 * (benchmarks that start the server parse it). What the server answers while the model loads is
 * cli/loading_engine.ts.
 *
 * @module
 */

import type { ModelInfo } from "../engine/engine_api.ts";
import { type EngineOptions, resolveEngineConfig } from "../engine/engine_config.ts";
import { LLMEngine, resolveMaxModelLen } from "../engine/llm_engine.ts";
import { parseModelConfig } from "../engine/model/config.ts";
import { mockBatchTestFactory } from "../server/batch_test.ts";
import { isLoopbackHost } from "../server/security.ts";
import { type RunningServer, startServer } from "../server/server.ts";
import { LoadingEngine } from "./loading_engine.ts";
import {
  defaultServedName,
  ENGINE_FLAGS,
  ENGINE_FLAGS_USAGE,
  engineOptionsFromFlags,
  resolveModelDir,
} from "./engine_flags.ts";
import { parseCommandArgs } from "./usage.ts";
import {
  normalizeVllmArgs,
  VLLM_SERVE_FLAGS,
  VLLM_SERVE_FLAGS_USAGE,
  vllmServeFlagValues,
} from "./vllm_flags.ts";
import {
  API_KEY_ENV,
  SERVE_FLAGS,
  SERVE_FLAGS_USAGE,
  type ServeSettings,
  serveSettingsFromFlags,
} from "./serve_flags.ts";

export const SERVE_USAGE = `usage: main.ts serve [MODEL | --model DIR] [server flags] [engine flags]

${SERVE_FLAGS_USAGE}

${ENGINE_FLAGS_USAGE}

${VLLM_SERVE_FLAGS_USAGE}`;

/** A fatal engine error ends the process within this many ms (status 1). */
const FATAL_EXIT_MS = 4500;

/** Runs `serve` with `args`; resolves with the exit code once the server has stopped. */
export async function runServe(args: string[]): Promise<number> {
  const normalized = normalizeVllmArgs(args);
  const parsed = parseCommandArgs("serve", {
    args: normalized.args,
    allowPositionals: true,
    options: {
      ...ENGINE_FLAGS,
      ...SERVE_FLAGS,
      ...VLLM_SERVE_FLAGS,
      help: { type: "boolean", default: false },
    },
  });
  if (parsed.values.help) {
    console.log(SERVE_USAGE);
    return 0;
  }
  const values = { ...parsed.values, ...vllmServeFlagValues(parsed.values, parsed.positionals) };
  const settings = serveSettingsFromFlags(values);
  const mock = values.executor === "mock";
  const model = mock && values.model === undefined
    ? undefined
    : await resolveModelDir(values.model, values.revision);
  const options = engineOptionsFromFlags({ ...values, ...(model !== undefined ? { model } : {}) });
  // Checked before the port is bound: a bad option never opens it.
  resolveEngineConfig(options);
  const servedName = values["served-model-name"] ??
    (model !== undefined ? await defaultServedName(values.model ?? model, model) : "mock");
  const loading = new LoadingEngine(
    await infoBeforeLoading(servedName, mock ? undefined : model, options),
  );
  const run = new ServeRun(settings, loading, [servedName, ...normalized.moreNames]);
  const onInt = () => void run.stop("SIGINT");
  const onTerm = () => void run.stop("SIGTERM");
  Deno.addSignalListener("SIGINT", onInt);
  Deno.addSignalListener("SIGTERM", onTerm);
  try {
    await run.load(options);
    await run.server.finished;
  } finally {
    Deno.removeSignalListener("SIGINT", onInt);
    Deno.removeSignalListener("SIGTERM", onTerm);
  }
  return run.exitCode;
}

/**
 * What clients may see before the weights are loaded: the model's name and context length (from
 * its config.json; `model` undefined: the mock's).
 */
async function infoBeforeLoading(
  name: string,
  model: string | undefined,
  options: EngineOptions,
): Promise<ModelInfo> {
  if (model === undefined) {
    return {
      name,
      architecture: "mock",
      maxModelLen: options.maxModelLen ?? 4096,
      vocabSize: 0,
      dtype: "none",
    };
  }
  const config = parseModelConfig(JSON.parse(await Deno.readTextFile(`${model}/config.json`)));
  return {
    name,
    architecture: config.arch,
    maxModelLen: resolveMaxModelLen(options.maxModelLen, config),
    vocabSize: config.vocabSize,
    dtype: "none",
  };
}

/**
 * One `serve` run: the server, listening from the start (not ready while the model loads), the
 * engine it hands over once loaded, and how the run stops (a signal, or a fatal engine error).
 */
class ServeRun {
  readonly server: RunningServer;
  /** The process's exit status: 1 after a fatal engine error, else 0. */
  exitCode = 0;
  readonly #settings: ServeSettings;
  readonly #loading: LoadingEngine;
  /** The names requests may use; the first is the one reported. */
  readonly #servedNames: readonly string[];
  #stopping = false;

  /** Starts the server in front of `loading`, and says so. */
  constructor(settings: ServeSettings, loading: LoadingEngine, servedNames: readonly string[]) {
    this.#settings = settings;
    this.#loading = loading;
    this.#servedNames = servedNames;
    this.server = startServer(loading, {
      ...settings.server,
      ready: false,
      servedModelNames: servedNames,
      batchTest: mockBatchTestFactory,
    });
    log(
      `Listening on ${this.server.url} (loading the model: /health answers 503 until it is ready)`,
    );
    const host = settings.server.host ?? "127.0.0.1";
    if (!isLoopbackHost(host) && settings.server.apiKey === null) {
      console.error(
        `warning: listening on ${host} without an API key: anyone who can reach this address ` +
          `can use the server (set --api-key or ${API_KEY_ENV})`,
      );
    }
  }

  /**
   * Loads the engine and hands it to the server (ready from then on); a load that fails stops
   * the server and is rethrown.
   */
  async load(options: EngineOptions): Promise<void> {
    try {
      const engine = await LLMEngine.create(
        { ...options, servedModelName: this.#servedNames[0]! },
        log,
      );
      if (this.#stopping) {
        await engine.shutdown(0);
        return;
      }
      this.#loading.resolve(engine);
      this.server.handle.setReady(true);
      void engine.failed.then((error) => this.#fatal(error));
      const m = engine.model;
      log(
        `Serving ${m.name} (${m.architecture}, ${m.dtype}, max_model_len ${m.maxModelLen}) at ${this.server.url}/v1`,
      );
    } catch (error) {
      this.#loading.reject(error instanceof Error ? error : new Error(String(error)));
      await this.server.shutdown(0);
      throw error;
    }
  }

  /** Stops once: in-flight requests get `graceSeconds`, then the server and engine stop. */
  async stop(why: string, graceSeconds = this.#settings.graceS): Promise<void> {
    if (this.#stopping) return;
    this.#stopping = true;
    log(`${why}: finishing in-flight requests (up to ${graceSeconds} s), then exiting`);
    await this.server.shutdown(graceSeconds * 1000);
    await this.#loading.shutdown(0);
  }

  /** A fatal engine error: exit with status 1 within 5 s, or keep answering 503. */
  #fatal(error: Error): void {
    if (this.#stopping) return;
    console.error(`[engine] fatal: ${error.message.split("\n")[0]}`);
    if (this.#settings.keepAliveOnFatal) {
      log("The engine stopped: answering 503 until restarted (--keep-alive-on-fatal)");
      return;
    }
    this.exitCode = 1;
    // In-flight requests already ended with the error; give their responses a moment,
    // and exit within 5 s whatever happens so a supervisor restarts the process.
    Deno.unrefTimer(setTimeout(() => Deno.exit(1), FATAL_EXIT_MS));
    void this.stop("fatal error", 1);
  }
}

/** `serve`'s log lines go to stdout. */
function log(line: string): void {
  console.log(line);
}
