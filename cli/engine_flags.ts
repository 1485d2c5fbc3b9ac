/**
 * The engine flags shared by `serve`, `generate` and the benchmarks (vLLM's names), parsed with
 * `node:util` parseArgs into {@linkcode EngineOptions} (validated later by the engine's zod
 * schema), and the default model used when `--model` is not given.
 *
 * @module
 */

import { ChatTemplate, ChatTemplateError } from "../engine/chat_template.ts";
import { parseQuantizationChoice } from "../gpu/quant.ts";
import type { KvCacheDtypeChoice } from "../gpu/dtype.ts";
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

/**
 * How a flag's value becomes its engine option: `string` and `number` as given (a number
 * checked here), `on` / `off` a boolean flag that sets true / false when given, `profile`,
 * `quantization`, `dtype` and `kvCacheDtype` parsed into their choices, `template` read as a
 * chat template ({@linkcode readChatTemplate}), `json` a JSON object.
 */
type FlagKind =
  | "string"
  | "number"
  | "on"
  | "off"
  | "profile"
  | "quantization"
  | "dtype"
  | "kvCacheDtype"
  | "template"
  | "json";

/**
 * Every engine flag, in the order values are read (the first bad one is reported): the engine
 * option it sets (null: read elsewhere) and how.
 */
const ENGINE_FLAG_OPTIONS = {
  model: ["model", "string"],
  "served-model-name": ["servedModelName", "string"],
  revision: [null, "string"],
  executor: ["executor", "string"],
  scheduler: ["scheduler", "string"],
  "max-num-seqs": ["maxNumSeqs", "number"],
  "max-num-batched-tokens": ["maxNumBatchedTokens", "number"],
  "max-model-len": ["maxModelLen", "number"],
  "block-size": ["blockSize", "number"],
  "kv-cache-memory": ["kvCacheMemory", "number"],
  "num-kv-blocks": ["numKvBlocks", "number"],
  "gpu-memory-utilization": ["gpuMemoryUtilization", "number"],
  "swap-space": ["swapSpace", "number"],
  "preemption-mode": ["preemptionMode", "string"],
  "scheduling-policy": ["schedulingPolicy", "string"],
  "no-prefix-caching": ["enablePrefixCaching", "off"],
  "no-chunked-prefill": ["enableChunkedPrefill", "off"],
  "kv-watermark": ["kvWatermark", "number"],
  "max-waiting-requests": ["maxWaitingRequests", "number"],
  "max-batch-size": ["maxBatchSize", "number"],
  "batch-wait-ms": ["batchWaitMs", "number"],
  "force-f32": ["forceF32", "on"],
  dtype: ["dtype", "dtype"],
  "kv-cache-dtype": ["kvCacheDtype", "kvCacheDtype"],
  "chat-template": ["chatTemplate", "template"],
  "generation-config": ["generationConfig", "string"],
  "override-generation-config": ["overrideGenerationConfig", "json"],
  "kernel-profile": ["kernelProfile", "profile"],
  "kernel-tuning": ["kernelTuning", "string"],
  quantization: ["quantization", "quantization"],
  "mock-base-ms": ["mockBaseMs", "number"],
  "mock-per-token-ms": ["mockPerTokenMs", "number"],
  "mock-fail-at-step": ["mockFailAtStep", "number"],
  "max-in-flight": ["maxInFlight", "number"],
  "grammar-compile-timeout-s": ["grammarCompileTimeoutS", "number"],
  "engine-seed": ["seed", "number"],
} as const satisfies Record<string, readonly [keyof EngineOptions | null, FlagKind]>;

type EngineFlag = keyof typeof ENGINE_FLAG_OPTIONS;

/** parseArgs option specs of the engine flags (`on` / `off` ones are booleans). */
export const ENGINE_FLAGS = Object.fromEntries(
  Object.entries(ENGINE_FLAG_OPTIONS).map((
    [flag, [, kind]],
  ) => [flag, { type: kind === "on" || kind === "off" ? "boolean" : "string" }]),
) as {
  readonly [F in EngineFlag]: {
    readonly type: (typeof ENGINE_FLAG_OPTIONS)[F][1] extends "on" | "off" ? "boolean"
      : "string";
  };
};

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
  --kv-cache-memory MIB          KV cache size (default: from --gpu-memory-utilization where
                                 the GPU's memory can be read, else 1024; capped per binding)
  --num-kv-blocks N              KV blocks, instead of --kv-cache-memory
  --gpu-memory-utilization F     share of the GPU's memory this engine may use, the KV cache
                                 taking what the model leaves; read with nvidia-smi on NVIDIA
                                 GPUs (default there: 0.9 of the memory free at start-up)
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
  --dtype auto|half|float16|float|float32   weights and KV cache on the device (default auto:
                                 float16 where the adapter has shader-f16, else float32;
                                 bfloat16 checkpoints load as float16: WGSL has no bfloat16)
  --kv-cache-dtype auto|fp8|fp8_e4m3   the KV cache in the weights' dtype (default auto), or
                                 in fp8 (e4m3, scale 1): one byte per element, twice the
                                 tokens of a float16 cache in the same memory
  --chat-template FILE|TEXT      chat template (Jinja) replacing the model's own: a file, or
                                 the template itself (\\n read as a newline), as vLLM reads it
  --generation-config auto|vllm|DIR   sampling defaults: the model's generation_config.json
                                 (default auto), none (vllm), or DIR's
  --override-generation-config JSON   defaults set over those, e.g. '{"temperature": 0.5}'
                                 (temperature, top_p, top_k, min_p, repetition_penalty,
                                 max_new_tokens: a limit on every request's output)
  --kernel-profile auto|cpu|gpu  kernel variants (default auto: cpu on a software adapter, else gpu)
  --kernel-tuning auto|measure|off   gpu profile: measure kernel choices on this adapter at
                                 start-up (matmul tile, gemv/tiled per shape, decode split,
                                 prefill attention), cached in ~/.cache/webgpu-llm (default
                                 auto: cached, else measured; defaults on a software adapter)
  --quantization auto|none|int8|int4   store projections and the LM head as int8 / int4
                                 with an f16 scale per 32 weights, quantized while loading
                                 (a GPTQ / AWQ / W4A16 checkpoint's codes kept where they
                                 fit); default auto: such a checkpoint's own format, int4 or
                                 int8, else none
  --mock-base-ms MS, --mock-per-token-ms MS   mock executor latency model
  --mock-fail-at-step N          mock executor: fail step N as a lost device would (testing)
  --max-in-flight N              engine steps in flight, 1 to 64 (default 7; the WebGPU runner's
                                 ring of sampled tokens is sized for them)
  --grammar-compile-timeout-s S  time limit of one grammar compile (structured outputs, tools);
                                 past it the request is a 400 (default 10)
  --engine-seed N                seed for requests without one`;

type FlagValues = { [K in EngineFlag]?: string | boolean };

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
  const o: Record<string, unknown> = {};
  for (const [flag, [option, kind]] of Object.entries(ENGINE_FLAG_OPTIONS)) {
    if (option === null) continue;
    const value = optionValue(flag, kind, v[flag as EngineFlag]);
    if (value !== undefined) o[option] = value;
  }
  // The zod schema in engine_config.ts validates names, ranges and enums.
  return o as EngineOptions;
}

/** The engine option value of `flag`'s `value` read as `kind` (undefined: not set). */
function optionValue(flag: string, kind: FlagKind, value: string | boolean | undefined): unknown {
  switch (kind) {
    case "string":
      return str(value);
    case "number":
      return num(flag, value);
    case "on":
      return value === true ? true : undefined;
    case "off":
      return value === true ? false : undefined;
    case "profile":
      return parseKernelProfileChoice(str(value));
    case "quantization":
      return value === undefined ? undefined : parseQuantizationChoice(str(value) ?? "");
    case "dtype":
      return value === undefined ? undefined : parseDtype(str(value) ?? "");
    case "kvCacheDtype":
      return value === undefined ? undefined : parseKvCacheDtype(str(value) ?? "");
    case "template":
      return value === undefined ? undefined : readChatTemplate(str(value) ?? "");
    case "json":
      return value === undefined ? undefined : jsonObject(flag, str(value) ?? "");
  }
}

/** `text` parsed as a JSON object (its fields are checked by the engine's schema). */
function jsonObject(flag: string, text: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    value = undefined;
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new TypeError(`--${flag} expects a JSON object, got '${text}'`);
  }
  return value as Record<string, unknown>;
}

/** `--dtype` values (vLLM's names) and the engine's dtype each means. */
const DTYPES: Readonly<Record<string, "auto" | "float16" | "float32">> = {
  auto: "auto",
  half: "float16",
  float16: "float16",
  float: "float32",
  float32: "float32",
};

/**
 * The engine dtype of a `--dtype` value.
 *
 * @throws {TypeError} for bfloat16 (WGSL has no such type) and unknown names.
 */
export function parseDtype(text: string): "auto" | "float16" | "float32" {
  const dtype = DTYPES[text];
  if (dtype !== undefined) return dtype;
  if (text === "bfloat16") {
    throw new TypeError(
      "--dtype bfloat16: WGSL has no bfloat16 type; bfloat16 checkpoints load as float16 (--dtype auto or float16) or float32",
    );
  }
  throw new TypeError(`--dtype expects one of ${Object.keys(DTYPES).join(", ")}, got "${text}"`);
}

/** `--kv-cache-dtype` values (vLLM's names) and the engine's KV dtype each means. */
const KV_CACHE_DTYPES: Readonly<Record<string, KvCacheDtypeChoice>> = {
  auto: "auto",
  fp8: "fp8_e4m3",
  fp8_e4m3: "fp8_e4m3",
};

/**
 * The engine KV cache dtype of a `--kv-cache-dtype` value.
 *
 * @throws {TypeError} for vLLM's other fp8 formats and unknown names.
 */
export function parseKvCacheDtype(text: string): KvCacheDtypeChoice {
  const dtype = KV_CACHE_DTYPES[text];
  if (dtype !== undefined) return dtype;
  if (text.startsWith("fp8_") || text === "bfloat16") {
    throw new TypeError(
      `--kv-cache-dtype ${text}: the fp8 KV cache is e4m3 (fp8 or fp8_e4m3); otherwise auto keeps the weights' dtype`,
    );
  }
  throw new TypeError(
    `--kv-cache-dtype expects one of ${Object.keys(KV_CACHE_DTYPES).join(", ")}, got "${text}"`,
  );
}

/** Characters that tell a template from a file name (vLLM's test). */
const TEMPLATE_CHARS = /[{}\n]/;

/**
 * The chat template `--chat-template` names, as vLLM reads it: the file's text where `value`
 * opens as a file; else `value` itself when it holds `{`, `}` or a newline, its escapes `\n`,
 * `\r`, `\t`, `\\`, `\"` and `\'` decoded (so a one-line shell argument can hold newlines). The
 * template must parse.
 *
 * @throws {TypeError} when `value` is neither a readable file nor a template, or does not parse.
 */
export function readChatTemplate(value: string): string {
  let source: string;
  try {
    source = Deno.readTextFileSync(value);
  } catch (e) {
    if (!TEMPLATE_CHARS.test(value)) {
      const why = e instanceof Deno.errors.NotFound ? "no such file" : String(e);
      throw new TypeError(
        `--chat-template: cannot read "${value}" (${why}); give a template file or the template itself`,
      );
    }
    source = value.replace(
      /\\([nrt\\"'])/g,
      (_, c: string) => c === "n" ? "\n" : c === "r" ? "\r" : c === "t" ? "\t" : c,
    );
  }
  try {
    new ChatTemplate(source);
  } catch (e) {
    if (e instanceof ChatTemplateError) throw new TypeError(`--chat-template: ${e.message}`);
    throw e;
  }
  return source;
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
    await createDefaultModel();
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

/**
 * Writes the default model (into `dir`, default {@linkcode DEFAULT_MODEL_DIR}) in a directory of
 * its own, then renames that into place: a process starting meanwhile (two servers, or parallel
 * tests, on first use) never reads a half-written checkpoint; when another process got there
 * first, its model stays and this one's copy is removed.
 */
export async function createDefaultModel(dir: string = DEFAULT_MODEL_DIR): Promise<void> {
  const parent = dir.slice(0, dir.lastIndexOf("/"));
  await Deno.mkdir(parent, { recursive: true });
  const tmp = await Deno.makeTempDir({ dir: parent, prefix: ".tiny-qwen3-" });
  try {
    await makeModel({ out: tmp, preset: "tiny-qwen3", seed: 0 });
    await Deno.rename(tmp, dir);
  } catch (e) {
    // Renaming onto a directory that is not empty fails: another process created it.
    let created = false;
    try {
      created = (await Deno.stat(`${dir}/config.json`)).isFile;
    } catch { /* not there */ }
    if (!created) throw e;
  } finally {
    await Deno.remove(tmp, { recursive: true }).catch(() => {});
  }
}
