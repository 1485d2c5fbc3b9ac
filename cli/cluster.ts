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
 * rest and exits 1. Its flags are read in cli/cluster_settings.ts.
 *
 * @module
 */

import {
  CLUSTER_USAGE,
  type ClusterSettings,
  clusterSettingsFromArgs,
} from "./cluster_settings.ts";
import { nginxConfig } from "./nginx_config.ts";
import { replicaMemory } from "./cluster_memory.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const CONFIG = new URL("../deno.json", import.meta.url).pathname;

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
  const serve = ["serve", "--host", host, "--port", String(port), ...settings.serveArgs];
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--config", CONFIG, MAIN, ...serve],
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
  const parsed = clusterSettingsFromArgs(args);
  if (parsed === "help") {
    console.log(CLUSTER_USAGE);
    return 0;
  }
  // Each replica's share of the GPU's memory, where the serve flags leave it to the engine.
  const memory = await replicaMemory(parsed.serveArgs, parsed.replicas);
  if (memory.note !== null) console.log(memory.note);
  const settings = { ...parsed, serveArgs: [...parsed.serveArgs, ...memory.args] };
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
