/**
 * The OpenAI-compatible HTTP server (vLLM's endpoints) over an {@linkcode EngineClient}.
 *
 * | endpoint | what |
 * | --- | --- |
 * | `POST /v1/completions` | text completion; `prompt` is a string, a list of strings, token ids or a list of token-id lists |
 * | `POST /v1/chat/completions` | chat completion through the model's chat template |
 * | `POST /v1/responses` | OpenAI's Responses API on the chat path (server/responses.ts) |
 * | `GET /v1/models` | the served model names, with `max_model_len`; `/v1/models/{id}`: one |
 * | `GET /health` | 200 (empty) when ready, 503 while loading, draining or after an engine error |
 * | `GET`, `POST /ping` | the same as `/health` (SageMaker's check) |
 * | `POST /invocations` | SageMaker's inference route: chat (`messages`) or completions (`prompt`) by the body |
 * | `GET /version` | `{"version"}` of this server |
 * | `GET /metrics` | Prometheus text format, vLLM's metric names (server/metrics.ts) |
 * | `POST /tokenize`, `POST /detokenize` | vLLM's tokenizer endpoints |
 * | `POST /batch/test` | the mock batching experiment (server/batch_test.ts), when a factory is given |
 *
 * Streaming answers are Server-Sent Events (`data: {chunk}\n\n`, ending `data: [DONE]\n\n`); with
 * `stream_options.include_usage` one chunk with empty `choices` and `usage` precedes `[DONE]`.
 * `n` > 1 (and a list of prompts) fans out into one engine request per choice; choice
 * `p * n + i` is prompt `p`'s i-th sample, and with a `seed` choice i uses `seed + i`.
 *
 * Before routing, server/security.ts checks the `Host` header (loopback names only when bound to
 * a loopback address), answers CORS preflights (CORS is off unless `allowedOrigins`), checks
 * the API key (`apiKey`) and requires JSON POST bodies.
 *
 * Errors are OpenAI-style JSON bodies `{error: {message, type, param, code}}`: 400 invalid input
 * (and the engine's RangeError / TypeError), 401 missing or wrong API key, 403 host or origin
 * not allowed, 404 unknown path or model, 405 wrong method (with `Allow`), 408 head or body not in
 * within `requestReadTimeoutMs`, 413 body over `maxBodyBytes` (enforced while reading), 415 a
 * POST body that is not JSON, 429 engine overloaded (with `Retry-After`), 503 not ready /
 * draining / engine dead, 504 past `requestTimeoutMs`, 500 anything else (message only, the
 * stack goes to `onError`; an engine request that failed inside a step is one).
 *
 * The engine is asked for the first output of every choice before the response starts, so
 * errors the engine raises at admission get their status code even for streaming requests.
 * A client disconnect (request signal, or the SSE stream cancelled) aborts every engine request
 * of the response at once.
 *
 * Layout: this file builds the handler and serves it; server/routes.ts routes (and answers
 * `/v1/models`, `/health`, `/metrics`); server/generate.ts answers the two generation endpoints
 * (request preparation in server/prepare.ts and server/sampling.ts, one engine request per choice
 * in server/choice_run.ts, streaming in server/sse.ts, logprobs shapes in server/logprobs.ts);
 * server/tokenize.ts the tokenizer endpoints; server/lifecycle.ts readiness and drain;
 * server/errors.ts and server/read_json.ts error mapping and body reading.
 *
 * @module
 */

import type { EngineClient } from "../engine/engine_api.ts";
import type { BatchTestFactory } from "./batch_test.ts";
import type { ServerContext } from "./context.ts";
import { internalError, toApiError } from "./errors.ts";
import { Lifecycle } from "./lifecycle.ts";
import { ServerMetrics } from "./metrics.ts";
import { errorResponse } from "./protocol.ts";
import { route, type RouteSettings } from "./routes.ts";
import { RequestGuard } from "./security.ts";
import type { ConnectionGuardStats } from "./connection_guard.ts";
import { listen, type ServerTls } from "./listener.ts";
import type { ReasoningParserName } from "./reasoning.ts";

export type { BatchTestConfig, BatchTestFactory, BatchTestResult } from "./batch_test.ts";
export { ApiError } from "./protocol.ts";
export { ServerMetrics } from "./metrics.ts";
export type { ServerTls } from "./listener.ts";

/** Options of {@linkcode createHandler}. */
export interface ServerOptions {
  /** Names requests may use in `model`; the first is reported. Default `[engine.model.name]`. */
  servedModelNames?: readonly string[];
  /** Largest accepted request body in bytes (413 beyond). Default 1 MiB. */
  maxBodyBytes?: number;
  /** Builds the mock engine of `POST /batch/test`; without it that endpoint answers 501. */
  batchTest?: BatchTestFactory;
  /** Initial readiness (`/health` 503 and inference 503 until {@linkcode ServerHandler.setReady}). Default true. */
  ready?: boolean;
  /** `Retry-After` seconds sent with 429. Default 1. */
  retryAfterSeconds?: number;
  /** Called with unexpected errors (answered 500). Default: `console.error`. */
  onError?: (error: unknown) => void;
  /** Called with the server's warnings, e.g. ignored request fields. Default: `console.warn`. */
  onWarning?: (message: string) => void;
  /**
   * Bearer token required by `/v1/*`, `/tokenize`, `/detokenize`, `/batch/test` and
   * `/invocations` (server/security.ts).
   */
  apiKey?: string | null;
  /** Origins allowed by CORS (`*`: any). Default: CORS off. */
  allowedOrigins?: readonly string[] | "*" | null;
  /** Accepted `Host` names (`*`: any). Default: loopback names when bound to loopback, else any. */
  allowedHosts?: readonly string[] | "*" | null;
  /** The address the server is bound to (decides the default Host check). Default 127.0.0.1. */
  bindHost?: string;
  /**
   * Time a request head, and then its body, may take to arrive, ms (408 after; 0 = no limit, and
   * {@linkcode startServer} serves without the connection guard). Default 30,000.
   */
  requestReadTimeoutMs?: number;
  /** Time a whole generation request may take, ms (then aborted: 504 / SSE error; 0 = no limit). Default 0. */
  requestTimeoutMs?: number;
  /** Splits chat answers into `reasoning_content` and `content` (server/reasoning.ts). Default off. */
  reasoningParser?: ReasoningParserName | null;
  /**
   * Logprobs name their tokens `token_id:<id>` unless a request sets
   * `return_tokens_as_token_ids` false (vLLM's `--return-tokens-as-token-ids`). Default false.
   */
  returnTokensAsTokenIds?: boolean;
}

/** The request handler plus its state. */
export interface ServerHandler {
  /** Answers one HTTP request (never throws). */
  handler: (req: Request) => Promise<Response>;
  /** The metric set behind `GET /metrics`. */
  metrics: ServerMetrics;
  /** Whether `/health` says 200 (while the engine has no error and the server is not draining). */
  readonly ready: boolean;
  /** Marks the server ready or not (e.g. false while the model loads). */
  setReady(ready: boolean): void;
  /** Whether {@linkcode drain} was called: new inference requests get 503. */
  readonly draining: boolean;
  /** Inference (and /batch/test) requests whose response is not finished yet. */
  readonly inFlight: number;
  /**
   * Stops accepting inference requests (503), waits up to `graceMs` for in-flight ones to finish,
   * then aborts the rest and waits for their responses to close.
   */
  drain(graceMs: number): Promise<void>;
}

const DEFAULT_MAX_BODY = 1 << 20;
const DEFAULT_READ_TIMEOUT_MS = 30_000;
const DEFAULT_KEEP_ALIVE_MS = 5_000;

/** The state the endpoints share, from `options` (their defaults filled in). */
function serverContext(engine: EngineClient, options: ServerOptions): ServerContext {
  const names = options.servedModelNames ?? [engine.model.name];
  if (names.length === 0) throw new RangeError("Cannot serve: servedModelNames is empty");
  const modelName = names[0]!;
  return {
    engine,
    reasoningParser: options.reasoningParser ?? null,
    tokensAsIds: options.returnTokensAsTokenIds ?? false,
    names,
    modelName,
    maxBody: options.maxBodyBytes ?? DEFAULT_MAX_BODY,
    readTimeoutMs: options.requestReadTimeoutMs ?? DEFAULT_READ_TIMEOUT_MS,
    retryAfter: options.retryAfterSeconds ?? 1,
    onError: options.onError ?? ((e: unknown) => console.error("[server] internal error:", e)),
    metrics: new ServerMetrics(modelName, engine.model.maxModelLen, engine.model.cache),
    lifecycle: new Lifecycle(options.ready ?? true, options.requestTimeoutMs ?? 0),
    warn: options.onWarning ?? ((message: string) => console.warn(`[server] ${message}`)),
    ignoredFieldsSeen: new Set(),
  };
}

/**
 * Builds the request handler for `engine` (see the module doc for the endpoints). Use
 * {@linkcode startServer} to serve it, or pass `handler` to `Deno.serve` yourself.
 */
export function createHandler(engine: EngineClient, options: ServerOptions = {}): ServerHandler {
  const ctx = serverContext(engine, options);
  const guard = new RequestGuard({
    apiKey: options.apiKey ?? null,
    allowedOrigins: options.allowedOrigins ?? null,
    allowedHosts: options.allowedHosts ?? null,
    bindHost: options.bindHost ?? "127.0.0.1",
  });
  const { metrics, lifecycle } = ctx;
  const settings: RouteSettings = {
    batchTest: options.batchTest,
    startedAt: Math.floor(Date.now() / 1000),
  };

  async function handler(req: Request): Promise<Response> {
    let res: Response;
    try {
      const path = new URL(req.url).pathname;
      res = guard.check(req, path) ?? await route(ctx, settings, req, path);
    } catch (e) {
      res = errorResponse(toApiError(e, ctx.retryAfter) ?? internalError(e, ctx.onError));
    }
    return guard.decorate(req, res);
  }

  return {
    handler,
    metrics,
    get ready() {
      return lifecycle.healthy(engine);
    },
    setReady(value: boolean) {
      lifecycle.setReady(value);
    },
    get draining() {
      return lifecycle.draining;
    },
    get inFlight() {
      return lifecycle.inFlight;
    },
    drain(graceMs: number) {
      return lifecycle.drain(graceMs);
    },
  };
}

/** Options of {@linkcode startServer}. */
export interface StartServerOptions extends ServerOptions {
  /** Interface to listen on. Default "127.0.0.1". */
  host?: string;
  /** Port; 0 picks a free one. Default 8000. */
  port?: number;
  /** Called once listening, with the base URL. */
  onListen?: (url: string) => void;
  /** Idle time allowed between answered requests on one connection, ms. Default 5,000. */
  keepAliveTimeoutMs?: number;
  /** PEM certificate chain and private key: serve HTTPS (vLLM's `--ssl-certfile`, `--ssl-keyfile`). */
  tls?: ServerTls | null;
}

/** A listening server. */
export interface RunningServer {
  /** Base URL, e.g. `http://127.0.0.1:8000` (`https` with TLS). */
  readonly url: string;
  readonly port: number;
  /** The handler and its state (metrics, readiness). */
  readonly handle: ServerHandler;
  /** What the connection guard has cut (null when `requestReadTimeoutMs` is 0: no guard). */
  readonly guardStats: Readonly<ConnectionGuardStats> | null;
  /** Resolves when the listener has closed. */
  readonly finished: Promise<void>;
  /**
   * Graceful shutdown: new inference requests get 503, in-flight ones may finish for up to
   * `graceMs` (default 5000), the rest are aborted, then the listener closes. The engine is not
   * shut down (call `engine.shutdown()` afterwards).
   */
  shutdown(graceMs?: number): Promise<void>;
}

/** Serves {@linkcode createHandler}'s handler (server/listener.ts: behind the connection guard). */
export function startServer(engine: EngineClient, options: StartServerOptions = {}): RunningServer {
  const hostname = options.host ?? "127.0.0.1";
  const handle = createHandler(engine, { bindHost: hostname, ...options });
  const server = listen(handle.handler, {
    hostname,
    port: options.port ?? 8000,
    headerTimeoutMs: options.requestReadTimeoutMs ?? DEFAULT_READ_TIMEOUT_MS,
    keepAliveTimeoutMs: options.keepAliveTimeoutMs ?? DEFAULT_KEEP_ALIVE_MS,
    tls: options.tls ?? null,
  });
  const port = server.port;
  const host = hostname.includes(":") ? `[${hostname}]` : hostname;
  const url = `${options.tls ? "https" : "http"}://${host}:${port}`;
  options.onListen?.(url);
  let stopping: Promise<void> | null = null;
  return {
    url,
    port,
    handle,
    guardStats: server.guardStats,
    finished: server.finished,
    shutdown(graceMs = 5000) {
      stopping ??= (async () => {
        await handle.drain(graceMs);
        await server.shutdown();
      })();
      return stopping;
    },
  };
}
