/**
 * The engine flags shared by `serve`, `generate` and the benchmarks (vLLM's names), parsed with
 * `node:util` parseArgs into {@linkcode EngineOptions} (validated later by the engine's zod
 * schema), and the default model used when `--model` is not given.
 *
 * @module
 */

import { parseQuantization } from "../gpu/quant.ts";
import { parseKernelProfileChoice } from "../gpu/kernel_profile.ts";
import type { EngineOptions } from "../engine/engine_config.ts";
import { downloadToCache } from "../engine/model/hf_download.ts";
import { looksLikeHubId, resolveHubModel } from "../engine/model/hf_cache.ts";
import { makeModel } from "../tools/make_model.ts";

/**
 * Throws one line unless `dir` is a model directory: a directory holding `config.json` (the
 * same message from every command, before anything else reads it).
 *
 * @throws {TypeError} `"<dir> is not a model directory (...)"`.
 */
export async function checkModelDir(dir: string): Promise<void> {
  let why: string | null = null;
  try {
    if (!(await Deno.stat(dir)).isDirectory) why = "not a directory";
    else if (!(await Deno.stat(`${dir}/config.json`).catch(() => null))?.isFile) {
      why = "no config.json in it";
    }
  } catch (e) {
    why = e instanceof Deno.errors.NotFound ? "no such directory" : `cannot read it: ${e}`;
  }
  if (why !== null) {
    throw new TypeError(
      `${dir} is not a model directory (${why}); --model takes a Hugging Face checkpoint directory`,
    );
  }
}

/** parseArgs option specs of the engine flags. */
export const ENGINE_FLAGS = {
  model: { type: "string" },
  "served-model-name": { type: "string" },
  revision: { type: "string" },
  executor: { type: "string" },
  scheduler: { type: "string" },
  "max-num-seqs": { type: "string" },
  "max-num-batched-tokens": { type: "string" },
  "max-model-len": { type: "string" },
  "block-size": { type: "string" },
  "kv-cache-memory": { type: "string" },
  "num-kv-blocks": { type: "string" },
  "swap-space": { type: "string" },
  "preemption-mode": { type: "string" },
  "scheduling-policy": { type: "string" },
  "no-prefix-caching": { type: "boolean" },
  "no-chunked-prefill": { type: "boolean" },
  "kv-watermark": { type: "string" },
  "max-waiting-requests": { type: "string" },
  "max-batch-size": { type: "string" },
  "batch-wait-ms": { type: "string" },
  "force-f32": { type: "boolean" },
  "kernel-profile": { type: "string" },
  quantization: { type: "string" },
  "mock-base-ms": { type: "string" },
  "mock-per-token-ms": { type: "string" },
  "mock-fail-at-step": { type: "string" },
  "max-in-flight": { type: "string" },
  "grammar-compile-timeout-s": { type: "string" },
  "engine-seed": { type: "string" },
} as const;

/** Usage lines of the engine flags. */
export const ENGINE_FLAGS_USAGE = `engine flags:
  --model DIR|ORG/NAME           Hugging Face model directory, or hub id found in (or
                                 downloaded into) the Hugging Face cache ($HF_HUB_CACHE,
                                 $HF_HOME/hub or ~/.cache/huggingface/hub; HF_HUB_OFFLINE=1:
                                 cache only; HF_TOKEN, HF_ENDPOINT) (default: a tiny model)
  --revision REV                 branch, tag or commit of a hub id (default main)
  --served-model-name NAME       name clients use (default: the directory's name)
  --executor webgpu|mock         run the model, or fake step times (default webgpu)
  --scheduler continuous|static|dynamic   batching policy (default continuous)
  --max-num-seqs N               most running requests (default 64)
  --max-num-batched-tokens N     token budget per step (default 2048)
  --max-model-len N              longest prompt + output (default min(model, 4096))
  --block-size N                 tokens per KV block (default 16)
  --kv-cache-memory MIB          KV cache size (default 1024, capped per binding)
  --num-kv-blocks N              KV blocks, instead of --kv-cache-memory
  --swap-space MIB               host swap space for --preemption-mode swap (default 256 then)
  --preemption-mode recompute|swap
  --scheduling-policy fcfs|priority
  --no-prefix-caching            disable prefix caching
  --no-chunked-prefill           prefill prompts whole
  --kv-watermark F               share of KV blocks kept free when admitting (default 0.1)
  --max-waiting-requests N       queue bound; beyond it requests get 429 (default 1024)
  --max-batch-size N             batch size of the static / dynamic baselines
  --batch-wait-ms MS             wait window of the dynamic baseline (default 10)
  --force-f32                    f32 weights even when shader-f16 exists
  --kernel-profile auto|cpu|gpu  kernel variants (default auto: cpu on a software adapter, else gpu)
  --quantization none|int8|int4  store projections and the LM head as int8 / int4 with an f16
                                 scale per 32 weights, quantized while loading (default none)
  --mock-base-ms MS, --mock-per-token-ms MS   mock executor latency model
  --mock-fail-at-step N          mock executor: fail step N as a lost device would (testing)
  --max-in-flight N              engine steps in flight (default: executor maximum)
  --grammar-compile-timeout-s S  time limit of one grammar compile (structured outputs, tools);
                                 past it the request is a 400 (default 10)
  --engine-seed N                seed for requests without one`;

type FlagValues = { [K in keyof typeof ENGINE_FLAGS]?: string | boolean };

function num(flag: string, value: string | boolean | undefined): number | undefined {
  if (value === undefined || typeof value === "boolean") return undefined;
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n)) {
    throw new TypeError(`--${flag} expects a number, got "${value}"`);
  }
  return n;
}

function str(value: string | boolean | undefined): string | undefined {
  return typeof value === "string" ? value : undefined;
}

/** Engine options from parsed flag values (undefined flags are left out). */
export function engineOptionsFromFlags(v: FlagValues): EngineOptions {
  const o: Record<string, unknown> = {
    model: str(v.model),
    servedModelName: str(v["served-model-name"]),
    executor: str(v.executor),
    scheduler: str(v.scheduler),
    maxNumSeqs: num("max-num-seqs", v["max-num-seqs"]),
    maxNumBatchedTokens: num("max-num-batched-tokens", v["max-num-batched-tokens"]),
    maxModelLen: num("max-model-len", v["max-model-len"]),
    blockSize: num("block-size", v["block-size"]),
    kvCacheMemory: num("kv-cache-memory", v["kv-cache-memory"]),
    numKvBlocks: num("num-kv-blocks", v["num-kv-blocks"]),
    swapSpace: num("swap-space", v["swap-space"]),
    preemptionMode: str(v["preemption-mode"]),
    schedulingPolicy: str(v["scheduling-policy"]),
    enablePrefixCaching: v["no-prefix-caching"] === true ? false : undefined,
    enableChunkedPrefill: v["no-chunked-prefill"] === true ? false : undefined,
    kvWatermark: num("kv-watermark", v["kv-watermark"]),
    maxWaitingRequests: num("max-waiting-requests", v["max-waiting-requests"]),
    maxBatchSize: num("max-batch-size", v["max-batch-size"]),
    batchWaitMs: num("batch-wait-ms", v["batch-wait-ms"]),
    forceF32: v["force-f32"] === true ? true : undefined,
    kernelProfile: parseKernelProfileChoice(str(v["kernel-profile"])),
    quantization: v.quantization === undefined
      ? undefined
      : parseQuantization(str(v.quantization) ?? ""),
    mockBaseMs: num("mock-base-ms", v["mock-base-ms"]),
    mockPerTokenMs: num("mock-per-token-ms", v["mock-per-token-ms"]),
    mockFailAtStep: num("mock-fail-at-step", v["mock-fail-at-step"]),
    maxInFlight: num("max-in-flight", v["max-in-flight"]),
    grammarCompileTimeoutS: num("grammar-compile-timeout-s", v["grammar-compile-timeout-s"]),
    seed: num("engine-seed", v["engine-seed"]),
  };
  for (const k of Object.keys(o)) if (o[k] === undefined) delete o[k];
  // The zod schema in engine_config.ts validates names, ranges and enums.
  return o as EngineOptions;
}

/** Where the default tiny model lives (git-ignored). */
export const DEFAULT_MODEL_DIR = new URL("../.cache/models/tiny-qwen3", import.meta.url).pathname;

async function pathExists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

/** Whether `--model` names a hub model (`org/name` that is not a path here). */
export async function isHubModel(model: string): Promise<boolean> {
  return looksLikeHubId(model) && !(await pathExists(model));
}

/**
 * The name a server reports for `--model` (before `--served-model-name`): a hub id as given,
 * else the directory's base name.
 */
export async function defaultServedName(model: string, dir: string): Promise<string> {
  return (await isHubModel(model)) ? model : dir.replace(/\/+$/, "").split("/").pop()!;
}

/**
 * The model directory to use: `--model` when given (a checkpoint directory, or a hub id such as
 * `Qwen/Qwen3-0.6B` resolved in the Hugging Face cache at `revision`, downloaded into it when
 * absent and the network is allowed: engine/model/hf_cache.ts); otherwise the default tiny
 * model, created on first use. Says which on stderr.
 */
export async function resolveModelDir(
  model: string | undefined,
  revision?: string,
): Promise<string> {
  if (model !== undefined) {
    if (await isHubModel(model)) {
      const dir = await resolveHubModel(model, {
        ...(revision !== undefined ? { revision } : {}),
        download: (id, rev, cache) =>
          downloadToCache(id, rev, cache, { log: (l) => console.error(l) }),
      });
      console.error(`Using ${model} from the Hugging Face cache: ${dir}`);
      return dir;
    }
    if (revision !== undefined) throw new TypeError("--revision applies to a hub model id only");
    await checkModelDir(model);
    return model;
  }
  let exists = false;
  try {
    exists = (await Deno.stat(`${DEFAULT_MODEL_DIR}/config.json`)).isFile;
  } catch {
    exists = false;
  }
  if (!exists) {
    await makeModel({ out: DEFAULT_MODEL_DIR, preset: "tiny-qwen3", seed: 0 });
    console.error(
      `No --model given: created the default tiny model (tiny-qwen3, random weights) in ${DEFAULT_MODEL_DIR}`,
    );
  } else {
    console.error(
      `No --model given: using the default tiny model (tiny-qwen3, random weights) in ${DEFAULT_MODEL_DIR}`,
    );
  }
  return DEFAULT_MODEL_DIR;
}
