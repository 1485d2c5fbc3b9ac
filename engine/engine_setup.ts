/**
 * How an `LLMEngine` is built: resolve the options, load the tokenizer and the model
 * (WebGPU executor) or set up the mock executor, size the KV cache (and the swap space), create
 * the scheduler, and log what was chosen. The result is the parts the engine's request loop
 * runs on; `LLMEngine.create` and `LLMEngine.createMock` (llm_engine.ts) wrap them.
 *
 * @module
 */

import type { WeightBytes } from "./model_runner.ts";
import { basename } from "node:path";
import { type EngineConfig, type EngineOptions, resolveEngineConfig } from "./engine_config.ts";
import type { CacheInfo, ModelInfo } from "./engine_api.ts";
import type { Executor } from "./executors/executor.ts";
import { MockExecutor } from "./executors/mock_executor.ts";
import { WebGpuExecutor } from "./executors/webgpu_executor.ts";
import { GpuContext } from "../gpu/context.ts";
import { type DeviceMemoryReader, readDeviceMemory } from "../gpu/device_memory.ts";
import { kvCacheLines } from "./kv_cache_size.ts";
import { kvCacheDtypeLine } from "./kv_cache.ts";
import { KvCachePlan } from "./kv_cache_plan.ts";
import { type Checkpoint, openCheckpoint } from "./model/checkpoint.ts";
import type { ModelConfig } from "./model/config.ts";
import {
  generationDefaultsLine,
  generationDefaultsOf,
  resolveGenerationConfig,
} from "./generation_defaults.ts";
import { ModelRunner } from "./model_runner.ts";
import { READBACK_BATCH } from "./step_pipeline.ts";
import { tuneRunner } from "./kernel_tuning.ts";
import { StructuredOutputs } from "./structured_output/structured_outputs.ts";
import { Tokenizer } from "./tokenizer.ts";
import { createScheduler } from "../scheduler/index.ts";
import type { Scheduler } from "../scheduler/scheduler_api.ts";
import type { SamplingParams } from "../scheduler/sampling_params.ts";

/** What the engine logs at start-up, one line each. */
export type Logger = (line: string) => void;

/** Everything an engine runs on, built by {@linkcode setupEngine} or {@linkcode setupMockEngine}. */
export interface EngineParts {
  /** The resolved options. */
  readonly config: EngineConfig;
  /** Static facts about the served model. */
  readonly model: ModelInfo;
  /** The model's tokenizer, or null (a mock without one: token ids only). */
  readonly tokenizer: Tokenizer | null;
  /** Sampling defaults from generation_config.json (requests override them). */
  readonly generationDefaults: Partial<SamplingParams>;
  readonly scheduler: Scheduler;
  readonly executor: Executor;
  /** The GPU context the engine owns and destroys at shutdown (null for the mock). */
  readonly ctx: GpuContext | null;
  /** KV blocks in the pool. */
  readonly kvBlocks: number;
  /** The model's end-of-sequence token ids (the scheduler's; grammars allow them at the end). */
  readonly eosTokenIds: readonly number[];
  /** Grammar matchers of constrained requests (the scheduler waits for their masks). */
  readonly structured: StructuredOutputs;
}

/**
 * Validates `options`, loads the model (WebGPU executor) or sets up the mock executor, sizes
 * the KV cache and logs what was chosen. On failure the GPU context created here is destroyed.
 * `readMemory` reads the GPU's memory (engine/kv_cache_plan.ts; default nvidia-smi's figures).
 */
export async function setupEngine(
  options: EngineOptions = {},
  log: Logger = () => {},
  readMemory: DeviceMemoryReader = readDeviceMemory,
): Promise<EngineParts> {
  const config = resolveEngineConfig(options);
  const tokenizer = config.model !== undefined
    ? await Tokenizer.fromDir(config.model, config.chatTemplate)
    : null;
  if (config.chatTemplate !== undefined) {
    log(`Chat template: the one given (--chat-template), not the model's own`);
  }
  const name = config.servedModelName ??
    (config.model !== undefined ? basename(config.model.replace(/\/+$/, "")) : "mock");
  if (config.executor === "mock") {
    return setupMockEngine({ ...config, servedModelName: name }, tokenizer, log);
  }
  const ctx = await GpuContext.create({
    forceF32: config.forceF32 || config.dtype === "float32",
    kernelProfile: config.kernelProfile,
  });
  try {
    const a = ctx.adapter;
    if (config.dtype === "float16" && ctx.weightDtype !== "f16") {
      throw new RangeError(
        `Cannot use dtype float16: ${a.description} lacks the shader-f16 feature (use auto or float32)`,
      );
    }
    log(
      `Adapter: ${a.description}${a.isFallback ? " (software fallback: no GPU found)" : ""}; ` +
        `weights ${ctx.weightDtype}; shader-f16 ${a.features.shaderF16 ? "yes" : "no"}; ` +
        `kernel profile ${ctx.profile} (${ctx.profileReason})`,
    );
    const ck = await openCheckpoint(config.model!);
    try {
      return await webGpuParts(config, name, tokenizer, ctx, ck, log, readMemory);
    } finally {
      ck.close();
    }
  } catch (error) {
    ctx.destroy();
    throw error;
  }
}

/** The parts of a WebGPU engine serving checkpoint `ck` as `name` on `ctx`. */
async function webGpuParts(
  config: EngineConfig,
  name: string,
  tokenizer: Tokenizer | null,
  ctx: GpuContext,
  ck: Checkpoint,
  log: Logger,
  readMemory: DeviceMemoryReader,
): Promise<EngineParts> {
  const mc = ck.config;
  const generation = await resolveGenerationConfig(
    config.generationConfig,
    ck.generationConfig,
    config.overrideGenerationConfig,
  );
  const maxModelLen = resolveMaxModelLen(config.maxModelLen, mc);
  const plan = await KvCachePlan.create(config, ctx, mc, maxModelLen, readMemory);
  const runner = await ModelRunner.fromCheckpoint(ctx, ck, {
    maxTokens: config.maxNumBatchedTokens,
    maxSeqs: config.maxNumSeqs,
    maxSamplerRows: samplerRowsWanted(config),
    maxModelLen,
    blockSize: config.blockSize,
    numKvBlocks: plan.numKvBlocks,
    ...(config.showProgress !== undefined ? { showProgress: config.showProgress } : {}),
    ...(config.maxInFlight !== undefined ? { maxInFlight: config.maxInFlight } : {}),
    quantization: config.quantization,
    kvCacheDtype: config.kvCacheDtype,
  });
  log(
    `Model: ${mc.arch}, ${mc.numLayers} layers, hidden ${mc.hiddenSize}, vocab ${mc.vocabSize}, ` +
      `weights ${ctx.weightDtype}`,
  );
  logWeights(log, runner.weights, ctx.weightDtype);
  const { kvBlocks, numSwapBlocks, notes } = plan.sized;
  for (const line of [...kvCacheLines(kvBlocks, config.blockSize, maxModelLen), ...notes]) {
    log(line);
  }
  log(kvCacheDtypeLine(runner.kv.shape));
  for (const line of await plan.memoryLines(runner.weights.device)) log(line);
  log(
    `Sampler: ${runner.samplerRows} rows per step (sampled tokens and prompt_logprobs positions), ` +
      `in sub-batches of the ${config.maxNumSeqs} logits rows`,
  );
  const readbackBatch = Math.min(READBACK_BATCH, runner.maxInFlight);
  log(
    `Steps in flight: up to ${runner.maxInFlight}` +
      (ctx.isCpuProfile
        ? ""
        : `, the host encoding the next while the GPU runs them (readbacks ${readbackBatch} at a time)`),
  );
  try {
    await tuneRunner(runner, config.kernelTuning, log);
  } catch (error) {
    runner.destroy();
    throw error;
  }
  log(generationDefaultsLine(generation));
  const gen = generation.config;
  const eos = [...new Set([...mc.eosTokenIds, ...generation.eosTokenIds])];
  const structured = new StructuredOutputs(tokenizer, mc.vocabSize, eos, {
    compileTimeoutS: config.grammarCompileTimeoutS,
  });
  return {
    config,
    model: {
      name,
      architecture: mc.arch,
      maxModelLen,
      vocabSize: mc.vocabSize,
      dtype: ctx.weightDtype,
      cache: cacheInfo(config, kvBlocks, numSwapBlocks),
    },
    tokenizer,
    generationDefaults: generationDefaultsOf(gen),
    scheduler: makeScheduler(config, kvBlocks, maxModelLen, eos, numSwapBlocks, structured, {
      samplerRows: runner.samplerRows,
    }),
    executor: new WebGpuExecutor(runner, {
      numSwapBlocks,
      seedSource: requestSeeds(config.seed),
      // Where the device has its own cores (the gpu profile), the host encodes a step while it
      // runs the queued ones; lavapipe's device is the host's own cores (no gain measured).
      overlapSteps: !ctx.isCpuProfile,
      readbackBatch,
    }),
    ctx,
    kvBlocks,
    eosTokenIds: eos,
    structured,
  };
}

/** Seeds for requests that bring none: splitmix32 from `seed`. */
function requestSeeds(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x9e3779b9) >>> 0;
    let z = state;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return (z ^ (z >>> 16)) >>> 0;
  };
}

/**
 * The parts of a mock-executor engine, built synchronously (no model is loaded; `tokenizer`
 * gives text output when present).
 */
export function setupMockEngine(
  options: EngineOptions = {},
  tokenizer: Tokenizer | null = null,
  log: Logger = () => {},
): EngineParts {
  const config = resolveEngineConfig({ ...options, executor: "mock" });
  const maxModelLen = config.maxModelLen ?? 4096;
  const kvBlocks = config.numKvBlocks ?? Math.ceil(16384 / config.blockSize);
  const executor = new MockExecutor({
    latency: { baseMs: config.mockBaseMs, perTokenMs: config.mockPerTokenMs },
    ...(config.maxInFlight !== undefined ? { maxInFlight: config.maxInFlight } : {}),
    ...(config.mockFailAtStep !== undefined ? { failAtStep: config.mockFailAtStep } : {}),
    blockingSubmit: config.mockBlockingSubmit,
  });
  log(
    `Mock executor: step = ${config.mockBaseMs} ms + ${config.mockPerTokenMs} ms per batched token`,
  );
  for (const line of kvCacheLines(kvBlocks, config.blockSize, maxModelLen)) log(line);
  // A bare mock accepts any token id below a nominal 32,000 (it never looks at them).
  const vocabSize = tokenizer?.size ?? 32000;
  const structured = new StructuredOutputs(tokenizer, vocabSize, [], {
    compileTimeoutS: config.grammarCompileTimeoutS,
  });
  return {
    config,
    model: {
      name: config.servedModelName ?? "mock",
      architecture: "mock",
      maxModelLen,
      vocabSize,
      dtype: "none",
      cache: cacheInfo(config, kvBlocks, 0),
    },
    tokenizer,
    generationDefaults: {},
    scheduler: makeScheduler(config, kvBlocks, maxModelLen, [], 0, structured),
    executor,
    ctx: null,
    kvBlocks,
    eosTokenIds: [],
    structured,
  };
}

/**
 * max_model_len for a model: the requested value (at most the model's max_position_embeddings
 * and its sliding window), or min(max_position_embeddings, 4096, sliding_window).
 *
 * @throws {RangeError} when the requested value exceeds the model's positions or its sliding
 *   window.
 */
export function resolveMaxModelLen(requested: number | undefined, model: ModelConfig): number {
  const window = model.slidingWindow ?? Infinity;
  const maxModelLen = requested ?? Math.min(model.maxPositionEmbeddings, 4096, window);
  if (maxModelLen > model.maxPositionEmbeddings) {
    throw new RangeError(
      `max_model_len ${maxModelLen} exceeds the model's max_position_embeddings ${model.maxPositionEmbeddings}`,
    );
  }
  if (maxModelLen > window) {
    throw new RangeError(
      `max_model_len ${maxModelLen} exceeds the model's sliding_window ${window}: attention over ` +
        `a sliding window is not supported; use --max-model-len ${window} or less`,
    );
  }
  return maxModelLen;
}

/**
 * Sampler rows a step of the WebGPU runner asks for: up to `SCORING_SUB_BATCHES` sub-batches of
 * `max_num_seqs` rows, no more than a step's tokens (a chunk of a prompt with
 * `prompt_logprobs` is scored in one step when it fits; engine/sampler.ts).
 */
function samplerRowsWanted(c: EngineConfig): number {
  return Math.max(
    c.maxNumSeqs,
    Math.min(c.maxNumBatchedTokens, SCORING_SUB_BATCHES * c.maxNumSeqs),
  );
}

/**
 * Most sub-batches of `max_num_seqs` logits rows one step's sampler runs (scored prompt
 * positions): at the defaults (64 sequences, 2,048 tokens) 512 rows per step, ~4 MiB of step
 * buffers for a hidden size of 1,024 (engine/step_buffers.ts).
 */
const SCORING_SUB_BATCHES = 8;

/** The KV cache's configuration as `/metrics` reports it. */
function cacheInfo(c: EngineConfig, numGpuBlocks: number, numCpuBlocks: number): CacheInfo {
  return {
    blockSize: c.blockSize,
    numGpuBlocks,
    numCpuBlocks,
    cacheDtype: c.kvCacheDtype,
    enablePrefixCaching: c.enablePrefixCaching,
  };
}

/** The scheduler `c.scheduler` names, sized for the KV cache and the model. */
function makeScheduler(
  c: EngineConfig,
  numGpuBlocks: number,
  maxModelLen: number,
  eosTokenIds: readonly number[],
  numSwapBlocks: number,
  structured: StructuredOutputs,
  runner: { readonly samplerRows?: number } = {},
): Scheduler {
  const common = {
    maxModelLen,
    blockSize: c.blockSize,
    numGpuBlocks,
    maxNumBatchedTokens: c.maxNumBatchedTokens,
    eosTokenIds,
    hostReady: (requestId: string) => structured.ready(requestId),
    // The runner's rows per step (sampled tokens and scored prompt positions); by default the
    // schedulers' own bound (max_num_seqs, or the batch size).
    ...(runner.samplerRows === undefined ? {} : { maxSamplerRows: runner.samplerRows }),
  };
  if (c.scheduler === "continuous") {
    return createScheduler({
      kind: "continuous",
      ...common,
      maxNumSeqs: c.maxNumSeqs,
      numSwapBlocks,
      enableChunkedPrefill: c.enableChunkedPrefill,
      enablePrefixCaching: c.enablePrefixCaching,
      policy: c.schedulingPolicy,
      preemptionMode: c.preemptionMode,
      watermark: c.kvWatermark,
    });
  }
  // Baselines reserve max_model_len tokens per batch member, contiguously.
  const fits = Math.floor((numGpuBlocks * c.blockSize) / maxModelLen);
  const batch = Math.max(1, Math.min(c.maxBatchSize ?? c.maxNumSeqs, c.maxNumSeqs, fits));
  return c.scheduler === "static"
    ? createScheduler({ kind: "static", ...common, batchSize: batch })
    : createScheduler({
      kind: "dynamic",
      ...common,
      maxBatchSize: batch,
      batchWaitMs: c.batchWaitMs,
    });
}

/** One line with the weights' device bytes (and, quantized, the unquantized bytes and ratio). */
function logWeights(log: (line: string) => void, weights: WeightBytes, dtype: string): void {
  const quantization = weights.quantization;
  const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
  if (quantization === "none") {
    log(`Weights on the device: ${mib(weights.device)} (${dtype})`);
  } else {
    log(
      `Weights on the device: ${mib(weights.device)} with ${quantization} projections ` +
        `(${mib(weights.unquantized)} in ${dtype}: ${
          (weights.device / weights.unquantized).toFixed(3)
        }x)`,
    );
  }
  for (const note of weights.notes) log(`  ${note}`);
}
