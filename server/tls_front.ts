/**
 * The public socket of an HTTPS server (`--ssl-certfile`, `--ssl-keyfile`): plain TCP, each
 * connection relayed byte for byte to a `Deno.listenTls` listener on a loopback port, whose TLS
 * connections the connection guard serves (server/listener.ts).
 *
 * Why not `Deno.listenTls` on the public address: Deno runs a server-side TLS handshake in a task
 * of its own, which holds the TCP socket until the handshake ends, and closing the TLS connection
 * does not end that task (measured 2026-11-30 with Deno 2.9.6: a client that connected and sent
 * nothing was still connected 30 s after the guard's 300 ms header deadline had closed its TLS
 * connection). So a deadline could not free a connection stuck in its handshake. Here the guard's
 * close of a TLS connection reaches {@linkcode TlsFront.release} (matched by the relay's loopback
 * port, the TLS connection's remote port), which ends the relay's loopback write side: the
 * handshake task reads end-of-file and ends, the loopback connection closes, and the relay closes
 * the client's socket once what the server wrote before its close has been copied out (at the
 * latest {@linkcode RELEASE_MS} after the release).
 *
 * @module
 */

import { acceptEach, closeQuietly } from "./accept_loop.ts";

/** Time a released relay may take to copy out the server's last bytes before it is cut, ms. */
export const RELEASE_MS = 1000;

/** One client connection relayed to the loopback TLS listener. */
class Relay {
  readonly #client: Deno.TcpConn;
  readonly #inner: Deno.TcpConn;
  readonly #onClosed: () => void;
  #released = false;
  #closed = false;
  #timer: ReturnType<typeof setTimeout> | undefined;

  constructor(client: Deno.TcpConn, inner: Deno.TcpConn, onClosed: () => void) {
    this.#client = client;
    this.#inner = inner;
    this.#onClosed = onClosed;
  }

  /** Copies both ways; resolves once both sockets are closed. */
  async run(): Promise<void> {
    await Promise.all([this.#toInner(), this.#toClient()]);
    this.close();
  }

  async #toInner(): Promise<void> {
    try {
      await copy(this.#client, this.#inner);
      if (!this.#released) await this.#inner.closeWrite();
    } catch {
      // The loopback side was released (its write side ended) or one side went away.
      if (!this.#released) this.close();
    }
  }

  async #toClient(): Promise<void> {
    try {
      await copy(this.#inner, this.#client);
    } catch {
      // Either side went away.
    }
    this.close();
  }

  /**
   * The guard closed the TLS side: end the loopback write side (a handshake under way then
   * fails), let what the server wrote reach the client, and cut after {@linkcode RELEASE_MS}.
   */
  release(): void {
    if (this.#released || this.#closed) return;
    this.#released = true;
    this.#inner.closeWrite().catch(() => {});
    this.#timer = setTimeout(() => this.close(), RELEASE_MS);
  }

  /** Closes both sockets now. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#timer);
    closeQuietly(this.#client);
    closeQuietly(this.#inner);
    this.#onClosed();
  }
}

/** Copies `from` to `to` until `from` ends, awaiting each write (backpressure). */
async function copy(from: Deno.Conn, to: Deno.Conn): Promise<void> {
  const buffer = new Uint8Array(64 * 1024);
  for (;;) {
    const n = await from.read(buffer);
    if (n === null) return;
    let offset = 0;
    while (offset < n) offset += await to.write(buffer.subarray(offset, n));
  }
}

/** Accepts TCP connections on `listener` and relays each to the loopback TLS listener. */
export class TlsFront {
  readonly #listener: Deno.TcpListener;
  /** Relays by the local port of their loopback connection. */
  readonly #relays = new Map<number, Relay>();
  /** Resolves when the listener has closed and every relay has ended. */
  readonly finished: Promise<void>;

  /** @param connectInner opens a connection to the loopback TLS listener. */
  constructor(listener: Deno.TcpListener, connectInner: () => Promise<Deno.TcpConn>) {
    this.#listener = listener;
    this.finished = acceptEach(listener, (client) => this.#relay(client, connectInner));
  }

  /** The address clients connect to. */
  get addr(): Deno.NetAddr {
    return this.#listener.addr;
  }

  /** Relays open now. */
  get open(): number {
    return this.#relays.size;
  }

  async #relay(client: Deno.TcpConn, connectInner: () => Promise<Deno.TcpConn>): Promise<void> {
    client.setNoDelay(true);
    let inner: Deno.TcpConn;
    try {
      inner = await connectInner();
    } catch {
      client.close();
      return;
    }
    inner.setNoDelay(true);
    const port = inner.localAddr.port;
    const relay = new Relay(client, inner, () => this.#relays.delete(port));
    this.#relays.set(port, relay);
    await relay.run();
  }

  /**
   * The TLS connection whose remote port is `innerPort` was closed by the guard: releases its
   * relay (see the module documentation). Unknown ports are ignored (the relay already ended).
   */
  release(innerPort: number): void {
    this.#relays.get(innerPort)?.release();
  }

  /** Stops accepting connections (open ones go on until they end or {@linkcode closeAll}). */
  stopAccepting(): void {
    closeQuietly(this.#listener);
  }

  /** Stops accepting and closes every relay. */
  closeAll(): void {
    this.stopAccepting();
    for (const relay of this.#relays.values()) relay.close();
  }
}
