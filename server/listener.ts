/**
 * Where the server listens: `Deno.serve` on a Unix socket in a private temporary directory,
 * behind a {@linkcode ConnectionGuard} on the public TCP address (header and keep-alive
 * deadlines, see server/connection_guard.ts), or `Deno.serve` directly on TCP when the header
 * deadline is off (`headerTimeoutMs` 0). With `tls`, the public address speaks HTTPS: a
 * {@linkcode TlsFront} relays it to a loopback TLS listener whose connections the guard serves
 * (the handshake counts in the header deadline), or, without the guard, `Deno.serve` terminates
 * TLS itself (and, as Deno does, keeps a connection stuck in its handshake open).
 *
 * @module
 */

import { ConnectionGuard, type ConnectionGuardStats } from "./connection_guard.ts";
import { TlsFront } from "./tls_front.ts";

/** Time the guard (then the TLS front) gets to copy out the server's last bytes at shutdown, ms. */
const SHUTDOWN_FLUSH_MS = 2000;

/** Resolves when `done` settles or after `ms`, whichever comes first. */
async function within(done: Promise<unknown>, ms: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  await Promise.race([done, new Promise((r) => timer = setTimeout(r, ms))]);
  clearTimeout(timer);
}

/** Options of {@linkcode listen}. */
export interface ListenOptions {
  /** Interface to listen on. */
  readonly hostname: string;
  /** Port; 0 picks a free one. */
  readonly port: number;
  /** Time a request head may take, ms; 0: no guard (Deno.serve on TCP directly). */
  readonly headerTimeoutMs: number;
  /** Idle time allowed between answered requests on a connection, ms. */
  readonly keepAliveTimeoutMs: number;
  /** PEM certificate chain and private key: serve HTTPS (default: plain HTTP). */
  readonly tls?: ServerTls | null;
}

/** A TLS certificate chain and its private key, PEM-encoded. */
export interface ServerTls {
  readonly cert: string;
  readonly key: string;
}

/** A bound listener serving a handler. */
export interface Listening {
  /** The bound TCP port. */
  readonly port: number;
  /** Resolves once everything has closed. */
  readonly finished: Promise<void>;
  /** What the guard has cut (null without a guard). */
  readonly guardStats: Readonly<ConnectionGuardStats> | null;
  /** Stops accepting, lets open requests end, then closes every connection. */
  shutdown(): Promise<void>;
}

/** Serves `handler` as {@linkcode ListenOptions} say. */
export function listen(
  handler: (req: Request) => Promise<Response>,
  options: ListenOptions,
): Listening {
  const { hostname, port } = options;
  const tls = options.tls ?? null;
  if (options.headerTimeoutMs === 0) {
    const server = Deno.serve(
      { hostname, port, onListen: () => {}, ...(tls === null ? {} : tls) },
      handler,
    );
    return {
      port: server.addr.port,
      finished: server.finished,
      guardStats: null,
      shutdown: () => server.shutdown(),
    };
  }
  return guarded(handler, options, tls, Deno.listen({ hostname, port, transport: "tcp" }));
}

/**
 * `Deno.serve` on a private Unix socket behind the connection guard, which accepts on
 * `listener`, or, with `tls`, on a loopback TLS listener fed by a {@linkcode TlsFront} on
 * `listener` (server/tls_front.ts says why).
 */
function guarded(
  handler: (req: Request) => Promise<Response>,
  options: ListenOptions,
  tls: ServerTls | null,
  listener: Deno.TcpListener,
): Listening {
  let front: TlsFront | null = null;
  let guardListener: Deno.Listener = listener;
  if (tls !== null) {
    let inner: Deno.TlsListener;
    try {
      inner = Deno.listenTls({ hostname: "127.0.0.1", port: 0, transport: "tcp", ...tls });
    } catch (e) {
      listener.close();
      throw e;
    }
    const innerPort = inner.addr.port;
    front = new TlsFront(
      listener,
      () => Deno.connect({ hostname: "127.0.0.1", port: innerPort, transport: "tcp" }),
    );
    guardListener = inner;
  }
  const dir = Deno.makeTempDirSync({ prefix: "webgpu-llm-" });
  const path = `${dir}/http.sock`;
  let server: Deno.HttpServer<Deno.UnixAddr>;
  try {
    server = Deno.serve({ transport: "unix", path, onListen: () => {} }, handler);
  } catch (e) {
    front?.closeAll();
    guardListener.close();
    throw e;
  }
  const guard = new ConnectionGuard(
    guardListener,
    () => Deno.connect({ transport: "unix", path }),
    front === null ? options : {
      ...options,
      onClosed: (client) => front.release((client.remoteAddr as Deno.NetAddr).port),
    },
  );
  const finished = Promise.all([server.finished, guard.finished, front?.finished]).then(() => {
    Deno.removeSync(dir, { recursive: true });
  });
  return {
    port: front?.addr.port ?? guard.addr.port,
    finished,
    guardStats: guard.stats,
    async shutdown() {
      front?.stopAccepting();
      guard.stopAccepting();
      await server.shutdown();
      // The server has written its last bytes: let the guard copy them out (each connection
      // ends when its server side closes), then cut whatever is left; the same for the TLS
      // front's relays, which the guard's closes release.
      await within(guard.finished, SHUTDOWN_FLUSH_MS);
      guard.closeAll();
      if (front !== null) {
        await within(front.finished, SHUTDOWN_FLUSH_MS);
        front.closeAll();
      }
      await finished;
    },
  };
}
