/**
 * `main.ts serve`: the OpenAI-compatible server. It listens at once (`/health` answers 503 while
 * the model loads), loads the engine, then turns ready. SIGINT / SIGTERM stop accepting new
 * requests, let in-flight ones finish for `--shutdown-timeout` seconds, abort the rest and exit
 * 0. A fatal engine error (device lost, a broken invariant) prints one line
 * (`[engine] fatal: ...`), fails the in-flight requests, and exits with status 1 within 5 s so
 * that a supervisor restarts the process; `--keep-alive-on-fatal` keeps it answering 503
 * instead. The line `Listening on http://HOST:PORT` is printed once the socket is bound
 * (benchmarks that start the server parse it).
 *
 * @module
 */

import {
  type EngineClient,
  EngineDeadError,
  type EngineStats,
  type GenerateRequest,
  type ModelInfo,
  type RequestOutput,
} from "../engine/engine_api.ts";
import { LLMEngine, resolveMaxModelLen } from "../engine/llm_engine.ts";
import { parseModelConfig } from "../engine/model/config.ts";
import type { Tokenizer } from "../engine/tokenizer.ts";
import type { SamplingParams } from "../scheduler/sampling_params.ts";
import { mockBatchTestFactory } from "../server/batch_test.ts";
import { isLoopbackHost } from "../server/security.ts";
import { startServer } from "../server/server.ts";
import {
  defaultServedName,
  ENGINE_FLAGS,
  ENGINE_FLAGS_USAGE,
  engineOptionsFromFlags,
  resolveModelDir,
} from "./engine_flags.ts";
import { parseCommandArgs } from "./usage.ts";
import {
  API_KEY_ENV,
  SERVE_FLAGS,
  SERVE_FLAGS_USAGE,
  serveSettingsFromFlags,
} from "./serve_flags.ts";

export const SERVE_USAGE = `usage: main.ts serve [--model DIR] [server flags] [engine flags]

${SERVE_FLAGS_USAGE}

${ENGINE_FLAGS_USAGE}`;

/** A fatal engine error ends the process within this many ms (status 1). */
const FATAL_EXIT_MS = 4500;

const IDLE_STATS: EngineStats = {
  numRunning: 0,
  numWaiting: 0,
  kvCacheUsage: 0,
  kvBlocksUsed: 0,
  kvBlocksTotal: 0,
  promptTokensTotal: 0,
  generationTokensTotal: 0,
  prefixCacheQueries: 0,
  prefixCacheHits: 0,
  numPreemptions: 0,
  steps: 0,
};

/**
 * Stands in for the engine while it loads: requests get 503 (EngineDeadError) until
 * {@linkcode LoadingEngine.resolve} hands over the real one.
 */
export class LoadingEngine implements EngineClient {
  readonly #info: ModelInfo;
  #engine: LLMEngine | null = null;
  #error: Error | null = null;

  /** @param info what is known before loading (name, architecture, max_model_len). */
  constructor(info: ModelInfo) {
    this.#info = info;
  }

  /** Hands over the loaded engine. */
  resolve(engine: LLMEngine): void {
    this.#engine = engine;
  }

  /** Records a failed load (`/health` turns 503 for good). */
  reject(error: Error): void {
    this.#error = error;
  }

  get model(): ModelInfo {
    return this.#engine?.model ?? this.#info;
  }

  get tokenizer(): Tokenizer | null {
    return this.#engine?.tokenizer ?? null;
  }

  get generationDefaults(): Partial<SamplingParams> {
    return this.#engine?.generationDefaults ?? {};
  }

  get error(): Error | null {
    return this.#error ?? this.#engine?.error ?? null;
  }

  generate(request: GenerateRequest, signal?: AbortSignal): AsyncIterable<RequestOutput> {
    if (this.#engine === null) throw new EngineDeadError("The model is still loading");
    return this.#engine.generate(request, signal);
  }

  abort(requestId: string): void {
    this.#engine?.abort(requestId);
  }

  stats(): EngineStats {
    return this.#engine?.stats() ?? IDLE_STATS;
  }

  async shutdown(graceMs?: number): Promise<void> {
    await this.#engine?.shutdown(graceMs);
  }
}

/** Runs `serve` with `args`; resolves with the exit code once the server has stopped. */
export async function runServe(args: string[]): Promise<number> {
  const { values } = parseCommandArgs("serve", {
    args,
    options: { ...ENGINE_FLAGS, ...SERVE_FLAGS, help: { type: "boolean", default: false } },
  });
  if (values.help) {
    console.log(SERVE_USAGE);
    return 0;
  }
  const settings = serveSettingsFromFlags(values);
  const { graceS } = settings;
  const log = (line: string) => console.log(line);
  const mock = values.executor === "mock";
  const model = mock && values.model === undefined
    ? undefined
    : await resolveModelDir(values.model, values.revision);
  const options = engineOptionsFromFlags({ ...values, ...(model !== undefined ? { model } : {}) });
  const servedName = values["served-model-name"] ??
    (model !== undefined ? await defaultServedName(values.model ?? model, model) : "mock");

  // What clients may see before the weights are loaded: the model's name and context length.
  let info: ModelInfo = {
    name: servedName,
    architecture: "mock",
    maxModelLen: options.maxModelLen ?? 4096,
    vocabSize: 0,
    dtype: "none",
  };
  if (!mock && model !== undefined) {
    const config = parseModelConfig(JSON.parse(await Deno.readTextFile(`${model}/config.json`)));
    info = {
      name: servedName,
      architecture: config.arch,
      maxModelLen: resolveMaxModelLen(options.maxModelLen, config),
      vocabSize: config.vocabSize,
      dtype: "none",
    };
  }
  const loading = new LoadingEngine(info);
  const server = startServer(loading, {
    ...settings.server,
    ready: false,
    servedModelNames: [servedName],
    batchTest: mockBatchTestFactory,
  });
  log(`Listening on ${server.url} (loading the model: /health answers 503 until it is ready)`);
  const host = settings.server.host ?? "127.0.0.1";
  if (!isLoopbackHost(host) && settings.server.apiKey === null) {
    console.error(
      `warning: listening on ${host} without an API key: anyone who can reach this address ` +
        `can use the server (set --api-key or ${API_KEY_ENV})`,
    );
  }

  let stopping = false;
  let exitCode = 0;
  const stop = async (why: string, graceSeconds = graceS) => {
    if (stopping) return;
    stopping = true;
    log(`${why}: finishing in-flight requests (up to ${graceSeconds} s), then exiting`);
    await server.shutdown(graceSeconds * 1000);
    await loading.shutdown(0);
  };
  const onInt = () => void stop("SIGINT");
  const onTerm = () => void stop("SIGTERM");
  Deno.addSignalListener("SIGINT", onInt);
  Deno.addSignalListener("SIGTERM", onTerm);
  try {
    try {
      const engine = await LLMEngine.create({ ...options, servedModelName: servedName }, log);
      if (stopping) {
        await engine.shutdown(0);
      } else {
        loading.resolve(engine);
        server.handle.setReady(true);
        void engine.failed.then((error) => {
          if (stopping) return;
          console.error(`[engine] fatal: ${error.message.split("\n")[0]}`);
          if (settings.keepAliveOnFatal) {
            log("The engine stopped: answering 503 until restarted (--keep-alive-on-fatal)");
            return;
          }
          exitCode = 1;
          // In-flight requests already ended with the error; give their responses a moment,
          // and exit within 5 s whatever happens so a supervisor restarts the process.
          Deno.unrefTimer(setTimeout(() => Deno.exit(1), FATAL_EXIT_MS));
          void stop("fatal error", 1);
        });
        const m = engine.model;
        log(
          `Serving ${m.name} (${m.architecture}, ${m.dtype}, max_model_len ${m.maxModelLen}) at ${server.url}/v1`,
        );
      }
    } catch (error) {
      loading.reject(error instanceof Error ? error : new Error(String(error)));
      await server.shutdown(0);
      throw error;
    }
    await server.finished;
  } finally {
    Deno.removeSignalListener("SIGINT", onInt);
    Deno.removeSignalListener("SIGTERM", onTerm);
  }
  return exitCode;
}
