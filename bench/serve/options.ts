/**
 * The command line of `deno task bench:serve` (bench/serve.ts): its usage text, its flags and
 * their checks, and the parsed {@linkcode Settings}. Engine flags for a server started here come
 * after `--`.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { oneOf, orUsageError, UsageError } from "../bench_io.ts";
import type { Slo } from "./metrics.ts";
import type { BenchConfig } from "./report.ts";
import { parseRange } from "./workload.ts";

/** The help text (`--help`). */
export const USAGE =
  `usage: deno task bench:serve (--url URL | --model DIR) [options] [-- engine flags]

server:
  --url URL                 OpenAI-compatible server base URL (e.g. http://127.0.0.1:8000)
  --model DIR               start 'main.ts serve --model DIR --port 0 <engine flags>' instead
  --served-model-name NAME  'model' field of requests (default: first id of GET /v1/models)
  --startup-timeout-s S     bound on the local server's start-up (default 600)
load:
  --concurrency LIST        closed-loop levels, e.g. 1,4,8,16,32,64 (default)
  --requests-per-level N    requests per level (default max(4*c, 16))
  --request-rate LIST       open-loop levels in req/s ('inf' = all at once) instead
  --burstiness B            gamma shape of arrival gaps; 1 = Poisson (default 1)
  --num-requests N          requests per open-loop level (default 64)
  --max-concurrency N       cap on requests in flight in open-loop levels
workload:
  --input-len N|A:B         prompt tokens, uniform in A..B (default 256)
  --output-len N|A:B        max_tokens, uniform in A..B (default 128)
  --prompt-kind K           tokens (random token ids) or words (random words) (default tokens)
  --vocab-range A:B         token ids drawn from A..B (default 100:5000, cut to the served
                            model's vocabulary when /v1/models reports vocab_size)
  --ignore-eos / --no-ignore-eos   send ignore_eos (default on, so lengths hold)
  --temperature T           sampling temperature (default 0)
  --seed N                  workload seed (default 0)
  --warmup N                uncounted requests before the first level (default 1)
  --timeout-s S             per-request deadline (default 600)
report:
  --slo-ttft-ms MS          goodput SLO on TTFT
  --slo-tpot-ms MS          goodput SLO on TPOT
  --out-dir DIR             report.md, report.json, *.svg (default bench/results/serve-<time>/)
  --json FILE               also write the JSON report to FILE
  --progress / --no-progress   progress bar on stderr (default: when stderr is a terminal)`;

const OPTIONS = {
  url: { type: "string" },
  model: { type: "string" },
  "served-model-name": { type: "string" },
  "startup-timeout-s": { type: "string" },
  concurrency: { type: "string" },
  "requests-per-level": { type: "string" },
  "request-rate": { type: "string" },
  burstiness: { type: "string" },
  "num-requests": { type: "string" },
  "max-concurrency": { type: "string" },
  "input-len": { type: "string", default: "256" },
  "output-len": { type: "string", default: "128" },
  "prompt-kind": { type: "string", default: "tokens" },
  "vocab-range": { type: "string" },
  "ignore-eos": { type: "boolean", default: true },
  temperature: { type: "string", default: "0" },
  seed: { type: "string", default: "0" },
  warmup: { type: "string", default: "1" },
  "timeout-s": { type: "string", default: "600" },
  "slo-ttft-ms": { type: "string" },
  "slo-tpot-ms": { type: "string" },
  "out-dir": { type: "string" },
  json: { type: "string" },
  progress: { type: "boolean" },
  help: { type: "boolean", short: "h", default: false },
} as const;

function positiveNumber(text: string, flag: string, allowZero = false): number {
  const v = Number(text);
  if (text.trim() === "" || !Number.isFinite(v) || v < 0 || (!allowZero && v === 0)) {
    throw new UsageError(
      `--${flag} must be a ${allowZero ? "non-negative" : "positive"} number, got '${text}'`,
    );
  }
  return v;
}

function integer(text: string, flag: string, least: number): number {
  if (!/^\d+$/.test(text.trim()) || Number(text) < least) {
    throw new UsageError(`--${flag} must be an integer >= ${least}, got '${text}'`);
  }
  return Number(text);
}

function list<T>(text: string, flag: string, item: (s: string) => T): T[] {
  const parts = text.split(",").map((s) => s.trim());
  if (parts.some((p) => p === "")) throw new UsageError(`--${flag} has an empty item: '${text}'`);
  return parts.map(item);
}

function range(text: string, flag: string, least: number) {
  return orUsageError(() => parseRange(text, `--${flag}`, least));
}

/** Token ids prompts are drawn from when `--vocab-range` is not given. */
const DEFAULT_VOCAB_RANGE = "100:5000";

/** The parsed command line. */
export interface Settings {
  readonly url: string | undefined;
  readonly modelDir: string | undefined;
  /** Whether `--vocab-range` was given (else it follows the served vocabulary). */
  readonly vocabGiven: boolean;
  readonly engineFlags: string[];
  readonly servedModelName: string | undefined;
  readonly startupTimeoutMs: number;
  readonly config: BenchConfig;
  readonly outDir: string | undefined;
  readonly json: string | undefined;
  readonly progress: boolean | undefined;
}

/** parseArgs over `argv` (a {@linkcode UsageError} with the first line of its complaint). */
function parseCommandLine(argv: string[]) {
  try {
    return parseArgs({
      args: argv,
      options: OPTIONS,
      strict: true,
      allowPositionals: true,
      allowNegative: true,
      tokens: true,
    });
  } catch (e) {
    throw new UsageError(e instanceof Error ? e.message.split("\n")[0]! : String(e));
  }
}

type Parsed = ReturnType<typeof parseCommandLine>;
type Values = Parsed["values"];

/** The engine flags: every positional, all of which must come after "--". */
function engineFlagsOf({ tokens, positionals }: Parsed): string[] {
  const terminator = tokens.findIndex((t) => t.kind === "option-terminator");
  const stray = tokens.find((t, i) =>
    t.kind === "positional" && (terminator < 0 || i < terminator)
  );
  if (stray !== undefined && stray.kind === "positional") {
    throw new UsageError(`unexpected argument '${stray.value}' (engine flags go after '--')`);
  }
  return positionals;
}

/** Exactly one of `--url` (well formed, no engine flags) and `--model`. */
function checkServer(values: Values, engineFlags: readonly string[]): void {
  if ((values.url === undefined) === (values.model === undefined)) {
    throw new UsageError("pass exactly one of --url URL or --model DIR");
  }
  if (values.url !== undefined && !/^https?:\/\/[^\s/]+/.test(values.url)) {
    throw new UsageError(`--url must be http(s)://host[:port], got '${values.url}'`);
  }
  if (values.url !== undefined && values["startup-timeout-s"] !== undefined) {
    throw new UsageError("--startup-timeout-s applies to a server started here (--model)");
  }
  if (values.url !== undefined && engineFlags.length > 0) {
    throw new UsageError("engine flags after '--' need --model (the server is started here)");
  }
}

/** The load levels: closed-loop concurrencies, or open-loop rates with an optional cap. */
function parseLoad(
  values: Values,
): Pick<BenchConfig, "mode" | "concurrency" | "requestRates" | "requestsPerLevel"> {
  const rates = values["request-rate"] === undefined
    ? []
    : list(values["request-rate"], "request-rate", (s) =>
      s === "inf" ? Infinity : positiveNumber(s, "request-rate"));
  const mode = rates.length > 0 ? "rate" : "concurrency";
  if (mode === "rate" && values.concurrency !== undefined) {
    throw new UsageError(
      "--concurrency is a closed-loop sweep; with --request-rate use --max-concurrency",
    );
  }
  if (mode === "concurrency" && values["max-concurrency"] !== undefined) {
    throw new UsageError("--max-concurrency applies to --request-rate levels only");
  }
  for (const flag of ["burstiness", "num-requests"] as const) {
    if (mode === "concurrency" && values[flag] !== undefined) {
      throw new UsageError(`--${flag} applies to --request-rate levels only`);
    }
  }
  if (mode === "rate" && values["requests-per-level"] !== undefined) {
    throw new UsageError(
      "--requests-per-level applies to --concurrency levels; use --num-requests",
    );
  }
  const concurrency = mode === "concurrency"
    ? list(
      values.concurrency ?? "1,4,8,16,32,64",
      "concurrency",
      (s) => integer(s, "concurrency", 1),
    )
    : values["max-concurrency"] === undefined
    ? []
    : [integer(values["max-concurrency"], "max-concurrency", 1)];
  const fixedPerLevel = values["requests-per-level"] === undefined
    ? undefined
    : integer(values["requests-per-level"], "requests-per-level", 1);
  const numRequests = integer(values["num-requests"] ?? "64", "num-requests", 1);
  const requestsPerLevel = mode === "concurrency"
    ? concurrency.map((c) => fixedPerLevel ?? Math.max(4 * c, 16))
    : rates.map(() => numRequests);
  return { mode, concurrency, requestRates: rates, requestsPerLevel };
}

/** The goodput SLOs given. */
function parseSlo(values: Values): Slo {
  return {
    ...(values["slo-ttft-ms"] === undefined
      ? {}
      : { ttftMs: positiveNumber(values["slo-ttft-ms"], "slo-ttft-ms") }),
    ...(values["slo-tpot-ms"] === undefined
      ? {}
      : { tpotMs: positiveNumber(values["slo-tpot-ms"], "slo-tpot-ms") }),
  };
}

/** Parses the command line (see {@linkcode USAGE}); "help" for `--help`. */
export function parseServeArgs(argv: string[]): Settings | "help" {
  const parsed = parseCommandLine(argv);
  const { values } = parsed;
  if (values.help) return "help";
  const engineFlags = engineFlagsOf(parsed);
  checkServer(values, engineFlags);
  const load = parseLoad(values);
  const promptKind = oneOf("prompt-kind", values["prompt-kind"], ["tokens", "words"]);
  const slo = parseSlo(values);
  const config: BenchConfig = {
    mode: load.mode,
    concurrency: load.concurrency,
    requestRates: load.requestRates,
    burstiness: positiveNumber(values.burstiness ?? "1", "burstiness"),
    requestsPerLevel: load.requestsPerLevel,
    inputLen: range(values["input-len"], "input-len", 1),
    outputLen: range(values["output-len"], "output-len", 1),
    promptKind,
    vocab: range(values["vocab-range"] ?? DEFAULT_VOCAB_RANGE, "vocab-range", 0),
    ignoreEos: values["ignore-eos"],
    temperature: positiveNumber(values.temperature, "temperature", true),
    seed: integer(values.seed, "seed", 0),
    slo,
    timeoutS: positiveNumber(values["timeout-s"], "timeout-s"),
    warmupRequests: integer(values.warmup, "warmup", 0),
  };
  return {
    url: values.url?.replace(/\/+$/, ""),
    modelDir: values.model,
    vocabGiven: values["vocab-range"] !== undefined,
    engineFlags,
    servedModelName: values["served-model-name"],
    startupTimeoutMs: positiveNumber(values["startup-timeout-s"] ?? "600", "startup-timeout-s") *
      1000,
    config,
    outDir: values["out-dir"],
    json: values.json,
    progress: values.progress,
  };
}
