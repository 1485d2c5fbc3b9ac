/**
 * `main.ts cluster` (`deno task cluster`): N replicas of `main.ts serve` on consecutive ports of
 * 127.0.0.1 and, when nginx is installed, nginx in front of them on `--host:--port` with the
 * configuration of cli/nginx_config.ts, all in the foreground. It is a launcher around existing
 * parts, not a proxy: nginx balances, each replica serves.
 *
 * Each replica's output is printed with a `[replica I]` prefix, nginx's with `[nginx]`. SIGINT /
 * SIGTERM stop everything gracefully (replicas drain with their `--shutdown-timeout`, nginx
 * finishes open connections) and the launcher exits 0. A replica that dies is reported and left
 * dead (nginx stops sending it work); when none is left, or nginx dies, the launcher stops the
 * rest and exits 1.
 *
 * @module
 */

import { nginxConfig } from "./nginx_config.ts";
import { isLoopbackHost } from "../server/security.ts";
import { parseCommandArgs, UsageError } from "./usage.ts";

export const CLUSTER_USAGE =
  `usage: main.ts cluster [--replicas N] [--port P] [--host ADDR] [options] [-- serve flags]

Starts N replicas of 'main.ts serve' on 127.0.0.1 ports P+1 .. P+N and nginx on ADDR:P in front
of them (least_conn; requests with an X-Session-Id header stay on one replica), in the foreground.
Ctrl-C / SIGTERM stops them all.

  --replicas N            replicas to start (default 2)
  --port P                port nginx listens on (default 8000); replicas use P+1 .. P+N
  --host ADDR             address nginx listens on (default 127.0.0.1)
  --replica-env K=V0,V1,...
                          give replica I the environment variable K=VI (one value per replica;
                          repeatable), e.g. a variable that selects its GPU on your Vulkan stack
  --nginx PATH            the nginx binary (default: nginx on PATH; if there is none, only the
                          replicas start, each reachable on its own port)
  --no-nginx              start the replicas only
  --startup-timeout-s S   time each replica may take to listen (default 120)

Everything after '--' goes to every replica's 'serve' (e.g. -- --model DIR --max-num-seqs 32);
--host and --port are the launcher's.`;

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const CONFIG = new URL("../deno.json", import.meta.url).pathname;

/** The launcher's settings, from its flags. */
export interface ClusterSettings {
  readonly replicas: number;
  readonly port: number;
  readonly host: string;
  /** Environment of each replica (index = replica). */
  readonly replicaEnv: ReadonlyArray<Readonly<Record<string, string>>>;
  /** nginx binary; null: replicas only. */
  readonly nginx: string | null;
  /** Whether `--nginx` named the binary (then its absence is an error). */
  readonly nginxExplicit: boolean;
  readonly startupTimeoutMs: number;
  /** Flags for every replica's `serve`. */
  readonly serveArgs: readonly string[];
}

function positiveInt(flag: string, text: string, max: number): number {
  const v = Number(text);
  if (!Number.isInteger(v) || v < 1 || v > max) {
    throw new UsageError(`--${flag} expects an integer in 1..${max}, got "${text}"`);
  }
  return v;
}

/** Reads the launcher's flags (`args` before `--`) and the replicas' (after it). */
export function clusterSettingsFromArgs(args: readonly string[]): ClusterSettings | "help" {
  const dash = args.indexOf("--");
  const own = dash < 0 ? [...args] : args.slice(0, dash);
  const serveArgs = dash < 0 ? [] : args.slice(dash + 1);
  const { values } = parseCommandArgs("cluster", {
    args: own,
    options: {
      replicas: { type: "string", default: "2" },
      port: { type: "string", default: "8000" },
      host: { type: "string", default: "127.0.0.1" },
      "replica-env": { type: "string", multiple: true },
      nginx: { type: "string" },
      "no-nginx": { type: "boolean", default: false },
      "startup-timeout-s": { type: "string", default: "120" },
      help: { type: "boolean", default: false },
    },
  });
  if (values.help) return "help";
  const replicas = positiveInt("replicas", values.replicas, 64);
  const port = positiveInt("port", values.port, 65535 - replicas);
  for (const flag of serveArgs) {
    if (/^--(host|port)(=|$)/.test(flag)) {
      throw new UsageError(`${flag.split("=")[0]} is the launcher's flag: put it before '--'`);
    }
  }
  const replicaEnv: Array<Record<string, string>> = Array.from({ length: replicas }, () => ({}));
  for (const entry of values["replica-env"] ?? []) {
    const eq = entry.indexOf("=");
    const values_ = eq > 0 ? entry.slice(eq + 1).split(",") : [];
    if (eq <= 0 || values_.length !== replicas) {
      throw new UsageError(
        `--replica-env expects NAME=V0,...,V${
          replicas - 1
        } (one value per replica), got "${entry}"`,
      );
    }
    values_.forEach((v, i) => replicaEnv[i]![entry.slice(0, eq)] = v);
  }
  const timeoutS = Number(values["startup-timeout-s"]);
  if (!(timeoutS > 0)) {
    throw new UsageError(
      `--startup-timeout-s expects seconds > 0, got "${values["startup-timeout-s"]}"`,
    );
  }
  return {
    replicas,
    port,
    host: values.host,
    replicaEnv,
    nginx: values["no-nginx"] ? null : values.nginx ?? "nginx",
    nginxExplicit: values.nginx !== undefined,
    startupTimeoutMs: timeoutS * 1000,
    serveArgs: isLoopbackHost(values.host) || serveArgs.some((f) => f.startsWith("--allowed-hosts"))
      ? serveArgs
      // nginx is the public face: the replicas (on loopback) accept the public Host names, as
      // `serve` bound to a public address would.
      : [...serveArgs, "--allowed-hosts", "*"],
  };
}

/** Whether `nginx` runs (`nginx -v`). */
export async function nginxAvailable(nginx: string): Promise<boolean> {
  try {
    const out = await new Deno.Command(nginx, { args: ["-v"], stdout: "null", stderr: "null" })
      .output();
    return out.success;
  } catch {
    return false;
  }
}

/** Prints each line of `stream` with `prefix`; calls `onLine` with it too. */
async function relay(
  stream: ReadableStream<Uint8Array>,
  prefix: string,
  print: (line: string) => void,
  onLine: (line: string) => void = () => {},
): Promise<void> {
  let rest = "";
  for await (const text of stream.pipeThrough(new TextDecoderStream())) {
    const lines = (rest + text).split("\n");
    rest = lines.pop()!;
    for (const line of lines) {
      print(`${prefix}${line}`);
      onLine(line);
    }
  }
  if (rest !== "") print(`${prefix}${rest}`);
}

interface Replica {
  readonly index: number;
  readonly url: string;
  readonly child: Deno.ChildProcess;
  /** Resolves once the replica printed its `Listening on` line. */
  readonly listening: Promise<void>;
  exited: boolean;
}

function startReplica(settings: ClusterSettings, index: number, host: string): Replica {
  const port = settings.port + 1 + index;
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--config",
      CONFIG,
      MAIN,
      "serve",
      "--host",
      host,
      "--port",
      String(port),
      ...settings.serveArgs,
    ],
    env: settings.replicaEnv[index] ?? {},
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let listened = () => {};
  const listening = new Promise<void>((r) => listened = r);
  const onLine = (line: string) => {
    if (line.startsWith("Listening on")) listened();
  };
  void relay(child.stdout, `[replica ${index}] `, console.log, onLine);
  void relay(child.stderr, `[replica ${index}] `, console.error, onLine);
  const url = `http://${hostPort(host, port)}`;
  return { index, url, child, listening, exited: false };
}

async function waitPort(hostname: string, port: number, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    try {
      (await Deno.connect({ hostname, port })).close();
      return true;
    } catch {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  return false;
}

function kill(child: Deno.ChildProcess, signal: Deno.Signal): void {
  try {
    child.kill(signal);
  } catch {
    // Already gone.
  }
}

/** Prints one line once every replica's `/health` answers 200 (the model loaded). */
async function announceReady(replicas: readonly Replica[], stopping: () => boolean): Promise<void> {
  const pending = new Set(replicas);
  while (pending.size > 0 && !stopping()) {
    for (const replica of [...pending]) {
      const res = await fetch(`${replica.url}/health`).catch(() => null);
      await res?.body?.cancel();
      if (res?.status === 200) pending.delete(replica);
    }
    if (pending.size > 0) await new Promise((r) => setTimeout(r, 200));
  }
  if (!stopping()) console.log(`[cluster] ready: ${replicas.length} replicas healthy`);
}

/** `replica I URL (pid P)` for each replica, comma-separated. */
function replicaList(replicas: readonly Replica[]): string {
  return replicas.map((r) => `replica ${r.index} ${r.url} (pid ${r.child.pid})`).join(", ");
}

/** `host:port`, with an IPv6 host in brackets. */
function hostPort(host: string, port: number): string {
  return `${host.includes(":") ? `[${host}]` : host}:${port}`;
}

/**
 * The nginx binary to start, or null for replicas only: `--no-nginx`, or no nginx found where
 * `--nginx` did not name one (said on stdout).
 *
 * @throws {Error} when the binary `--nginx` named does not run.
 */
async function nginxToRun(settings: ClusterSettings): Promise<string | null> {
  const nginx = settings.nginx;
  if (nginx === null || await nginxAvailable(nginx)) return nginx;
  if (settings.nginxExplicit) throw new Error(`Cannot run nginx at ${nginx}`);
  console.log(
    "[cluster] nginx not found: starting the replicas only (install Debian's nginx package " +
      "to balance them)",
  );
  return null;
}

/**
 * The processes of one `cluster` run: its replicas and nginx, and the exit code they settle on
 * ({@linkcode Cluster.stopped}: 0 after a signal, 1 when every replica or nginx died).
 */
class Cluster {
  readonly replicas: readonly Replica[];
  /** Resolves with the launcher's exit code once it should stop. */
  readonly stopped: Promise<number>;
  /** Settles {@linkcode Cluster.stopped} (the first call wins). */
  readonly stop: (code: number) => void;
  /** Whether the launcher is stopping (exits are expected then, not reported). */
  stopping = false;
  #settings: ClusterSettings;
  #nginx: Deno.ChildProcess | null = null;
  /** nginx's prefix directory (its configuration), removed at the end. */
  #dir: string | null = null;

  /** Starts the replicas, listening on `replicaHost`. */
  constructor(settings: ClusterSettings, replicaHost: string) {
    this.#settings = settings;
    let resolveStop: (code: number) => void = () => {};
    this.stopped = new Promise<number>((r) => resolveStop = r);
    this.stop = resolveStop;
    this.replicas = Array.from(
      { length: settings.replicas },
      (_, i) => startReplica(settings, i, replicaHost),
    );
    for (const replica of this.replicas) {
      replica.child.status.then((status) => {
        replica.exited = true;
        if (this.stopping) return;
        const left = this.#alive().length;
        console.error(
          `[cluster] replica ${replica.index} (${replica.url}) exited with status ${status.code}` +
            (left > 0 ? `; ${left} left` : "; none left"),
        );
        if (left === 0) this.stop(1);
      });
    }
  }

  /** Whether every replica printed its `Listening on` line before the startup timeout. */
  started(): Promise<boolean> {
    return Promise.race([
      Promise.all(this.replicas.map((r) => r.listening)).then(() => true),
      new Promise<false>((r) =>
        Deno.unrefTimer(setTimeout(() => r(false), this.#settings.startupTimeoutMs))
      ),
      this.stopped.then(() => false),
    ]);
  }

  /**
   * Writes nginx's configuration into a new prefix directory and starts `nginx` in front of the
   * replicas; prints `Listening on ...` once its port accepts connections (within 10 s).
   */
  async startNginx(nginx: string): Promise<void> {
    const settings = this.#settings;
    const dir = this.#dir = await Deno.makeTempDir({ prefix: "webgpu-llm-nginx-" });
    await Deno.chmod(dir, 0o755);
    const listen = hostPort(settings.host, settings.port);
    await Deno.writeTextFile(
      `${dir}/nginx.conf`,
      nginxConfig({ listen, replicas: this.replicas.map((r) => new URL(r.url).host) }),
    );
    const child = this.#nginx = new Deno.Command(nginx, {
      args: ["-p", `${dir}/`, "-c", `${dir}/nginx.conf`],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    void relay(child.stdout, "[nginx] ", console.log);
    void relay(child.stderr, "[nginx] ", console.error);
    child.status.then((status) => {
      if (this.stopping) return;
      console.error(`[cluster] nginx exited with status ${status.code}`);
      this.stop(1);
    });
    if (await waitPort(settings.host, settings.port, 10_000)) {
      console.log(
        `Listening on http://${listen} (nginx: least_conn; X-Session-Id: consistent hash) -> ` +
          replicaList(this.replicas),
      );
    }
  }

  /**
   * Stops everything: nginx finishes its open connections (SIGQUIT), the replicas drain
   * (SIGTERM); resolves once all have exited and nginx's directory is removed.
   */
  async shutdown(): Promise<void> {
    this.stopping = true;
    console.log("[cluster] stopping");
    const nginx = this.#nginx;
    if (nginx !== null) kill(nginx, "SIGQUIT");
    for (const replica of this.#alive()) kill(replica.child, "SIGTERM");
    await Promise.all([...this.replicas.map((r) => r.child.status), nginx?.status]);
    if (this.#dir !== null) await Deno.remove(this.#dir, { recursive: true }).catch(() => {});
  }

  #alive(): Replica[] {
    return this.replicas.filter((r) => !r.exited);
  }
}

/** Runs `cluster` with `args`; resolves with the exit code once everything has stopped. */
export async function runCluster(args: string[]): Promise<number> {
  const settings = clusterSettingsFromArgs(args);
  if (settings === "help") {
    console.log(CLUSTER_USAGE);
    return 0;
  }
  const nginx = await nginxToRun(settings);
  const cluster = new Cluster(settings, nginx === null ? settings.host : "127.0.0.1");
  const onSignal = () => cluster.stop(0);
  Deno.addSignalListener("SIGINT", onSignal);
  Deno.addSignalListener("SIGTERM", onSignal);
  try {
    const started = await cluster.started();
    if (!started) {
      console.error("[cluster] error: the replicas did not all start; stopping");
      cluster.stop(1);
    } else if (nginx !== null) {
      await cluster.startNginx(nginx);
    } else {
      console.log(`Replicas: ${replicaList(cluster.replicas)}`);
    }
    if (started) void announceReady(cluster.replicas, () => cluster.stopping);
    return await cluster.stopped;
  } finally {
    cluster.stopping = true;
    Deno.removeSignalListener("SIGINT", onSignal);
    Deno.removeSignalListener("SIGTERM", onSignal);
    await cluster.shutdown();
  }
}
