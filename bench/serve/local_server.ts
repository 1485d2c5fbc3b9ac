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

/** A spawned server process, its output drained. */
interface ServerProcess {
  /** The URL of its `Listening on` line, once printed. */
  readonly urlSeen: Promise<string>;
  /** Its exit. */
  readonly status: Promise<Deno.CommandStatus>;
  /** Whether it has exited. */
  exited(): boolean;
  /** Its last three non-blank lines of output, joined with " | ". */
  lastOutput(): string;
  /** Stops it (SIGTERM, then SIGKILL after 5 s) and waits for it and its output to end. */
  close(): Promise<void>;
}

/** Spawns `command`, watching its stdout for the `Listening on` line. */
function spawnServer(command: readonly string[]): ServerProcess {
  const [exe, ...args] = command;
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
  const kill = (signal: Deno.Signal) => {
    try {
      child.kill(signal);
    } catch {
      // Already gone.
    }
  };
  const close = async () => {
    if (!exited) {
      kill("SIGTERM");
      const timer = setTimeout(() => kill("SIGKILL"), 5000);
      await status;
      clearTimeout(timer);
    }
    await drained;
  };
  return {
    urlSeen,
    status,
    exited: () => exited,
    lastOutput: () => tail.filter((l) => l.trim() !== "").slice(-3).join(" | "),
    close,
  };
}

/** Stops the process and throws the start-up failure `why`, quoting its last output. */
type Fail = (why: string) => Promise<never>;

/** The URL of the `Listening on` line; fails when the process exits first or time runs out. */
async function waitForUrl(proc: ServerProcess, timeoutMs: number, fail: Fail): Promise<string> {
  let timeoutId: ReturnType<typeof setTimeout> | undefined;
  const timedOut = new Promise<"timeout">((resolve) => {
    timeoutId = setTimeout(() => resolve("timeout"), timeoutMs);
  });
  let first: string | Deno.CommandStatus | "timeout";
  try {
    first = await Promise.race([proc.urlSeen, proc.status, timedOut]);
  } finally {
    clearTimeout(timeoutId);
  }
  if (first === "timeout") {
    return await fail(`printed no 'Listening on http://...' line within ${timeoutMs / 1000} s`);
  }
  if (typeof first !== "string") {
    return await fail(`exited with code ${first.code} before printing 'Listening on'`);
  }
  return first;
}

/** Polls `url/health` every `pollMs` until it answers 200; fails on exit or after `deadline`. */
async function waitForHealth(
  proc: ServerProcess,
  url: string,
  deadline: number,
  options: LocalServerOptions,
  fail: Fail,
): Promise<void> {
  for (;;) {
    if (proc.exited()) {
      return await fail(`exited with code ${(await proc.status).code} during start-up`);
    }
    try {
      const res = await fetch(`${url}/health`, { signal: AbortSignal.timeout(2000) });
      await res.body?.cancel();
      if (res.status === 200) return;
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
}

/**
 * Spawns `options.command`, waits for its `Listening on URL` line and a 200 from `URL/health`,
 * and returns the URL. Throws Error (after stopping the process) when the process exits first
 * or the deadline passes; the message quotes the last lines of its stderr.
 */
export async function startLocalServer(options: LocalServerOptions): Promise<LocalServer> {
  const proc = spawnServer(options.command);
  const deadline = performance.now() + options.startupTimeoutMs;
  const fail: Fail = async (why) => {
    await proc.close();
    const last = proc.lastOutput();
    throw new Error(`Local server ${why}${last ? `; last output: ${last}` : ""}`);
  };
  const url = await waitForUrl(proc, options.startupTimeoutMs, fail);
  await waitForHealth(proc, url, deadline, options, fail);
  return { url, close: () => proc.close() };
}
