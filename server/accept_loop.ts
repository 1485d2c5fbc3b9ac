/**
 * The accept loop shared by the server's TCP fronts (server/connection_guard.ts,
 * server/tls_front.ts).
 *
 * @module
 */

/**
 * Runs `serve` for each connection `listener` accepts, until the listener closes; resolves once
 * it has closed and every `serve` has ended.
 */
export async function acceptEach<C extends Deno.Conn>(
  listener: AsyncIterable<C>,
  serve: (conn: C) => Promise<void>,
): Promise<void> {
  const running = new Set<Promise<void>>();
  try {
    for await (const conn of listener) {
      const run = serve(conn);
      running.add(run);
      run.finally(() => running.delete(run));
    }
  } catch {
    // The listener was closed.
  }
  await Promise.all(running);
}

/** Closes `resource` (a listener or a connection) unless it is closed already. */
export function closeQuietly(resource: { close(): void }): void {
  try {
    resource.close();
  } catch {
    // Already closed.
  }
}
