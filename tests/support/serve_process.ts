/**
 * A `main.ts serve` process for end-to-end tests: started on a free port, its stdout and stderr
 * lines collected, ready once `/health` answers 200.
 *
 * @module
 */

/** The path of main.ts. */
export const MAIN = new URL("../../main.ts", import.meta.url).pathname;

/** A running `serve`: its URL, process, output lines so far and exit status. */
export interface ServerProcess {
  readonly url: string;
  readonly child: Deno.ChildProcess;
  readonly log: string[];
  readonly exited: Promise<Deno.CommandStatus>;
}

/**
 * Starts `main.ts serve` (with `--model model` unless `model` is empty) on a free port and waits
 * for /health 200 (asked through a client from `client`, e.g. one trusting a test certificate).
 */
export async function startServe(
  model: string,
  flags: string[] = [],
  client?: () => Deno.HttpClient,
): Promise<ServerProcess> {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      MAIN,
      "serve",
      ...(model ? ["--model", model] : []),
      "--port",
      "0",
      ...flags,
    ],
    env: { XDG_RUNTIME_DIR: "/tmp" },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const log: string[] = [];
  let resolveUrl: (url: string) => void = () => {};
  const urlPromise = new Promise<string>((r) => (resolveUrl = r));
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
      for (const line of chunk.split("\n")) {
        if (line === "") continue;
        log.push(line);
        const m = line.match(/Listening on (https?:\/\/\S+)/);
        if (m) resolveUrl(m[1]!);
      }
    }
  };
  void pump(child.stdout);
  void pump(child.stderr);
  const url = await urlPromise;
  const http = client?.();
  try {
    for (let i = 0; i < 200; i++) {
      const r = await fetch(`${url}/health`, http ? { client: http } : {}).catch(() => null);
      await r?.body?.cancel();
      if (r?.status === 200) break;
      await new Promise((r) => setTimeout(r, 50));
    }
  } finally {
    http?.close();
  }
  return { url, child, log, exited: child.status };
}

/** Stops the server with SIGTERM; resolves with its exit status. */
export async function stopServe(p: ServerProcess): Promise<Deno.CommandStatus> {
  p.child.kill("SIGTERM");
  return await p.exited;
}
