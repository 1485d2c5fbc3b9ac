/**
 * Command-line options of `deno task bench:prefill-decode`: the usage text, their parser, and
 * the error and output types the entry point shares with its tests.
 *
 * @module
 */

import type { KernelProfileChoice } from "../../gpu/kernel_profile.ts";
import { parseQuantization, type Quantization } from "../../gpu/quant.ts";
import { kernelProfileOption, oneOf, orUsageError, parseFlags, UsageError } from "../bench_io.ts";

const USAGE = `usage: deno task bench:prefill-decode [options]
  --model DIR|tiny|qwen3-0.6b  model (default qwen3-0.6b: random weights in a temp dir)
  --kernel-profile auto|cpu|gpu  kernel variants (default auto: from the adapter)
  --quantization none|int8|int4  weights of the projections and LM head (default none)
  --prompt-len N               prompt tokens (default 512)
  --gen N                      generated tokens (default 64)
  --batch-model tiny|main      model of the batch-size sweep (default tiny)
  --batch-sizes LIST           batch sizes (default 1,2,4,8,16)
  --batch-requests N           requests per batch-size run (default 16)
  --batch-gen N                mean output tokens in the sweep, outputs uniform N/4..2N (default 32)
  --no-batch-sweep             skip section 4
  --json                       print the JSON report instead of tables
  --out-dir DIR                default bench/results/prefill-decode-<time>/`;

/** The parsed command line. */
export interface Options {
  model: string;
  kernelProfile: KernelProfileChoice;
  quantization: Quantization;
  promptLen: number;
  gen: number;
  batchModel: "tiny" | "main";
  batchSizes: number[];
  batchRequests: number;
  batchGen: number;
  batchSweep: boolean;
  json: boolean;
  outDir: string | undefined;
}

function int(flag: string, text: string, least: number): number {
  const v = Number(text);
  if (text.trim() === "" || !Number.isInteger(v) || v < least) {
    throw new UsageError(`--${flag} must be an integer >= ${least}, got '${text}'`);
  }
  return v;
}

/** The flags of `deno task bench:prefill-decode` and their defaults (see USAGE). */
const FLAGS = {
  model: { type: "string", default: "qwen3-0.6b" },
  "kernel-profile": { type: "string" },
  quantization: { type: "string", default: "none" },
  "prompt-len": { type: "string", default: "512" },
  gen: { type: "string", default: "64" },
  "batch-model": { type: "string" },
  "batch-sizes": { type: "string" },
  "batch-requests": { type: "string" },
  "batch-gen": { type: "string" },
  "no-batch-sweep": { type: "boolean", default: false },
  json: { type: "boolean", default: false },
  "out-dir": { type: "string" },
  help: { type: "boolean", default: false },
} as const;

/** Parses the command line (see USAGE). */
export function parsePrefillDecodeArgs(argv: string[]): Options {
  const v = parseFlags(argv, FLAGS);
  if (v.help) throw new UsageError(USAGE);
  const sweepFlags = ["batch-model", "batch-sizes", "batch-requests", "batch-gen"] as const;
  const given = sweepFlags.filter((f) => v[f] !== undefined);
  if (v["no-batch-sweep"] && given.length > 0) {
    throw new UsageError(`--${given[0]} applies to the batch-size sweep, not --no-batch-sweep`);
  }
  const batchModel = oneOf("batch-model", v["batch-model"] ?? "tiny", ["tiny", "main"]);
  return {
    model: v.model,
    kernelProfile: kernelProfileOption(v["kernel-profile"]),
    quantization: orUsageError(() => parseQuantization(v.quantization)),
    promptLen: int("prompt-len", v["prompt-len"], 1),
    gen: int("gen", v.gen, 2),
    batchModel,
    batchSizes: (v["batch-sizes"] ?? "1,2,4,8,16").split(",").map((s) => int("batch-sizes", s, 1)),
    batchRequests: int("batch-requests", v["batch-requests"] ?? "16", 1),
    batchGen: int("batch-gen", v["batch-gen"] ?? "32", 4),
    batchSweep: !v["no-batch-sweep"],
    json: v.json,
    outDir: v["out-dir"],
  };
}
