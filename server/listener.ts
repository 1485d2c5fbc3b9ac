/**
 * Where the server listens: `Deno.serve` on a Unix socket in a private temporary directory,
 * behind a {@linkcode ConnectionGuard} on the public TCP address (header and keep-alive
 * deadlines, see server/connection_guard.ts), or `Deno.serve` directly on TCP when the header
 * deadline is off (`headerTimeoutMs` 0). With `tls`, the public address speaks HTTPS: the guard
 * accepts TLS connections (the handshake counts in the header deadline: Deno performs it on the
 * first read), or `Deno.serve` terminates TLS itself.
 *
 * @module
 */

import { ConnectionGuard, type ConnectionGuardStats } from "./connection_guard.ts";

/** Time the guard gets to copy out the server's last bytes at shutdown, ms. */
const SHUTDOWN_FLUSH_MS = 2000;

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
  const listener = tls === null
    ? Deno.listen({ hostname, port, transport: "tcp" })
    : Deno.listenTls({ hostname, port, transport: "tcp", ...tls });
  const dir = Deno.makeTempDirSync({ prefix: "webgpu-llm-" });
  const path = `${dir}/http.sock`;
  let server: Deno.HttpServer<Deno.UnixAddr>;
  try {
    server = Deno.serve({ transport: "unix", path, onListen: () => {} }, handler);
  } catch (e) {
    listener.close();
    throw e;
  }
  const guard = new ConnectionGuard(
    listener,
    () => Deno.connect({ transport: "unix", path }),
    options,
  );
  const finished = Promise.all([server.finished, guard.finished]).then(() => {
    Deno.removeSync(dir, { recursive: true });
  });
  return {
    port: guard.addr.port,
    finished,
    guardStats: guard.stats,
    async shutdown() {
      guard.stopAccepting();
      await server.shutdown();
      // The server has written its last bytes: let the guard copy them out (each connection
      // ends when its server side closes), then cut whatever is left.
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([
        guard.finished,
        new Promise((r) => timer = setTimeout(r, SHUTDOWN_FLUSH_MS)),
      ]);
      clearTimeout(timer);
      guard.closeAll();
      await finished;
    },
  };
}
