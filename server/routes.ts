/**
 * The route table of the HTTP server ({@linkcode ROUTES}: path -> allowed methods) and
 * {@linkcode route}, which answers 404 / 405 / 415 and dispatches a request to its endpoint; with
 * the small read-only endpoints `GET /v1/models` (and `/v1/models/{id}`), `GET /health` (and
 * SageMaker's `/ping`, as vLLM serves it), `GET /version` and `GET /metrics`; SageMaker's
 * `POST /invocations` dispatches to chat or completions by its body. The other endpoints
 * live in server/generate.ts, server/responses.ts, server/tokenize.ts and server/batch_test.ts.
 *
 * @module
 */

import { batchTestEndpoint, type BatchTestFactory } from "./batch_test.ts";
import { checkModel, type ServerContext } from "./context.ts";
import { generateEndpoint } from "./generate.ts";
import { PROMETHEUS_CONTENT_TYPE } from "./prometheus.ts";
import { readJson } from "./read_json.ts";
import { ApiError } from "./protocol.ts";
import { responsesEndpoint } from "./responses.ts";
import { checkJsonContentType } from "./security.ts";
import { detokenizeEndpoint, tokenizeEndpoint } from "./tokenize.ts";
import { VERSION } from "./version.ts";

/** The served paths and the methods each accepts (405 with `Allow` for the others). */
const ROUTES: Readonly<Record<string, readonly string[]>> = {
  "/v1/completions": ["POST"],
  "/v1/chat/completions": ["POST"],
  "/v1/responses": ["POST"],
  "/v1/models": ["GET"],
  "/health": ["GET"],
  "/ping": ["GET", "POST"],
  "/version": ["GET"],
  "/metrics": ["GET"],
  "/tokenize": ["POST"],
  "/detokenize": ["POST"],
  "/batch/test": ["POST"],
  "/invocations": ["POST"],
};

/** `GET /v1/models/{id}`: one served model (OpenAI's retrieve); any id after the prefix. */
const MODEL_PREFIX = "/v1/models/";

/** What the routes need beyond the {@linkcode ServerContext}. */
export interface RouteSettings {
  /** Builds the mock engine of `POST /batch/test`; undefined: that endpoint answers 501. */
  readonly batchTest: BatchTestFactory | undefined;
  /** When the handler was created, Unix seconds (`created` of `/v1/models`). */
  readonly startedAt: number;
}

/**
 * Answers `req` (whose URL path is `path`) with its endpoint.
 *
 * @throws {ApiError} 404 for an unknown path, 405 for a method the path does not accept, 415 for
 *   a POST body that is not JSON, and whatever the endpoint throws.
 */
export async function route(
  ctx: ServerContext,
  settings: RouteSettings,
  req: Request,
  path: string,
): Promise<Response> {
  const methods = ROUTES[path] ?? (path.startsWith(MODEL_PREFIX) ? ["GET"] : undefined);
  if (methods === undefined) {
    throw new ApiError(404, `Not found: ${req.method} ${path}`, { code: "not_found" });
  }
  if (!methods.includes(req.method)) {
    throw new ApiError(405, `Method ${req.method} is not allowed on ${path}`, {
      code: "method_not_allowed",
      headers: { allow: methods.join(", ") },
    });
  }
  // `POST /ping` (SageMaker's health check) has no body.
  if (req.method === "POST" && path !== "/ping") checkJsonContentType(req);
  switch (path) {
    case "/v1/completions":
      return await generateEndpoint(ctx, req, "completion");
    case "/v1/chat/completions":
      return await generateEndpoint(ctx, req, "chat");
    case "/v1/responses":
      return await responsesEndpoint(ctx, req);
    case "/v1/models":
      return modelsEndpoint(ctx, settings.startedAt);
    case "/health":
    case "/ping":
      return new Response(null, { status: ctx.lifecycle.healthy(ctx.engine) ? 200 : 503 });
    case "/version":
      return Response.json({ version: VERSION });
    case "/metrics":
      return metricsEndpoint(ctx);
    case "/tokenize":
      return await tokenizeEndpoint(ctx, req);
    case "/detokenize":
      return await detokenizeEndpoint(ctx, req);
    case "/batch/test":
      return await batchTestEndpoint(ctx, settings.batchTest, req);
    case "/invocations":
      return await generateEndpoint(ctx, req, await invocationKind(ctx, req));
    default:
      return modelEndpoint(ctx, settings.startedAt, path.slice(MODEL_PREFIX.length));
  }
}

/**
 * SageMaker's `POST /invocations`, as vLLM serves it: a body with `messages` is a chat
 * completion, one with `prompt` a completion; anything else is a 400 naming `messages`. The
 * body is read from a copy (within the same size and time limits) and the endpoint reads it
 * again.
 */
async function invocationKind(ctx: ServerContext, req: Request): Promise<"chat" | "completion"> {
  const body = await readJson(req.clone(), ctx.maxBody, ctx.readTimeoutMs);
  if (typeof body === "object" && body !== null && !Array.isArray(body)) {
    if ("messages" in body) return "chat";
    if ("prompt" in body) return "completion";
  }
  throw new ApiError(
    400,
    "POST /invocations takes a chat request (messages) or a completion request (prompt)",
    { param: "messages", code: "missing_required_parameter" },
  );
}

/** `GET /v1/models`: the served names, with `max_model_len` (and `vocab_size` when known). */
function modelsEndpoint(ctx: ServerContext, startedAt: number): Response {
  return Response.json({
    object: "list",
    data: ctx.names.map((id) => modelCard(ctx, id, startedAt)),
  });
}

/** `GET /v1/models/{id}` (`id` URL-encoded, or not): that model's card, 404 if not served. */
function modelEndpoint(ctx: ServerContext, startedAt: number, encoded: string): Response {
  let id: string;
  try {
    id = decodeURIComponent(encoded);
  } catch {
    id = encoded;
  }
  return Response.json(modelCard(ctx, checkModel(ctx, id), startedAt));
}

/** One entry of `/v1/models`. */
function modelCard(ctx: ServerContext, id: string, startedAt: number): Record<string, unknown> {
  const { engine } = ctx;
  return {
    id,
    object: "model",
    created: startedAt,
    owned_by: "webgpu-llm",
    root: engine.model.name,
    parent: null,
    max_model_len: engine.model.maxModelLen,
    // An extension (like max_model_len): benchmarks draw prompt ids below it.
    ...(engine.model.vocabSize > 0 ? { vocab_size: engine.model.vocabSize } : {}),
    permission: [],
  };
}

/** `GET /metrics`: the metric set with the engine's stats (without them if `stats()` throws). */
function metricsEndpoint(ctx: ServerContext): Response {
  let text: string;
  try {
    text = ctx.metrics.render(ctx.engine.stats(), ctx.engine.model.cache);
  } catch {
    text = ctx.metrics.registry.format();
  }
  return new Response(text, { headers: { "content-type": PROMETHEUS_CONTENT_TYPE } });
}
