/**
 * The command line of `deno task bench:batching` (bench/batching.ts): its usage text, the parsed
 * options, the error for bad input, where output goes, and the mock executor's default
 * (calibrated) latency model that the `--mock-*` flags default to.
 *
 * @module
 */

import type { KernelProfileChoice } from "../../gpu/kernel_profile.ts";
import { parseQuantization, type Quantization } from "../../gpu/quant.ts";
import { kernelProfileOption, oneOf, orUsageError, parseFlags, UsageError } from "../bench_io.ts";

/**
 * The mock executor's default latency model, fitted by `--calibrate` from the WebGPU runner's
 * step times: tiny-qwen3 with f16 weights on lavapipe (llvmpipe LLVM 15.0.6, 256 bits), 2 CPU
 * cores, Deno 2.9.6, 2026-11-22, with the `unrolled` matmul and attention kernels (K and V read 8
 * halves per load); command: `deno task bench:batching --calibrate`. The fit was 2.445 ms +
 * 0.0294 ms per batched token + 0.0276 ms per sequence + 0.1136 ms per 1,000 attended (query,
 * key) pairs, R^2 0.988 over 14 step shapes (decode 1..64 sequences at contexts 32..512:
 * 2.06..8.62 ms; prefill chunks of 64..512 tokens over contexts 64..960: 5.4..20.5 ms). A
 * swap-out of 16 blocks took 11.54 ms while the executor waited for its readback; since it
 * reads back in the background, 1.50 ms (the same command, later that day; its refit, 2.454 +
 * 0.0275 + 0.0319 + 0.1102 with R^2 0.977, was within noise of the terms kept here). Earlier the
 * same day a line in batched tokens alone was
 * fitted: 8.04 + 0.158, 3.36 + 0.065, 2.94 + 0.048 as the kernels improved. Re-run it on another
 * machine and pass the `--mock-*` flags it prints.
 */
export const DEFAULT_MOCK_LATENCY = {
  baseMs: 2.44,
  perTokenMs: 0.0294,
  perSeqMs: 0.0276,
  perKiloPairMs: 0.1136,
  swapOutMs: 1.5,
  source: "calibrated 2026-11-22: WebGPU tiny-qwen3 f16 step times on lavapipe (2 cores), " +
    "`deno task bench:batching --calibrate`",
} as const;

const USAGE = `usage: deno task bench:batching [options]
  --executor mock|webgpu     step executor (default mock: simulated time, calibrated latency)
  --model DIR                model for webgpu / --calibrate (default: tiny-qwen3, generated)
  --kernel-profile auto|cpu|gpu   kernel variants of the webgpu runs (default auto)
  --quantization none|int8|int4  weights of the webgpu runs' projections and LM head
                             (default none; not with the mock executor alone)
  --json                     print one JSON object instead of tables
  --requests N               requests (default 256)
  --seed S                   workload seed (default 0)
  --prompt-len A:B           prompt tokens, uniform in A..B (default 16:256; sweep 16:64)
  --output-len A:B           output tokens (max_tokens, ignore_eos), uniform in A..B
                             (default 16:512; sweep 4:16)
  --kv-slots N               KV token slots every scheduler gets (default 16384)
  --max-model-len N          max_model_len, the baselines' per-request reservation (default 1024)
  --block-size N             KV block size (default 16)
  --max-num-seqs N           continuous: most running requests (default 256)
  --max-num-batched-tokens N token budget of one step (default 2048)
  --preemption-mode M        continuous: recompute (default) or swap
  --swap-slots N             swap mode: host swap space in KV token slots (default --kv-slots)
  --batch-wait-ms MS         dynamic: wait window (default 10)
  --max-in-flight N          steps in flight (default: the executor's maximum)
  --mock-base-ms MS          mock latency a (default ${DEFAULT_MOCK_LATENCY.baseMs}, calibrated)
  --mock-per-token-ms MS     mock latency b per batched token (default ${DEFAULT_MOCK_LATENCY.perTokenMs})
  --mock-per-seq-ms MS       mock latency s per scheduled sequence (default ${DEFAULT_MOCK_LATENCY.perSeqMs})
  --mock-per-kpair-ms MS     mock latency c per 1000 attended (query, key) pairs (default ${DEFAULT_MOCK_LATENCY.perKiloPairMs})
  --mock-swap-out-ms MS      mock (virtual clock): time a swap-out adds (default ${DEFAULT_MOCK_LATENCY.swapOutMs}, measured)
  --clock virtual|wall       mock only: simulated time (default) or real time (timers)
  --calibrate                measure WebGPU step times and fit the mock latency model
  --sweep                    the 004 experiment (mock; Poisson arrivals), files to --out-dir
  --rate R                   sweep: Poisson arrival rate in req/s (default 20)
  --out-dir DIR              output folder for the .md, .json and .svg files
                             (default bench/results/batching-<time>/, git-ignored)`;

/** The parsed command line of the batching benchmark. */
export interface Options {
  executor: "mock" | "webgpu";
  model: string | undefined;
  /** Kernel variants of the WebGPU runner (webgpu executor, --calibrate). */
  kernelProfile: KernelProfileChoice;
  /** Weight format of the WebGPU runner (webgpu executor, --calibrate). */
  quantization: Quantization;
  json: boolean;
  requests: number;
  seed: number;
  promptLen: [number, number];
  outputLen: [number, number];
  kvSlots: number;
  maxModelLen: number;
  blockSize: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  preemptionMode: "recompute" | "swap";
  swapSlots: number;
  batchWaitMs: number;
  maxInFlight: number | undefined;
  baseMs: number;
  perTokenMs: number;
  perSeqMs: number;
  perKiloPairMs: number;
  swapOutMs: number;
  clock: "virtual" | "wall";
  calibrate: boolean;
  sweep: boolean;
  rate: number;
  outDir: string | undefined;
}

function parseNum(flag: string, text: string | undefined, least: number, int = true): number {
  const v = Number(text);
  if (text === undefined || text.trim() === "" || !Number.isFinite(v) || v < least) {
    throw new UsageError(`--${flag} must be a number >= ${least}, got '${text}'`);
  }
  if (int && !Number.isInteger(v)) {
    throw new UsageError(`--${flag} must be an integer, got '${text}'`);
  }
  return v;
}

function parseRange(flag: string, text: string): [number, number] {
  const parts = text.split(":");
  const lo = parseNum(flag, parts[0], 1);
  const hi = parts.length > 1 ? parseNum(flag, parts[1], 1) : lo;
  if (parts.length > 2 || hi < lo) throw new UsageError(`--${flag} must be N or A:B with A <= B`);
  return [lo, hi];
}

/** The flags of `deno task bench:batching` and their defaults (see USAGE). */
const FLAGS = {
  executor: { type: "string", default: "mock" },
  model: { type: "string" },
  "kernel-profile": { type: "string" },
  quantization: { type: "string", default: "none" },
  json: { type: "boolean", default: false },
  requests: { type: "string", default: "256" },
  seed: { type: "string", default: "0" },
  "prompt-len": { type: "string" },
  "output-len": { type: "string" },
  "kv-slots": { type: "string", default: "16384" },
  "max-model-len": { type: "string", default: "1024" },
  "block-size": { type: "string", default: "16" },
  "max-num-seqs": { type: "string", default: "256" },
  "max-num-batched-tokens": { type: "string", default: "2048" },
  "preemption-mode": { type: "string", default: "recompute" },
  "swap-slots": { type: "string" },
  "batch-wait-ms": { type: "string", default: "10" },
  "max-in-flight": { type: "string" },
  "mock-base-ms": { type: "string", default: String(DEFAULT_MOCK_LATENCY.baseMs) },
  "mock-per-token-ms": { type: "string", default: String(DEFAULT_MOCK_LATENCY.perTokenMs) },
  "mock-per-seq-ms": { type: "string", default: String(DEFAULT_MOCK_LATENCY.perSeqMs) },
  "mock-per-kpair-ms": { type: "string", default: String(DEFAULT_MOCK_LATENCY.perKiloPairMs) },
  "mock-swap-out-ms": { type: "string", default: String(DEFAULT_MOCK_LATENCY.swapOutMs) },
  clock: { type: "string", default: "virtual" },
  calibrate: { type: "boolean", default: false },
  sweep: { type: "boolean", default: false },
  rate: { type: "string", default: "20" },
  "out-dir": { type: "string" },
  help: { type: "boolean", default: false },
} as const;

/** Parses the command line (see USAGE). */
export function parseBatchingArgs(argv: string[]): Options {
  const v = parseFlags(argv, FLAGS);
  if (v.help) throw new UsageError(USAGE);
  const executor = oneOf("executor", v.executor, ["mock", "webgpu"]);
  const clock = oneOf("clock", v.clock, ["virtual", "wall"]);
  const preemptionMode = oneOf("preemption-mode", v["preemption-mode"], ["recompute", "swap"]);
  const o: Options = {
    executor,
    model: v.model,
    kernelProfile: kernelProfileOption(v["kernel-profile"]),
    quantization: orUsageError(() => parseQuantization(v.quantization)),
    json: v.json,
    requests: parseNum("requests", v.requests, 1),
    seed: parseNum("seed", v.seed, 0),
    // The sweep's defaults are short requests, so that 10-50 ms wait windows are visible.
    promptLen: parseRange("prompt-len", v["prompt-len"] ?? (v.sweep ? "16:64" : "16:256")),
    outputLen: parseRange("output-len", v["output-len"] ?? (v.sweep ? "4:16" : "16:512")),
    kvSlots: parseNum("kv-slots", v["kv-slots"], 1),
    maxModelLen: parseNum("max-model-len", v["max-model-len"], 2),
    blockSize: parseNum("block-size", v["block-size"], 1),
    maxNumSeqs: parseNum("max-num-seqs", v["max-num-seqs"], 1),
    maxNumBatchedTokens: parseNum("max-num-batched-tokens", v["max-num-batched-tokens"], 1),
    preemptionMode,
    swapSlots: v["swap-slots"] === undefined
      ? parseNum("kv-slots", v["kv-slots"], 1)
      : parseNum("swap-slots", v["swap-slots"], 1),
    batchWaitMs: parseNum("batch-wait-ms", v["batch-wait-ms"], 0, false),
    maxInFlight: v["max-in-flight"] === undefined
      ? undefined
      : parseNum("max-in-flight", v["max-in-flight"], 1),
    baseMs: parseNum("mock-base-ms", v["mock-base-ms"], 0, false),
    perTokenMs: parseNum("mock-per-token-ms", v["mock-per-token-ms"], 0, false),
    perSeqMs: parseNum("mock-per-seq-ms", v["mock-per-seq-ms"], 0, false),
    perKiloPairMs: parseNum("mock-per-kpair-ms", v["mock-per-kpair-ms"], 0, false),
    swapOutMs: parseNum("mock-swap-out-ms", v["mock-swap-out-ms"], 0, false),
    clock,
    calibrate: v.calibrate,
    sweep: v.sweep,
    rate: parseNum("rate", v.rate, 0, false),
    outDir: v["out-dir"],
  };
  checkCombination(o, v["kernel-profile"] !== undefined);
  return o;
}

/** Rejects flags that are valid alone but not together. */
function checkCombination(o: Options, kernelProfileGiven: boolean): void {
  if (o.promptLen[1] + o.outputLen[1] > o.maxModelLen) {
    throw new UsageError(
      `--prompt-len max ${o.promptLen[1]} + --output-len max ${
        o.outputLen[1]
      } exceeds --max-model-len ${o.maxModelLen}`,
    );
  }
  if (o.executor === "mock" && !o.calibrate) {
    // The mock executor alone runs no kernels and holds no weights: these would be ignored.
    const given = [
      ["quantization", o.quantization !== "none"],
      ["kernel-profile", kernelProfileGiven],
      ["model", o.model !== undefined],
    ].find(([, set]) => set);
    if (given !== undefined) {
      throw new UsageError(
        `--${given[0]} applies to the WebGPU runner: --executor webgpu or --calibrate`,
      );
    }
  }
  if (o.sweep && !(o.rate > 0)) throw new UsageError(`--rate must be > 0, got ${o.rate}`);
  if (o.sweep && o.executor !== "mock") throw new UsageError("--sweep runs on the mock executor");
}
