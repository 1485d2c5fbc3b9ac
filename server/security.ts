/**
 * What makes the server safe to expose: the API key, the `Host` check against DNS rebinding,
 * CORS, and the JSON content-type rule. {@linkcode RequestGuard} applies them to every request
 * before it is routed, in this order:
 *
 * 1. `Host`: when the server is bound to a loopback address (127.0.0.0/8, ::1, localhost) only
 *    loopback host names are accepted (`localhost`, `127.x.y.z`, `[::1]`), so a web page whose
 *    DNS name was rebound to 127.0.0.1 cannot drive the server (Ollama's CVE-2024-28224);
 *    `allowedHosts` widens the list (`*` turns the check off) and applies whatever the bind
 *    address. Bound to another address with no list, there is no check: the operator chose to
 *    expose the server, and the API key protects it. Failure: 403 `host_not_allowed`.
 * 2. CORS preflight (`OPTIONS` with `Access-Control-Request-Method`): answered 204 with the CORS
 *    headers for an allowed origin, 403 `origin_not_allowed` otherwise. CORS is off by default
 *    (no CORS headers; `OPTIONS` gets the router's 405), so browsers keep other origins out.
 * 3. API key: `/v1/*`, `/tokenize`, `/detokenize`, `/batch/test` and `/invocations` need
 *    `Authorization: Bearer KEY` (compared in constant time); `/health`, `/ping`, `/version`
 *    and `/metrics` stay open.
 *    Failure: 401 `invalid_api_key` with `WWW-Authenticate: Bearer`.
 * 4. A POST body must be `application/json` (parameters such as `charset` allowed): a browser
 *    cannot send that cross-origin without a CORS preflight. Failure: 415
 *    `unsupported_media_type` ({@linkcode checkJsonContentType}; the router applies it once the
 *    path and method are known to take a body).
 *
 * Responses to an allowed origin carry `Access-Control-Allow-Origin` and `Vary: Origin`
 * ({@linkcode RequestGuard.decorate}), errors and streams included.
 *
 * @module
 */

import { ApiError } from "./protocol.ts";

/** Options of {@linkcode RequestGuard}. */
export interface SecurityOptions {
  /** Required bearer token of the protected endpoints; null or undefined: none. */
  readonly apiKey?: string | null;
  /** Origins allowed by CORS (`*`: any); null or undefined: CORS off. */
  readonly allowedOrigins?: readonly string[] | "*" | null;
  /**
   * Host names accepted in `Host` (`*`: any); null or undefined: loopback names when bound to a
   * loopback address, else any.
   */
  readonly allowedHosts?: readonly string[] | "*" | null;
  /** The address the server listens on (decides the default Host check). Default 127.0.0.1. */
  readonly bindHost?: string;
}

const PROTECTED = /^\/(v1\/|tokenize$|detokenize$|batch\/test$|invocations$)/;
const ALLOW_METHODS = "GET, POST, OPTIONS";
const ALLOW_HEADERS = "authorization, content-type, x-session-id";

/** Whether `host` (a host name or address, IPv6 with or without brackets) is a loopback one. */
export function isLoopbackHost(host: string): boolean {
  const h = host.toLowerCase().replace(/^\[|\]$/g, "");
  return h === "localhost" || h.endsWith(".localhost") || h === "::1" ||
    /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h);
}

/** The host name of a `Host` header value (port and IPv6 brackets removed), lower-cased. */
export function hostName(header: string): string {
  const h = header.trim().toLowerCase();
  if (h.startsWith("[")) return h.slice(1, h.indexOf("]") > 0 ? h.indexOf("]") : undefined);
  const colon = h.lastIndexOf(":");
  return colon >= 0 && h.indexOf(":") === colon ? h.slice(0, colon) : h;
}

/** Compares two strings in time that depends on their lengths only. */
export function constantTimeEqual(a: string, b: string): boolean {
  const x = new TextEncoder().encode(a);
  const y = new TextEncoder().encode(b);
  let diff = x.length ^ y.length;
  const n = Math.max(x.length, y.length);
  for (let i = 0; i < n; i++) diff |= (x[i] ?? 0) ^ (y[i] ?? 0);
  return diff === 0;
}

/** Applies the rules of the module documentation to each request. */
export class RequestGuard {
  readonly #key: string | null;
  readonly #origins: ReadonlySet<string> | "*" | null;
  /** Accepted host names; "*" any; "loopback" loopback names only. */
  readonly #hosts: ReadonlySet<string> | "*" | "loopback";

  constructor(options: SecurityOptions = {}) {
    const key = options.apiKey ?? null;
    if (key !== null && key.length === 0) throw new RangeError("The API key must not be empty");
    this.#key = key;
    const o = options.allowedOrigins ?? null;
    this.#origins = o === null || o === "*" ? o : new Set(o.map((s) => s.replace(/\/+$/, "")));
    const h = options.allowedHosts ?? null;
    this.#hosts = h === "*"
      ? "*"
      : h !== null
      ? new Set(h.map((s) => s.toLowerCase()))
      : isLoopbackHost(options.bindHost ?? "127.0.0.1")
      ? "loopback"
      : "*";
  }

  /** Whether the protected endpoints need an API key. */
  get requiresKey(): boolean {
    return this.#key !== null;
  }

  /**
   * Checks `req` (rules 1 to 3). Returns the preflight response for a CORS preflight, null when
   * the request may be routed.
   *
   * @throws {ApiError} 401 or 403 as the module documentation says.
   */
  check(req: Request, path: string): Response | null {
    this.#checkHost(req);
    const origin = req.headers.get("origin");
    if (req.method === "OPTIONS" && req.headers.has("access-control-request-method")) {
      if (this.#origins === null) return null; // CORS off: the router answers 405
      if (origin === null || !this.#originAllowed(origin)) {
        throw new ApiError(403, `Origin ${JSON.stringify(origin)} is not allowed`, {
          code: "origin_not_allowed",
        });
      }
      return new Response(null, {
        status: 204,
        headers: {
          ...this.#corsHeaders(origin),
          "access-control-allow-methods": ALLOW_METHODS,
          "access-control-allow-headers": ALLOW_HEADERS,
          "access-control-max-age": "600",
        },
      });
    }
    if (this.#key !== null && PROTECTED.test(path)) this.#checkKey(req);
    return null;
  }

  /** `res` with the CORS headers when `req` comes from an allowed origin (else unchanged). */
  decorate(req: Request, res: Response): Response {
    const origin = req.headers.get("origin");
    if (origin === null || this.#origins === null || !this.#originAllowed(origin)) return res;
    try {
      for (const [k, v] of Object.entries(this.#corsHeaders(origin))) res.headers.set(k, v);
      return res;
    } catch {
      // Immutable headers (a response made elsewhere): copy it.
      const headers = new Headers(res.headers);
      for (const [k, v] of Object.entries(this.#corsHeaders(origin))) headers.set(k, v);
      return new Response(res.body, { status: res.status, statusText: res.statusText, headers });
    }
  }

  #checkHost(req: Request): void {
    if (this.#hosts === "*") return;
    const header = req.headers.get("host") ?? new URL(req.url).host;
    const name = hostName(header);
    const ok = this.#hosts === "loopback" ? isLoopbackHost(name) : this.#hosts.has(name);
    if (!ok) {
      throw new ApiError(
        403,
        `Host ${JSON.stringify(header)} is not allowed: ${
          this.#hosts === "loopback"
            ? "the server is bound to a loopback address and accepts loopback host names only"
            : "it is not in --allowed-hosts"
        } (widen with --allowed-hosts)`,
        { code: "host_not_allowed" },
      );
    }
  }

  #checkKey(req: Request): void {
    const auth = req.headers.get("authorization") ?? "";
    const m = /^Bearer\s+(.+)$/i.exec(auth.trim());
    if (m === null || !constantTimeEqual(m[1]!, this.#key!)) {
      throw new ApiError(
        401,
        m === null
          ? "Missing API key: send 'Authorization: Bearer <key>'"
          : "Incorrect API key provided",
        { code: "invalid_api_key", headers: { "www-authenticate": "Bearer" } },
      );
    }
  }

  #originAllowed(origin: string): boolean {
    return this.#origins === "*" ||
      (this.#origins !== null && this.#origins.has(origin.replace(/\/+$/, "")));
  }

  #corsHeaders(origin: string): Record<string, string> {
    return {
      "access-control-allow-origin": this.#origins === "*" ? "*" : origin,
      vary: "origin",
    };
  }
}

/** Throws a 415 unless the request declares a JSON body (`application/json`, any parameters). */
export function checkJsonContentType(req: Request): void {
  const type = (req.headers.get("content-type") ?? "").split(";")[0]!.trim().toLowerCase();
  if (type !== "application/json") {
    throw new ApiError(
      415,
      `Request bodies must be JSON with 'Content-Type: application/json'${
        type === "" ? " (none was sent)" : `, got '${type}'`
      }`,
      { code: "unsupported_media_type" },
    );
  }
}
