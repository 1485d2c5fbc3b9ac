/**
 * The flags of `main.ts serve` that belong to the HTTP server (the engine's are in
 * cli/engine_flags.ts): where to listen, shutdown and fatal-error behaviour, and what makes the
 * server safe to expose (API key, CORS origins, allowed hosts, timeouts, TLS). Parsed once into a
 * readonly {@linkcode ServeSettings}.
 *
 * @module
 */

import { REASONING_PARSERS, type ReasoningParserName } from "../server/reasoning.ts";
import type { ServerTls, StartServerOptions } from "../server/server.ts";

/** Environment variable holding the API key when `--api-key` is absent (as vLLM's `VLLM_API_KEY`). */
export const API_KEY_ENV = "WEBGPU_LLM_API_KEY";

/** `parseArgs` options of the server flags. */
export const SERVE_FLAGS = {
  host: { type: "string", default: "127.0.0.1" },
  port: { type: "string", default: "8000" },
  "max-body-bytes": { type: "string" },
  "shutdown-timeout": { type: "string", default: "10" },
  "keep-alive-on-fatal": { type: "boolean", default: false },
  "api-key": { type: "string" },
  "allowed-origins": { type: "string" },
  "allowed-hosts": { type: "string" },
  "request-read-timeout-s": { type: "string", default: "30" },
  "request-timeout-s": { type: "string", default: "0" },
  "keep-alive-timeout-s": { type: "string", default: "5" },
  "reasoning-parser": { type: "string" },
  "return-tokens-as-token-ids": { type: "boolean", default: false },
  "ssl-certfile": { type: "string" },
  "ssl-keyfile": { type: "string" },
} as const;

/** Usage lines of the server flags. */
export const SERVE_FLAGS_USAGE = `server flags:
  --host ADDR                    interface to listen on (default 127.0.0.1: this machine only)
  --port N                       port, 0 for any free one (default 8000)
  --max-body-bytes N             largest request body (default 1 MiB; 413 beyond)
  --shutdown-timeout S           on SIGINT / SIGTERM, time in-flight requests get (default 10)
  --keep-alive-on-fatal          after a fatal engine error (device lost, broken invariant), keep
                                 answering 503 instead of exiting with status 1 (the default, so
                                 that a supervisor such as systemd or Docker restarts the server)
  --api-key KEY                  require 'Authorization: Bearer KEY' on /v1/*, /tokenize,
                                 /detokenize and /batch/test (default: $${API_KEY_ENV}, as
                                 vLLM's VLLM_API_KEY; /health and /metrics stay open)
  --allowed-origins LIST         CORS: comma-separated origins (or vLLM's JSON list), or '*'
                                 (default: CORS off; vLLM's default is '*')
  --allowed-hosts LIST           accepted Host names, or '*' (default: loopback names when bound
                                 to a loopback address, any otherwise)
  --request-read-timeout-s S     time a request's headers, then its body, may take to arrive
                                 (default 30; 408 after; 0: no bound, Deno.serve alone)
  --keep-alive-timeout-s S       an idle keep-alive connection is closed after this (default 5)
  --reasoning-parser qwen3       return a chat answer's <think> block as reasoning_content
                                 (message and stream deltas), as vLLM does (default: off)
  --request-timeout-s S          time a generation request may take in all (default 0: none;
                                 then 504, or an SSE error event, and its KV blocks are freed)
  --return-tokens-as-token-ids   logprobs name tokens 'token_id:<id>' unless a request sets
                                 return_tokens_as_token_ids false (vLLM's flag)
  --ssl-certfile FILE, --ssl-keyfile FILE   serve HTTPS with this PEM certificate chain and
                                 private key (both, as vLLM's; default plain HTTP)`;

/** The server settings of one `serve` run. */
export interface ServeSettings {
  readonly port: number;
  /** Seconds in-flight requests get at shutdown. */
  readonly graceS: number;
  readonly keepAliveOnFatal: boolean;
  /** Options for `startServer` (host, limits, security). */
  readonly server: Readonly<StartServerOptions>;
}

type Values = { [K in keyof typeof SERVE_FLAGS]?: string | boolean };

function seconds(flag: string, text: string): number {
  const v = Number(text);
  if (text.trim() === "" || !Number.isFinite(v) || v < 0) {
    throw new TypeError(`--${flag} expects seconds >= 0, got "${text}"`);
  }
  return v;
}

function reasoningParserOf(text: string | undefined): ReasoningParserName | null {
  if (text === undefined) return null;
  const name = REASONING_PARSERS.find((p) => p === text);
  if (name === undefined) {
    throw new TypeError(
      `--reasoning-parser expects one of ${REASONING_PARSERS.join(", ")}, got "${text}"`,
    );
  }
  return name;
}

/** The PEM files of `--ssl-certfile` and `--ssl-keyfile` (both or neither), read now. */
function tlsOf(certFile: string | undefined, keyFile: string | undefined): ServerTls | null {
  if (certFile === undefined && keyFile === undefined) return null;
  if (certFile === undefined || keyFile === undefined) {
    throw new TypeError(
      `--ssl-certfile and --ssl-keyfile go together: ${
        certFile === undefined ? "--ssl-keyfile" : "--ssl-certfile"
      } was given alone`,
    );
  }
  const read = (flag: string, path: string) => {
    try {
      return Deno.readTextFileSync(path);
    } catch (e) {
      const why = e instanceof Deno.errors.NotFound ? "no such file" : String(e);
      throw new TypeError(`--${flag}: cannot read ${path} (${why})`);
    }
  };
  return { cert: read("ssl-certfile", certFile), key: read("ssl-keyfile", keyFile) };
}

/**
 * A comma-separated list, or a JSON list of strings as vLLM's `--allowed-origins` takes it
 * (`'["https://a.example"]'`); `*` among the items allows any.
 */
function list(flag: string, text: string | undefined): readonly string[] | "*" | null {
  if (text === undefined) return null;
  let raw: unknown = text.split(",");
  if (text.trim().startsWith("[")) {
    try {
      raw = JSON.parse(text);
    } catch {
      raw = null;
    }
    if (!Array.isArray(raw) || !raw.every((x) => typeof x === "string")) {
      throw new TypeError(`--${flag} expects a comma-separated list, or a JSON list of strings`);
    }
  }
  const items = (raw as string[]).map((s) => s.trim()).filter((s) => s !== "");
  if (items.length === 0) throw new TypeError(`--${flag} expects a comma-separated list or '*'`);
  return items.includes("*") ? "*" : items;
}

/**
 * Reads the server flags (`env` supplies {@linkcode API_KEY_ENV} when `--api-key` is absent).
 *
 * @throws {TypeError} naming the flag on a bad value.
 */
export function serveSettingsFromFlags(
  values: Values,
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): ServeSettings {
  const str = (k: keyof typeof SERVE_FLAGS) => {
    const v = values[k];
    return typeof v === "string" ? v : undefined;
  };
  const portText = str("port") ?? "8000";
  const port = Number(portText);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new TypeError(`--port expects a port number, got "${portText}"`);
  }
  const graceS = seconds("shutdown-timeout", str("shutdown-timeout") ?? "10");
  const maxBodyText = str("max-body-bytes");
  const maxBody = maxBodyText === undefined ? undefined : Number(maxBodyText);
  if (maxBody !== undefined && !(Number.isInteger(maxBody) && maxBody > 0)) {
    throw new TypeError(`--max-body-bytes expects a positive integer`);
  }
  const apiKey = str("api-key") ?? env(API_KEY_ENV) ?? null;
  if (apiKey !== null && apiKey.trim() === "") {
    throw new TypeError(`--api-key (or ${API_KEY_ENV}) must not be empty`);
  }
  const keepAliveS = seconds("keep-alive-timeout-s", str("keep-alive-timeout-s") ?? "5");
  if (keepAliveS === 0) throw new TypeError(`--keep-alive-timeout-s expects seconds > 0, got 0`);
  return {
    port,
    graceS,
    keepAliveOnFatal: values["keep-alive-on-fatal"] === true,
    server: {
      host: str("host") ?? "127.0.0.1",
      port,
      ...(maxBody !== undefined ? { maxBodyBytes: maxBody } : {}),
      apiKey,
      allowedOrigins: list("allowed-origins", str("allowed-origins")),
      allowedHosts: list("allowed-hosts", str("allowed-hosts")),
      requestReadTimeoutMs: 1000 * seconds(
        "request-read-timeout-s",
        str("request-read-timeout-s") ?? "30",
      ),
      requestTimeoutMs: 1000 * seconds("request-timeout-s", str("request-timeout-s") ?? "0"),
      keepAliveTimeoutMs: 1000 * keepAliveS,
      reasoningParser: reasoningParserOf(str("reasoning-parser")),
      tls: tlsOf(str("ssl-certfile"), str("ssl-keyfile")),
      returnTokensAsTokenIds: values["return-tokens-as-token-ids"] === true,
    },
  };
}
