/**
 * Starts an OpenAI-compatible server as a child process for `bench/serve.ts --model DIR`, and
 * stops it afterwards.
 *
 * Contract with the server process:
 * 1. It prints a line containing `Listening on http://HOST:PORT` on stdout once its socket is
 *    bound (anything may precede it on the line, e.g. a log prefix; with `--port 0` the line
 *    carries the port actually bound). Its other output is drained and otherwise ignored.
 * 2. `GET /health` answers 200 once it can serve requests (503 or no answer before that).
 * 3. SIGTERM stops it; after a 5 s grace period it gets SIGKILL.
 *
 * @module
 */

/** Options for {@linkcode startLocalServer}. */
export interface LocalServerOptions {
  /** The process to run: executable then arguments. */
  readonly command: readonly string[];
  /** Bound on the wait for the `Listening on` line plus a 200 from `/health`, milliseconds. */
  readonly startupTimeoutMs: number;
  /** Poll interval of `/health`, milliseconds (default 250). */
  readonly pollMs?: number;
}

/** A running server. */
export interface LocalServer {
  /** Base URL parsed from the `Listening on` line, e.g. "http://127.0.0.1:41234". */
  readonly url: string;
  /** Stops the process (SIGTERM, then SIGKILL after 5 s) and waits for it to exit. */
  close(): Promise<void>;
}

const LISTENING = /Listening on (https?:\/\/[^\s"']+)/;

/** Reads `stream` line by line, calling `onLine` for each, until it ends. */
async function drainLines(
  stream: ReadableStream<Uint8Array>,
  onLine: (line: string) => void,
): Promise<void> {
  let rest = "";
  const decoder = new TextDecoder();
  try {
    for await (const bytes of stream) {
      rest += decoder.decode(bytes, { stream: true });
      const lines = rest.split(/\r?\n/);
      rest = lines.pop() ?? "";
      for (const line of lines) onLine(line);
    }
  } catch {
    // The process was killed mid-read; nothing more to read.
  }
  if (rest !== "") onLine(rest);
}

/**
 * Spawns `options.command`, waits for its `Listening on URL` line and a 200 from `URL/health`,
 * and returns the URL. Throws Error (after stopping the process) when the process exits first
 * or the deadline passes; the message quotes the last lines of its stderr.
 */
export async function startLocalServer(options: LocalServerOptions): Promise<LocalServer> {
  const [exe, ...args] = options.command;
  if (exe === undefined) throw new TypeError("Cannot start a server: empty command");
  const child = new Deno.Command(exe, {
    args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const tail: string[] = [];
  const remember = (line: string) => {
    tail.push(line);
    if (tail.length > 8) tail.shift();
  };
  let resolveUrl: (url: string) => void = () => {};
  const urlSeen = new Promise<string>((resolve) => (resolveUrl = resolve));
  const drained = Promise.all([
    drainLines(child.stdout, (line) => {
      const m = LISTENING.exec(line);
      if (m !== null) resolveUrl(m[1]!.replace(/\/+$/, ""));
      remember(line);
    }),
    drainLines(child.stderr, remember),
  ]);
  let exited = false;
  const status = child.status.then((s) => {
    exited = true;
    return s;
  });
  const close = async () => {
    if (!exited) {
      try {
        child.kill("SIGTERM");
      } catch {
        // Already gone.
      }
      const timer = setTimeout(() => {
        try {
          child.kill("SIGKILL");
        } catch {
          // Already gone.
        }
      }, 5000);
      await status;
      clearTimeout(timer);
    }
    await drained;
  };
  const deadline = performance.now() + options.startupTimeoutMs;
  const fail = async (why: string): Promise<never> => {
    await close();
    const last = tail.filter((l) => l.trim() !== "").slice(-3).join(" | ");
    throw new Error(`Local server ${why}${last ? `; last output: ${last}` : ""}`);
  };
  let timeoutId: ReturnType<typeof setTimeout> | undefined;
  const timedOut = new Promise<"timeout">((resolve) => {
    timeoutId = setTimeout(() => resolve("timeout"), options.startupTimeoutMs);
  });
  try {
    const first = await Promise.race([urlSeen, status, timedOut]);
    if (first === "timeout") {
      return await fail(
        `printed no 'Listening on http://...' line within ${options.startupTimeoutMs / 1000} s`,
      );
    }
    if (typeof first !== "string") {
      return await fail(`exited with code ${first.code} before printing 'Listening on'`);
    }
    const url = first;
    for (;;) {
      if (exited) return await fail(`exited with code ${(await status).code} during start-up`);
      try {
        const res = await fetch(`${url}/health`, { signal: AbortSignal.timeout(2000) });
        await res.body?.cancel();
        if (res.status === 200) return { url, close };
      } catch {
        // Not accepting connections yet.
      }
      if (performance.now() > deadline) {
        return await fail(
          `${url}/health did not answer 200 within ${options.startupTimeoutMs / 1000} s`,
        );
      }
      await new Promise((r) => setTimeout(r, options.pollMs ?? 250));
    }
  } finally {
    clearTimeout(timeoutId);
  }
}
