/**
 * The flags of `main.ts cluster` ({@linkcode CLUSTER_USAGE}) and the launcher's settings read
 * from them ({@linkcode clusterSettingsFromArgs}); cli/cluster.ts runs the replicas and nginx.
 *
 * @module
 */

import { isLoopbackHost } from "../server/security.ts";
import { parseCommandArgs, UsageError } from "./usage.ts";

/** The help text of `main.ts cluster`. */
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
--host and --port are the launcher's. Where nvidia-smi reads the GPU's memory, each replica's
engine gets 0.9 / N of the free memory (--gpu-memory-utilization) unless --gpu-memory-utilization,
--kv-cache-memory or --num-kv-blocks follows '--'.`;

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
    if (/^--ssl-(certfile|keyfile)(=|$)/.test(flag)) {
      throw new UsageError(
        `${flag.split("=")[0]}: the replicas sit behind nginx over loopback; terminate TLS in ` +
          `nginx (--no-nginx and your own front) or serve one replica with serve --ssl-*`,
      );
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
  if (values["no-nginx"] && values.nginx !== undefined) {
    throw new UsageError("--nginx names the binary to start: not with --no-nginx");
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
