/**
 * The state every endpoint of one HTTP server shares ({@linkcode ServerContext}), and the
 * checks they share: the requested model name and the presence of a tokenizer.
 *
 * The engine's model description and tokenizer are read per request, never cached: the engine
 * behind the handler may finish loading after the handler was created.
 *
 * @module
 */

import type { EngineClient } from "../engine/engine_api.ts";
import type { Tokenizer } from "../engine/tokenizer.ts";
import type { Lifecycle } from "./lifecycle.ts";
import type { ServerMetrics } from "./metrics.ts";
import { ApiError } from "./protocol.ts";
import type { ReasoningParserName } from "./reasoning.ts";

/** What the endpoints of one server share. */
export interface ServerContext {
  /** The engine requests are sent to. */
  readonly engine: EngineClient;
  /** `--reasoning-parser`: chat answers are split into reasoning and content; null: off. */
  readonly reasoningParser: ReasoningParserName | null;
  /** Names requests may use in `model`; the first ({@linkcode modelName}) is reported. */
  readonly names: readonly string[];
  /** The reported model name. */
  readonly modelName: string;
  /** Logprobs name tokens `token_id:<id>` unless a request says otherwise (vLLM's flag). */
  readonly tokensAsIds: boolean;
  /** Largest accepted request body in bytes. */
  readonly maxBody: number;
  /** Time a request body may take to arrive, ms (0: no limit). */
  readonly readTimeoutMs: number;
  /** `Retry-After` seconds sent with 429. */
  readonly retryAfter: number;
  /** Receives unexpected errors (answered 500). */
  readonly onError: (error: unknown) => void;
  /** The metric set behind `GET /metrics`. */
  readonly metrics: ServerMetrics;
  /** Readiness, draining and the in-flight responses. */
  readonly lifecycle: Lifecycle;
  /** Receives the server's warnings (one line each). */
  readonly warn: (message: string) => void;
  /** Request field names already reported as ignored ({@linkcode noteIgnoredFields}). */
  readonly ignoredFieldsSeen: Set<string>;
}

/** Ignored field names a server reports (and remembers) at most; clients choose the names. */
export const MAX_REPORTED_IGNORED_FIELDS = 256;

/**
 * Logs the request fields a request ignores (server/protocol.ts `unlistedFields`), each name
 * once per server, as vLLM logs them: the operator learns that a client relies on something this
 * server does not do, without a line per request. The first
 * {@linkcode MAX_REPORTED_IGNORED_FIELDS} names are reported (the line that reaches the limit
 * says so); later ones are neither logged nor kept.
 */
export function noteIgnoredFields(ctx: ServerContext, names: readonly string[]): void {
  const seen = ctx.ignoredFieldsSeen;
  if (seen.size >= MAX_REPORTED_IGNORED_FIELDS) return;
  const fresh = [...new Set(names)].filter((n) => !seen.has(n));
  if (fresh.length === 0) return;
  const reported = fresh.slice(0, MAX_REPORTED_IGNORED_FIELDS - seen.size);
  for (const n of reported) seen.add(n);
  const full = seen.size >= MAX_REPORTED_IGNORED_FIELDS
    ? `; ${MAX_REPORTED_IGNORED_FIELDS} names reported, later ones are not`
    : "";
  ctx.warn(
    `Request fields ignored (not part of this server's API; reported once each): ${
      reported.join(", ")
    }${full}`,
  );
}

/** The model name to report for a request's `model` (404 when it is not served). */
export function checkModel(ctx: ServerContext, model: string | null | undefined): string {
  if (model === null || model === undefined) return ctx.modelName;
  if (!ctx.names.includes(model)) {
    throw new ApiError(404, `The model \`${model}\` does not exist.`, {
      param: "model",
      code: "model_not_found",
    });
  }
  return model;
}

/** The engine's tokenizer; without one, a 400 blaming request parameter `param`. */
export function requireTokenizer(engine: EngineClient, param: string): Tokenizer {
  if (engine.tokenizer === null) {
    throw new ApiError(400, "The served model has no tokenizer: send prompt token ids instead", {
      param,
      code: "invalid_value",
    });
  }
  return engine.tokenizer;
}
