/**
 * The HTTP server's lifecycle state: readiness (`/health`, 503 while loading), the set of
 * in-flight responses (each with an abort controller tied to its client's connection), and the
 * graceful drain used at shutdown.
 *
 * @module
 */

import type { EngineClient } from "../engine/engine_api.ts";
import { ApiError } from "./protocol.ts";

/** A tracked in-flight response: abort `ac` to stop it, call `done` once it has finished. */
export interface Tracked {
  /** Aborted on client disconnect or at the end of a drain. */
  ac: AbortController;
  /** Releases the response from the in-flight set (idempotent). */
  done: () => void;
}

/** The abort reason of a response that ran past the request timeout. */
export class RequestTimeoutError extends Error {
  override name = "RequestTimeoutError";
}

/** Readiness, draining and the in-flight responses of one server. */
export class Lifecycle {
  #ready: boolean;
  readonly #timeoutMs: number;
  #draining = false;
  /** Abort controllers of unfinished responses. */
  readonly #inFlight = new Set<AbortController>();
  #idle: (() => void) | null = null;

  /**
   * @param ready Initial readiness (false while the model loads).
   * @param requestTimeoutMs A tracked response is aborted this long after it started (0: never).
   */
  constructor(ready: boolean, requestTimeoutMs = 0) {
    this.#ready = ready;
    this.#timeoutMs = requestTimeoutMs;
  }

  /** Marks the server ready or not. */
  setReady(ready: boolean): void {
    this.#ready = ready;
  }

  /** Whether {@linkcode drain} was called: new inference requests get 503. */
  get draining(): boolean {
    return this.#draining;
  }

  /** Responses whose body is not finished yet. */
  get inFlight(): number {
    return this.#inFlight.size;
  }

  /** Whether `/health` says 200: ready, not draining and the engine has no error. */
  healthy(engine: EngineClient): boolean {
    return this.#ready && !this.#draining && engine.error === null;
  }

  /** Throws the 503 for a server that is draining, still loading, or whose engine stopped. */
  checkAvailable(engine: EngineClient): void {
    if (this.#draining) {
      throw new ApiError(503, "The server is shutting down", { code: "server_shutting_down" });
    }
    if (!this.#ready) {
      throw new ApiError(503, "The model is still loading", { code: "model_not_ready" });
    }
    if (engine.error !== null) {
      throw new ApiError(503, `The engine stopped after an error: ${engine.error.message}`, {
        code: "engine_dead",
      });
    }
  }

  /**
   * The error for a response whose engine requests were aborted before they finished: 504
   * `request_timeout` when `ac` ran past the request timeout, else 503.
   */
  aborted(ac?: AbortController): ApiError {
    if (ac?.signal.reason instanceof RequestTimeoutError) {
      return new ApiError(504, ac.signal.reason.message, { code: "request_timeout" });
    }
    return new ApiError(
      503,
      this.#draining
        ? "The request was aborted: the server is shutting down"
        : "The request was aborted before it finished",
      { code: "request_aborted" },
    );
  }

  /**
   * Tracks a response as in flight; the request's signal aborts it on disconnect, and the
   * request timeout (when set) aborts it with a {@linkcode RequestTimeoutError}.
   */
  track(req: Request): Tracked {
    const ac = new AbortController();
    this.#inFlight.add(ac);
    const onAbort = () => ac.abort();
    req.signal.addEventListener("abort", onAbort, { once: true });
    const ms = this.#timeoutMs;
    const timer = ms > 0
      ? setTimeout(
        () => ac.abort(new RequestTimeoutError(`The request did not finish within ${ms / 1000} s`)),
        ms,
      )
      : undefined;
    let released = false;
    return {
      ac,
      done: () => {
        if (released) return;
        released = true;
        clearTimeout(timer);
        req.signal.removeEventListener("abort", onAbort);
        this.#release(ac);
      },
    };
  }

  #release(ac: AbortController): void {
    this.#inFlight.delete(ac);
    if (this.#inFlight.size === 0 && this.#idle !== null) this.#idle();
  }

  /**
   * Stops accepting inference requests (503), waits up to `graceMs` for in-flight ones to finish,
   * then aborts the rest and waits for their responses to close.
   */
  async drain(graceMs: number): Promise<void> {
    this.#draining = true;
    if (this.#inFlight.size > 0) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      await new Promise<void>((resolve) => {
        this.#idle = resolve;
        timer = setTimeout(resolve, Math.max(0, graceMs));
      });
      clearTimeout(timer);
    }
    if (this.#inFlight.size > 0) {
      await new Promise<void>((resolve) => {
        this.#idle = resolve;
        for (const ac of this.#inFlight) ac.abort();
      });
    }
    this.#idle = null;
  }
}
