/**
 * Engine options: an all-optional type at the edge (CLI flags, server options, tests),
 * validated once with zod and resolved into a readonly config. Sizes that depend on the model
 * and the device (KV blocks, max_model_len) are resolved when the engine starts.
 *
 * @module
 */

import { z } from "zod";
import { KERNEL_TUNING_MODES } from "./kernel_tuning.ts";
import { generationOverrideSchema } from "./model/generation_config.ts";

const positiveInt = z.number().int().positive();

/**
 * Default share of the KV pool kept free when admitting new requests (continuous scheduler).
 * Measured with `deno task bench:batching [--preemption-mode swap]` (mock executor, default
 * calibrated latency model with the per-sequence and attended-pair terms, 2026-11-22), continuous
 * vs static output tokens/s (preemptions) for watermarks 0 / 0.05 / 0.1 / 0.2: recompute 2.00x
 * (292) / 2.12x (153) / 2.14x (108) / 2.15x (61); swap 2.26x (306) / 2.30x (121) / 2.26x (81) /
 * 2.24x (54). 0.1 is within 2% of the best in both modes.
 */
export const DEFAULT_KV_WATERMARK = 0.1;

/** Default time limit of one grammar compile, in seconds (structured outputs, tools). */
export const DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S = 10;

/** The schema of {@linkcode EngineOptions}. */
export const engineOptionsSchema = z.object({
  /** Model directory (Hugging Face layout); required for the WebGPU executor. */
  model: z.string().min(1).optional(),
  /** Name clients use in requests; default the model directory's base name. */
  servedModelName: z.string().min(1).optional(),
  /** "webgpu" runs the model; "mock" fakes step times with a latency model. */
  executor: z.enum(["webgpu", "mock"]).default("webgpu"),
  /** "continuous" (default), or the static / dynamic batching baselines. */
  scheduler: z.enum(["continuous", "static", "dynamic"]).default("continuous"),
  /** Most requests running at once (and most sequences in one step). */
  maxNumSeqs: positiveInt.default(64),
  /** Token budget of one step. */
  maxNumBatchedTokens: positiveInt.default(2048),
  /** Longest sequence (prompt + output); default min(model's max positions, 4096). */
  maxModelLen: positiveInt.optional(),
  /** Tokens per KV block. */
  blockSize: positiveInt.default(16),
  /**
   * KV cache size in MiB (default: sized from the GPU's memory where it can be read, see
   * gpuMemoryUtilization, else 1024; capped so each layer's buffer fits one binding).
   */
  kvCacheMemory: z.number().positive().optional(),
  /**
   * Share of the GPU's memory the engine may fill, KV cache included, where the memory can be
   * read (NVIDIA, gpu/device_memory.ts); default 0.9 of the memory free at start-up
   * (engine/kv_cache_plan.ts).
   */
  gpuMemoryUtilization: z.number().gt(0).max(1).optional(),
  /** KV blocks, instead of kvCacheMemory. */
  numKvBlocks: positiveInt.optional(),
  /** Host swap space in MiB for preemption by swap (default 256 with swap mode, else 0). */
  swapSpace: z.number().nonnegative().optional(),
  preemptionMode: z.enum(["recompute", "swap"]).default("recompute"),
  schedulingPolicy: z.enum(["fcfs", "priority"]).default("fcfs"),
  enablePrefixCaching: z.boolean().default(true),
  enableChunkedPrefill: z.boolean().default(true),
  /** Share of KV blocks kept free when admitting new requests (headroom to grow). */
  kvWatermark: z.number().min(0).max(0.9).default(DEFAULT_KV_WATERMARK),
  /** Waiting requests beyond which new ones are refused (HTTP 429). */
  maxWaitingRequests: positiveInt.default(1024),
  /** Batch size of the static / dynamic baselines (default: max_num_seqs, capped by KV). */
  maxBatchSize: positiveInt.optional(),
  /** Wait window of the dynamic baseline. */
  batchWaitMs: z.number().nonnegative().default(10),
  /** f32 weights and KV even with shader-f16. */
  forceF32: z.boolean().default(false),
  /**
   * Weights and KV cache dtype on the device (vLLM's `--dtype`): `auto` f16 where the adapter
   * has `shader-f16`, else f32; `float16` f16 or an error where it lacks `shader-f16`; `float32`
   * f32 (as forceF32).
   */
  dtype: z.enum(["auto", "float16", "float32"]).default("auto"),
  /**
   * The KV cache's element type (vLLM's `--kv-cache-dtype`): `auto` the weights' dtype,
   * `fp8_e4m3` one byte per element (float8_e4m3fn, scale 1; kernels/kv_codec.ts).
   */
  kvCacheDtype: z.enum(["auto", "fp8_e4m3"]).default("auto"),
  /**
   * A chat template (Jinja source) replacing the model's own (tokenizer_config.json's
   * `chat_template`, chat_template.jinja); vLLM's `--chat-template`.
   */
  chatTemplate: z.string().min(1).optional(),
  /**
   * Where the sampling defaults come from (vLLM's `--generation-config`): `auto` the model's
   * generation_config.json, `vllm` none (its EOS ids still stop generation), else a directory
   * holding a generation_config.json (engine/generation_defaults.ts).
   */
  generationConfig: z.string().min(1).default("auto"),
  /**
   * Sampling defaults set over those (vLLM's `--override-generation-config`): `temperature`,
   * `top_p`, `top_k`, `min_p`, `repetition_penalty`, `max_new_tokens`.
   */
  overrideGenerationConfig: generationOverrideSchema.optional(),
  /** Kernel variants: `auto` (from the adapter), `cpu` or `gpu` (gpu/kernel_profile.ts). */
  kernelProfile: z.enum(["auto", "cpu", "gpu"]).default("auto"),
  /** Matmul tile and gemv/tiled choices: cached or measured, measured now, or the defaults. */
  kernelTuning: z.enum(KERNEL_TUNING_MODES).default("auto"),
  /**
   * Weights of the projections and LM head: as loaded, or int8 / int4 (gpu/quant.ts); `auto`: a
   * packed-integer checkpoint's own format, else as loaded.
   */
  quantization: z.enum(["auto", "none", "int8", "int4"]).default("auto"),
  /** Mock executor latency model: base ms per step. */
  mockBaseMs: z.number().nonnegative().default(8),
  /** Mock executor latency model: ms per batched token. */
  mockPerTokenMs: z.number().nonnegative().default(0.05),
  /** Mock executor fault injection: the n-th step fails as if the device were lost. */
  mockFailAtStep: positiveInt.optional(),
  /** Mock executor: do each step's work inside submit, as lavapipe does (testing). */
  mockBlockingSubmit: z.boolean().default(false),
  /** Time limit of one grammar compile (structured outputs, tools), seconds; past it a 400. */
  grammarCompileTimeoutS: z.number().positive().default(DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S),
  /**
   * Steps in flight at once (default 7 with WebGPU, its runner's sampled-token ring sized for
   * them; 4 mocked). At most 64: each holds a ring slot of sampled tokens and logprobs.
   */
  maxInFlight: positiveInt.max(64).optional(),
  /** Seed of the engine's generator (seeds of requests that give none). */
  seed: z.number().int().nonnegative().default(0),
  /** Draw a weight-loading progress bar (default: when stderr is a terminal). */
  showProgress: z.boolean().optional(),
}).strict();

/** All-optional engine options (see {@linkcode engineOptionsSchema} for meanings). */
export type EngineOptions = z.input<typeof engineOptionsSchema>;

/** Validated options with defaults applied. */
export type EngineConfig = Readonly<z.output<typeof engineOptionsSchema>>;

/**
 * Validates `options` and applies defaults.
 *
 * @throws {RangeError} naming the first invalid option.
 */
export function resolveEngineConfig(options: EngineOptions = {}): EngineConfig {
  const parsed = engineOptionsSchema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const name = issue.path.join(".") || "options";
    throw new RangeError(`Invalid engine option ${name}: ${issue.message}`);
  }
  const c = parsed.data;
  if (c.executor === "webgpu" && c.model === undefined) {
    throw new RangeError(
      "Invalid engine option model: the webgpu executor needs a model directory",
    );
  }
  if (c.kvCacheMemory !== undefined && c.numKvBlocks !== undefined) {
    throw new RangeError("Invalid engine options: give kvCacheMemory or numKvBlocks, not both");
  }
  if (
    c.gpuMemoryUtilization !== undefined &&
    (c.kvCacheMemory !== undefined || c.numKvBlocks !== undefined)
  ) {
    throw new RangeError(
      "Invalid engine options: gpuMemoryUtilization sizes the KV cache as kvCacheMemory and " +
        "numKvBlocks do: give one of them",
    );
  }
  if (c.dtype === "float16" && c.forceF32) {
    throw new RangeError("Invalid engine options: dtype float16 contradicts forceF32");
  }
  checkApplicable(options, c);
  return Object.freeze(c);
}

/**
 * Options that only one executor, scheduler or preemption mode reads, each with where it
 * applies: given elsewhere they would be silently ignored, so they are refused.
 */
const APPLIES_TO: readonly {
  readonly options: readonly (keyof EngineOptions)[];
  readonly where: string;
  readonly applies: (c: EngineConfig) => boolean;
  readonly otherwise: (c: EngineConfig) => string;
}[] = [
  {
    options: [
      "quantization",
      "kernelProfile",
      "kernelTuning",
      "forceF32",
      "dtype",
      "kvCacheDtype",
      "gpuMemoryUtilization",
      "generationConfig",
      "overrideGenerationConfig",
    ],
    where: "the webgpu executor",
    applies: (c) => c.executor === "webgpu",
    otherwise: (c) => `executor ${c.executor}`,
  },
  {
    options: ["mockBaseMs", "mockPerTokenMs", "mockFailAtStep", "mockBlockingSubmit"],
    where: "the mock executor",
    applies: (c) => c.executor === "mock",
    otherwise: (c) => `executor ${c.executor}`,
  },
  {
    options: ["maxBatchSize"],
    where: "the static and dynamic schedulers",
    applies: (c) => c.scheduler !== "continuous",
    otherwise: (c) => `scheduler ${c.scheduler}`,
  },
  {
    options: ["batchWaitMs"],
    where: "the dynamic scheduler",
    applies: (c) => c.scheduler === "dynamic",
    otherwise: (c) => `scheduler ${c.scheduler}`,
  },
  {
    options: ["chatTemplate"],
    where: "a model's tokenizer",
    applies: (c) => c.model !== undefined,
    otherwise: () => "an engine without a model",
  },
  {
    options: ["swapSpace"],
    where: "preemption mode swap",
    applies: (c) => c.preemptionMode === "swap",
    otherwise: (c) => `preemption mode ${c.preemptionMode}`,
  },
];

/** The defaults, to tell an option set to a value of its own from one left as it is. */
const DEFAULTS: EngineConfig = engineOptionsSchema.parse({});

/**
 * Throws naming the first option of `options` that the resolved config `c` would ignore: one
 * set, to anything but its default (a resolved config passes again, as the mock set-up does).
 */
function checkApplicable(options: EngineOptions, c: EngineConfig): void {
  for (const rule of APPLIES_TO) {
    if (rule.applies(c)) continue;
    const given = rule.options.find((k) => options[k] !== undefined && options[k] !== DEFAULTS[k]);
    if (given !== undefined) {
      throw new RangeError(
        `Invalid engine option ${given}: it applies to ${rule.where}, not ${rule.otherwise(c)}`,
      );
    }
  }
}
