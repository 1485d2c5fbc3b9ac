/**
 * Mapping of thrown errors to the HTTP server's {@linkcode ApiError} responses: engine
 * overload (429 with `Retry-After`), a dead engine (503), invalid input raised by the engine or
 * the chat template (400), and anything unexpected (500, reported to `onError`).
 *
 * @module
 */

import { EngineDeadError, EngineOverloadedError } from "../engine/engine_api.ts";
import { ChatTemplateError } from "../engine/chat_template.ts";
import { InvalidParameterError } from "../engine/input_processor.ts";
import { ApiError } from "./protocol.ts";

/**
 * The {@linkcode ApiError} for an error thrown by the engine (or by request preparation), or
 * null when `e` is unexpected (an internal error).
 *
 * @param e The thrown value.
 * @param retryAfter `Retry-After` seconds sent with a 429.
 */
export function toApiError(e: unknown, retryAfter: number): ApiError | null {
  if (e instanceof ApiError) return e;
  if (e instanceof EngineOverloadedError) {
    return new ApiError(429, `The model is overloaded: ${e.message}`, {
      code: "model_overloaded",
      headers: { "retry-after": String(retryAfter) },
    });
  }
  if (e instanceof EngineDeadError) {
    return new ApiError(503, `The engine is not available: ${e.message}`, { code: "engine_dead" });
  }
  if (e instanceof ChatTemplateError) {
    return new ApiError(400, e.message, { code: "invalid_value" });
  }
  if (e instanceof InvalidParameterError) {
    return new ApiError(400, e.message, { param: e.param, code: "invalid_value" });
  }
  if (e instanceof RangeError || e instanceof TypeError) {
    return new ApiError(400, e.message, { code: "invalid_value" });
  }
  return null;
}

/**
 * The 500 {@linkcode ApiError} for an unexpected error; `e` (with its stack) goes to `onError`,
 * only its name and message to the client.
 */
export function internalError(e: unknown, onError: (error: unknown) => void): ApiError {
  onError(e);
  const what = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  return new ApiError(500, `Internal server error (${what})`, { code: "internal_error" });
}
