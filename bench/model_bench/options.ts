/**
 * Command-line options of `deno task bench:model` (bench/model_bench.ts): the usage text, the
 * parser, and the runner sizes the options imply.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { parseQuantizationChoice, type QuantizationChoice } from "../../gpu/quant.ts";
import type { MatmulVariant } from "../../kernels/matmul.ts";
import { reportUsage, UsageError } from "../bench_io.ts";
import { KERNEL_TUNING_MODES, type KernelTuningMode } from "../../engine/kernel_tuning.ts";
import { parseKvCacheDtype } from "../../cli/engine_flags.ts";
import type { KvCacheDtypeChoice } from "../../gpu/dtype.ts";

const USAGE = `usage: deno task bench:model [options]
  --model DIR                  checkpoint (default: the qwen3-0.6b preset, generated, bf16)
  --steps N                    decode steps per batch size (default 8)
  --batches LIST               decode batch sizes (default 1,8,32)
  --prefill LIST               prefill lengths (default 128,512; "" for none)
  --prefill-repeats N          time each prefill length N times after an untimed one of that
                               length, and print the median (default 1: one timed prefill, no
                               warm-up at that length)
  --no-breakdown               skip the per-kernel breakdown
  --breakdown-batches LIST     decode batch sizes of the breakdown (default 1,8)
  --breakdown-prefill LIST     prefill lengths of the breakdown (default the longest --prefill)
  --matmul-variant V           force one matmul kernel (tiled, gemv, blocked, unrolled); with
                               --quantization under the cpu profile only unrolled reads the
                               words (they are in a texture there)
  --force-f32                  f32 weights even with shader-f16
  --kernel-profile auto|cpu|gpu   kernel variants (default auto: from the adapter)
  --kernel-tuning auto|measure|off   gpu profile: the matmul tile and gemv/tiled choice per
                               shape, as the engine chooses them (default auto: cached, else
                               measured on a hardware adapter; engine/kernel_tuning.ts)
  --overlap auto|on|off|serial  decode steps overlapped with the host's encoding of the next
                               (default auto: as the engine runs them, on under the gpu profile);
                               serial awaits each step before encoding the next: the host's cost
                               with the device idle (on lavapipe the device's threads otherwise
                               share the host's cores)
  --readback-batch N           overlapped steps: deferred readbacks started together (default 3,
                               as the engine; 1 starts each at the next submit)
  --max-in-flight N            steps the runner keeps in flight (default 7, as the engine; a
                               readback batch takes at most this many)
  --fused-decode on|off        all-decode steps with RoPE, q/k norms and the K/V write inside
                               the decode attention (default on, as the engine), or
                               rope_and_cache's own dispatch per layer (off)
  --quantization LIST          weight formats to measure, one runner each, e.g. none,int8,int4
                               (default auto: none, or a GPTQ / AWQ / W4A16 checkpoint's own
                               format, as serve loads it); ratios to the first are printed
  --kv-cache-dtype auto|fp8     the KV cache in the weights' dtype (default auto, as serve) or
                               in fp8 (e4m3; fp8_e4m3 is the same), for every runner
  --rounds N                   measure the formats N times in turn, every runner loaded at
                               once, and print the median ratios (default 1): on a shared
                               machine the formats then see the same slow and fast spells
  --json                       print one JSON report`;

/** Tokens of the prompt every decode sequence holds in the KV cache. */
export const PROMPT = 128;
/** Tokens per KV block. */
export const BLOCK = 16;

/** The parsed command line. */
export interface ModelBenchOptions {
  /** Checkpoint directory; undefined: generate the qwen3-0.6b preset. */
  readonly model: string | undefined;
  readonly steps: number;
  readonly batches: readonly number[];
  readonly prefills: readonly number[];
  /** `--prefill-repeats`: timed prefills per length (more than 1: after an untimed one). */
  readonly prefillRepeats: number;
  /** Batch sizes of the per-kernel breakdown; empty with `--no-breakdown`. */
  readonly breakdownBatches: readonly number[];
  /** Prefill lengths of the per-kernel breakdown; empty with `--no-breakdown`. */
  readonly breakdownPrefills: readonly number[];
  /** `--matmul-variant`, as given (checked by the entry point). */
  readonly matmulVariant: string | undefined;
  readonly forceF32: boolean;
  readonly kernelProfile: string | undefined;
  readonly kernelTuning: KernelTuningMode;
  readonly quantizations: readonly QuantizationChoice[];
  /** `--kv-cache-dtype`: the runners' KV cache dtype. */
  readonly kvCacheDtype: KvCacheDtypeChoice;
  /** `--rounds`: how many times every format is measured, in turn. */
  readonly rounds: number;
  /** `--fused-decode`: the runner option of the same name. */
  readonly fusedDecode: boolean;
  /** `--overlap`: undefined for auto; "serial": each step awaited before the next. */
  readonly overlap: boolean | "serial" | undefined;
  /** `--readback-batch`: undefined for the engine's. */
  readonly readbackBatch: number | undefined;
  /** `--max-in-flight`: undefined for the runner's default. */
  readonly maxInFlight: number | undefined;
  readonly json: boolean;
}

const list = (text: string) => text.split(",").filter((s) => s !== "");

/**
 * The positive integers of a comma-separated flag (`--batches 1,8`).
 *
 * @throws {TypeError} naming the flag when an entry is not a positive integer, or when the list
 * is empty and `allowEmpty` is false.
 */
function positiveInts(flag: string, text: string, allowEmpty = false): number[] {
  const values = list(text).map(Number);
  const bad = list(text).find((_s, i) => !Number.isInteger(values[i]) || values[i]! < 1);
  if (bad !== undefined) {
    throw new TypeError(`--${flag} expects positive integers, got "${bad}"`);
  }
  if (values.length === 0 && !allowEmpty) {
    throw new TypeError(`--${flag} expects at least one positive integer`);
  }
  return values;
}

function parseFlags(argv: string[]) {
  try {
    const { values } = parseArgs({
      args: argv,
      options: {
        model: { type: "string" },
        steps: { type: "string", default: "8" },
        batches: { type: "string", default: "1,8,32" },
        prefill: { type: "string", default: "128,512" },
        "prefill-repeats": { type: "string", default: "1" },
        "no-breakdown": { type: "boolean", default: false },
        "breakdown-batches": { type: "string" },
        "breakdown-prefill": { type: "string" },
        "matmul-variant": { type: "string" },
        "force-f32": { type: "boolean", default: false },
        "kernel-profile": { type: "string" },
        "kernel-tuning": { type: "string", default: "auto" },
        quantization: { type: "string", default: "auto" },
        "kv-cache-dtype": { type: "string", default: "auto" },
        rounds: { type: "string", default: "1" },
        "fused-decode": { type: "string", default: "on" },
        overlap: { type: "string", default: "auto" },
        "readback-batch": { type: "string" },
        "max-in-flight": { type: "string" },
        json: { type: "boolean", default: false },
        help: { type: "boolean", default: false },
      },
    });
    if (values.help) throw new UsageError(USAGE);
    return values;
  } catch (error) {
    const usage = error instanceof UsageError
      ? error
      : new UsageError(error instanceof Error ? error.message : String(error));
    Deno.exit(reportUsage(usage, { log: console.log, err: console.error }, "bench:model"));
  }
}

/**
 * Parses the command line (see USAGE). Exits with the usage (0) for `--help`, one line (2) for
 * an unknown flag or a bad `--quantization`.
 */
export function parseModelBenchArgs(argv: string[]): ModelBenchOptions {
  const values = parseFlags(argv);
  let quantizations: QuantizationChoice[];
  let kvCacheDtype: KvCacheDtypeChoice;
  let sizes: {
    steps: number;
    batches: number[];
    prefills: number[];
    prefillRepeats: number;
    breakdown: number[];
    breakdownPrefills: number[];
    readbackBatch: number | undefined;
    maxInFlight: number | undefined;
    rounds: number;
  };
  try {
    quantizations = list(values.quantization).map(parseQuantizationChoice);
    kvCacheDtype = parseKvCacheDtype(values["kv-cache-dtype"]);
    sizes = {
      steps: positiveInts("steps", values.steps)[0]!,
      batches: positiveInts("batches", values.batches),
      prefills: positiveInts("prefill", values.prefill, true),
      prefillRepeats: positiveInts("prefill-repeats", values["prefill-repeats"])[0]!,
      breakdown: values["no-breakdown"]
        ? []
        : positiveInts("breakdown-batches", values["breakdown-batches"] ?? "1,8", true),
      breakdownPrefills: [],
      readbackBatch: values["readback-batch"] === undefined
        ? undefined
        : positiveInts("readback-batch", values["readback-batch"])[0],
      maxInFlight: values["max-in-flight"] === undefined
        ? undefined
        : positiveInts("max-in-flight", values["max-in-flight"])[0],
      rounds: positiveInts("rounds", values.rounds)[0]!,
    };
    if (!values["no-breakdown"]) {
      const longest = Math.max(0, ...sizes.prefills);
      sizes.breakdownPrefills = values["breakdown-prefill"] === undefined
        ? (longest > 0 ? [longest] : [])
        : positiveInts("breakdown-prefill", values["breakdown-prefill"], true);
    }
    // Flags that the others would make ignored are refused.
    if (
      values["no-breakdown"] &&
      (values["breakdown-batches"] !== undefined || values["breakdown-prefill"] !== undefined)
    ) {
      throw new TypeError("--breakdown-batches and --breakdown-prefill need the breakdown");
    }
    if (values["readback-batch"] !== undefined && ["off", "serial"].includes(values.overlap)) {
      throw new TypeError(
        `--readback-batch applies to overlapped steps, not --overlap ${values.overlap}`,
      );
    }
    if (!KERNEL_TUNING_MODES.some((m) => m === values["kernel-tuning"])) {
      throw new TypeError(
        `--kernel-tuning expects auto, measure or off, got "${values["kernel-tuning"]}"`,
      );
    }
    if (!["on", "off"].includes(values["fused-decode"])) {
      throw new TypeError(`--fused-decode expects on or off, got "${values["fused-decode"]}"`);
    }
    if (!["auto", "on", "off", "serial"].includes(values.overlap)) {
      throw new TypeError(`--overlap expects auto, on, off or serial, got "${values.overlap}"`);
    }
  } catch (error) {
    console.error(`error: ${error instanceof Error ? error.message : error}`);
    Deno.exit(2);
  }
  return {
    model: values.model,
    steps: sizes.steps,
    batches: sizes.batches,
    prefills: sizes.prefills,
    prefillRepeats: sizes.prefillRepeats,
    breakdownBatches: sizes.breakdown,
    breakdownPrefills: sizes.breakdownPrefills,
    matmulVariant: values["matmul-variant"],
    forceF32: values["force-f32"],
    kernelProfile: values["kernel-profile"],
    kernelTuning: values["kernel-tuning"] as KernelTuningMode,
    quantizations,
    kvCacheDtype,
    rounds: sizes.rounds,
    overlap: values.overlap === "auto"
      ? undefined
      : values.overlap === "serial"
      ? "serial"
      : values.overlap === "on",
    readbackBatch: sizes.readbackBatch,
    maxInFlight: sizes.maxInFlight,
    fusedDecode: values["fused-decode"] === "on",
    json: values.json,
  };
}

/** The matmul kernels `--matmul-variant` may force. */
export const MATMUL_VARIANTS: readonly MatmulVariant[] = ["tiled", "gemv", "blocked", "unrolled"];

/** The runner's sizes: every measured batch (breakdown included) and length fits. */
export function runnerSizes(o: ModelBenchOptions) {
  const maxSeqs = Math.max(1, ...o.batches, ...o.breakdownBatches);
  const maxModelLen = Math.max(PROMPT, ...o.prefills, ...o.breakdownPrefills) + o.steps + 16;
  const blocksPerSeq = Math.ceil(maxModelLen / BLOCK);
  return {
    maxTokens: Math.max(512, ...o.prefills, ...o.breakdownPrefills),
    maxSeqs,
    maxModelLen,
    blockSize: BLOCK,
    // Each sequence's own blocks, plus one sequence's worth for the warm-up prefill.
    numKvBlocks: blocksPerSeq * (maxSeqs + 1),
    blocksPerSeq,
  };
}
