/**
 * The server's TCP front: it owns the public socket and bounds what `Deno.serve` does not, the
 * time a client may take to send a request head and to stay idle between requests (slowloris).
 * `Deno.serve` (hyper, with no timer set) hands the handler a request only once its head is in,
 * and keeps a connection whose head never completes open for good (measured 2026-11-25 with
 * Deno 2.9.6: half a head, still open 75 s later; denoland/deno#3515).
 *
 * Each accepted connection is paired with one connection to the real server, which listens on a
 * Unix socket in a private temporary directory, and bytes are copied both ways unchanged (no
 * buffering of bodies, `TCP_NODELAY` set, backpressure kept by awaiting each write).
 * {@linkcode Http1Framer}s watch both directions and arm one timer per connection:
 *
 * - **Header deadline** (`headerTimeoutMs`, the server's `--request-read-timeout-s`): from the
 *   accept for a connection's first request and from the first byte of each later head, the head
 *   must be complete in time. Otherwise the client gets `408` (OpenAI-style JSON, `Connection:
 *   close`) when no response is in progress, and the connection is closed.
 * - **Keep-alive deadline** (`keepAliveTimeoutMs`): when every request sent has been answered and
 *   no new head has started, the connection is closed after this much idle time (uvicorn's
 *   `--timeout-keep-alive`, under vLLM, defaults to 5 s).
 * - Nothing bounds a request while its response is outstanding: a long generation is bounded by
 *   `--request-timeout-s`, a slow body by the handler's read timeout.
 *
 * A head over `maxHeadBytes` gets `431`, a malformed one `400`, both as JSON, and the connection
 * is closed. After a `101 Switching Protocols` bytes are copied without parsing. If the server's
 * own output cannot be framed (a bug), its direction is copied unparsed and no deadline applies
 * to that connection any more.
 *
 * @module
 */

import {
  type FramerEvents,
  Http1Framer,
  HttpFramingError,
  type MessageHead,
  methodOf,
  requestBodyFraming,
  responseBodyFraming,
  statusOf,
} from "./http1_framer.ts";
import { acceptEach, closeQuietly } from "./accept_loop.ts";

/** Options of {@linkcode ConnectionGuard}. */
export interface ConnectionGuardOptions {
  /** Time a request head may take, ms (from the accept, or from its first byte); > 0. */
  readonly headerTimeoutMs: number;
  /** Idle time allowed between answered requests on one connection, ms; > 0. */
  readonly keepAliveTimeoutMs: number;
  /** Largest request head, bytes (default 64 KiB). */
  readonly maxHeadBytes?: number;
  /** Called once for each accepted connection, when the guard has closed it. */
  readonly onClosed?: (client: Deno.Conn) => void;
}

/** Counts of what the guard cut, for tests and logs. */
export interface ConnectionGuardStats {
  /** Connections open now. */
  open: number;
  /** Connections closed because a request head was late. */
  headerTimeouts: number;
  /** Connections closed after the keep-alive idle time. */
  idleTimeouts: number;
  /** Connections closed for a malformed or oversized request head. */
  rejected: number;
}

const STATUS_TEXT: Record<number, string> = {
  400: "Bad Request",
  408: "Request Timeout",
  431: "Request Header Fields Too Large",
};

/** A raw HTTP/1.1 error response with an OpenAI-style JSON body, closing the connection. */
export function rawErrorResponse(status: number, message: string, code: string): Uint8Array {
  const body = JSON.stringify({
    error: { message, type: "invalid_request_error", param: null, code },
  });
  const bytes = new TextEncoder().encode(body);
  const head = `HTTP/1.1 ${status} ${STATUS_TEXT[status] ?? "Error"}\r\n` +
    `content-type: application/json\r\ncontent-length: ${bytes.length}\r\n` +
    `connection: close\r\n\r\n`;
  return new Uint8Array([...new TextEncoder().encode(head), ...bytes]);
}

/** Time a refused connection's error answer may take to be written before the cut, ms. */
const FAIL_WRITE_MS = 1000;

async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let offset = 0;
  while (offset < bytes.length) offset += await conn.write(bytes.subarray(offset));
}

/** One client connection and its pair to the server; see the module documentation. */
class GuardedConnection {
  readonly #client: Deno.Conn;
  readonly #server: Deno.Conn;
  readonly #options: ConnectionGuardOptions;
  readonly #stats: ConnectionGuardStats;
  readonly #requests: Http1Framer;
  readonly #responses: Http1Framer;
  /** Methods of the requests whose final response has not ended, oldest first. */
  readonly #pending: string[] = [];
  #interim = false;
  #switched = false;
  #unguarded = false;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #closed = false;

  constructor(
    client: Deno.Conn,
    server: Deno.Conn,
    options: ConnectionGuardOptions,
    stats: ConnectionGuardStats,
  ) {
    this.#client = client;
    this.#server = server;
    this.#options = options;
    this.#stats = stats;
    const requestEvents: FramerEvents = {
      headStart: () => this.#arm("header"),
      head: (head) => this.#requestHead(head),
      messageEnd: () => this.#update(),
    };
    const responseEvents: FramerEvents = {
      headStart: () => {},
      head: (head) => this.#responseHead(head),
      messageEnd: () => this.#responseEnd(),
    };
    this.#requests = new Http1Framer(requestEvents, options.maxHeadBytes);
    this.#responses = new Http1Framer(responseEvents);
    this.#arm("header");
  }

  /** Copies both ways until both directions end; resolves when the connection is closed. */
  async run(): Promise<void> {
    await Promise.all([this.#pumpRequests(), this.#pumpResponses()]);
    this.#close();
  }

  #requestHead(head: MessageHead): ReturnType<FramerEvents["head"]> {
    const framing = requestBodyFraming(head);
    this.#pending.push(methodOf(head));
    this.#disarm();
    return framing;
  }

  #responseHead(head: MessageHead): ReturnType<FramerEvents["head"]> {
    const status = statusOf(head);
    this.#switched = status === 101;
    this.#interim = status >= 100 && status < 200 && status !== 101;
    return responseBodyFraming(head, this.#pending[0] ?? "GET");
  }

  #responseEnd(): void {
    if (this.#switched) {
      this.#requests.passThrough();
      this.#responses.passThrough();
      this.#unguarded = true;
      this.#disarm();
      return;
    }
    if (!this.#interim) this.#pending.shift();
    this.#update();
  }

  /** Arms the keep-alive timer when everything sent is answered and no head is under way. */
  #update(): void {
    if (this.#requests.inHead) return;
    if (this.#pending.length === 0 && this.#responses.idle) this.#arm("idle");
  }

  #arm(kind: "header" | "idle"): void {
    this.#disarm();
    if (this.#unguarded || this.#closed) return;
    const ms = kind === "header" ? this.#options.headerTimeoutMs : this.#options.keepAliveTimeoutMs;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      if (kind === "idle") {
        this.#stats.idleTimeouts++;
        this.#close();
      } else {
        this.#stats.headerTimeouts++;
        const answerable = this.#pending.length === 0 && this.#responses.idle;
        const message = `The request headers did not arrive within ${ms / 1000} s`;
        this.#fail(answerable ? rawErrorResponse(408, message, "request_timeout") : null);
      }
    }, ms);
  }

  #disarm(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  /**
   * Sends `response` (if any) to the client, then closes both connections: after at most
   * {@linkcode FAIL_WRITE_MS} of trying (a client that takes nothing, e.g. one that connected to
   * the HTTPS port and never began its TLS handshake, on which a write waits forever).
   */
  #fail(response: Uint8Array | null): void {
    this.#disarm();
    if (response === null) return this.#close();
    const cut = setTimeout(() => this.#close(), FAIL_WRITE_MS);
    writeAll(this.#client, response).catch(() => {}).finally(() => {
      clearTimeout(cut);
      this.#close();
    });
  }

  async #pumpRequests(): Promise<void> {
    const buffer = new Uint8Array(64 * 1024);
    try {
      for (;;) {
        const n = await this.#client.read(buffer);
        if (n === null) break;
        const chunk = buffer.subarray(0, n);
        try {
          this.#requests.push(chunk);
        } catch (e) {
          if (!(e instanceof HttpFramingError)) throw e;
          this.#stats.rejected++;
          const answerable = this.#pending.length === 0 && this.#responses.idle;
          const code = e.status === 431 ? "header_too_large" : "bad_request";
          this.#fail(answerable ? rawErrorResponse(e.status, e.message, code) : null);
          return;
        }
        await writeAll(this.#server, chunk);
      }
      await this.#server.closeWrite();
    } catch {
      this.#close();
    }
  }

  async #pumpResponses(): Promise<void> {
    const buffer = new Uint8Array(64 * 1024);
    try {
      for (;;) {
        const n = await this.#server.read(buffer);
        if (n === null) break;
        const chunk = buffer.subarray(0, n);
        if (!this.#unguarded) {
          try {
            this.#responses.push(chunk);
          } catch (e) {
            if (!(e instanceof HttpFramingError)) throw e;
            this.#unguarded = true;
            this.#disarm();
          }
        }
        await writeAll(this.#client, chunk);
      }
    } catch {
      // Either side went away: close both below.
    }
    this.#close();
  }

  #close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#disarm();
    this.#stats.open--;
    closeQuietly(this.#client);
    closeQuietly(this.#server);
    this.#options.onClosed?.(this.#client);
  }

  /** Closes both connections now. */
  close(): void {
    this.#close();
  }
}

/**
 * Accepts TCP connections on `listener` and pairs each with a connection opened by
 * `connectServer`, under the deadlines of {@linkcode ConnectionGuardOptions}.
 */
export class ConnectionGuard {
  readonly #listener: Deno.Listener;
  readonly #connections = new Set<GuardedConnection>();
  /** What the guard has done so far. */
  readonly stats: ConnectionGuardStats = {
    open: 0,
    headerTimeouts: 0,
    idleTimeouts: 0,
    rejected: 0,
  };
  /** Resolves when the listener has closed and every connection has ended. */
  readonly finished: Promise<void>;

  constructor(
    listener: Deno.Listener,
    connectServer: () => Promise<Deno.Conn>,
    options: ConnectionGuardOptions,
  ) {
    if (!(options.headerTimeoutMs > 0) || !(options.keepAliveTimeoutMs > 0)) {
      throw new RangeError(
        `Cannot guard connections: timeouts must be > 0 ms, got header ${options.headerTimeoutMs} ` +
          `and keep-alive ${options.keepAliveTimeoutMs}`,
      );
    }
    this.#listener = listener;
    this.finished = acceptEach(listener, (client) => this.#serve(client, connectServer, options));
  }

  /** The address clients connect to. */
  get addr(): Deno.NetAddr {
    return this.#listener.addr as Deno.NetAddr;
  }

  async #serve(
    client: Deno.Conn,
    connectServer: () => Promise<Deno.Conn>,
    options: ConnectionGuardOptions,
  ): Promise<void> {
    if ("setNoDelay" in client) (client as Deno.TcpConn).setNoDelay(true);
    let server: Deno.Conn;
    try {
      server = await connectServer();
    } catch {
      client.close();
      options.onClosed?.(client);
      return;
    }
    this.stats.open++;
    const connection = new GuardedConnection(client, server, options, this.stats);
    this.#connections.add(connection);
    try {
      await connection.run();
    } finally {
      this.#connections.delete(connection);
    }
  }

  /** Stops accepting connections (open ones go on until they end or {@linkcode closeAll}). */
  stopAccepting(): void {
    closeQuietly(this.#listener);
  }

  /** Stops accepting and closes every open connection. */
  closeAll(): void {
    this.stopAccepting();
    for (const connection of this.#connections) connection.close();
  }
}
