/**
 * How a WebGPU engine sizes its KV cache (engine/engine_setup.ts): from `--num-kv-blocks` or
 * `--kv-cache-memory` before the model loads; otherwise, where the GPU's memory can be read
 * (gpu/device_memory.ts), from what the engine's `--gpu-memory-utilization` share of it leaves
 * once the weights and step buffers are on the device (the model runner asks between loading its
 * weights and allocating the cache: engine/models/bind_targets.ts); otherwise the fixed default.
 *
 * As vLLM's, the share is what this engine may use, whatever other processes use: the memory in
 * use is read before the load and after it, the difference is the model's, and a share given
 * must be free at start-up (several engines on one GPU, e.g. `main.ts cluster`'s replicas, each
 * take their own share; started together, each may count another's load as its own, which only
 * makes its cache smaller). Unlike vLLM's, the default is 0.9 of the memory free at start-up
 * rather than of the whole, so a GPU that a desktop or another process uses still serves. The arithmetic and the log's notes are engine/kv_cache_size.ts's; the swap
 * space is sized here too.
 *
 * @module
 */

import type { DeviceMemory, DeviceMemoryReader } from "../gpu/device_memory.ts";
import type { GpuContext } from "../gpu/context.ts";
import type { EngineConfig } from "./engine_config.ts";
import { blockBytes, type KvCacheShape, maxBlocks } from "./kv_cache.ts";
import {
  DEFAULT_GPU_MEMORY_UTILIZATION,
  type GpuMemoryShare,
  kvCacheBlocks,
} from "./kv_cache_size.ts";
import type { ModelConfig } from "./model/config.ts";
import { kvCacheShape } from "./models/bind_targets.ts";

/** The KV cache's blocks, the host's swap blocks, and the log's notes on the choice. */
export interface KvCacheSized {
  readonly kvBlocks: number;
  readonly numSwapBlocks: number;
  readonly notes: readonly string[];
}

const f = (n: number) => n.toLocaleString("en-US");

/** One model's KV sizing on one adapter: {@linkcode KvCachePlan.create}. */
export class KvCachePlan {
  #sized: KvCacheSized | null = null;
  /** The memory read once the model was loaded, when the cache was sized from it. */
  #loaded: DeviceMemory | null = null;

  private constructor(
    private readonly config: EngineConfig,
    private readonly ctx: GpuContext,
    private readonly shape: KvCacheShape,
    private readonly maxModelLen: number,
    private readonly readMemory: DeviceMemoryReader,
    /** The memory as read before loading (null: not read, or unknown; then sized already). */
    private readonly before: DeviceMemory | null,
    /** The engine's share of the GPU's memory (`--gpu-memory-utilization` or the default's). */
    private readonly utilization: number,
  ) {}

  /**
   * The plan for model `mc` on `ctx`. Reads the GPU's memory when no flag sizes the cache.
   *
   * @throws {RangeError} when `gpuMemoryUtilization` is given but the memory cannot be read, its
   *   share of the memory is not free, or a flag's size holds no block. Not given, the share is
   *   0.9 of the memory free now, so that a GPU that other processes use still serves.
   */
  static async create(
    config: EngineConfig,
    ctx: GpuContext,
    mc: ModelConfig,
    maxModelLen: number,
    readMemory: DeviceMemoryReader,
  ): Promise<KvCachePlan> {
    const shape = kvCacheShape(ctx, mc, config.blockSize, config.kvCacheDtype);
    const byFlags = config.numKvBlocks !== undefined || config.kvCacheMemory !== undefined;
    const before = byFlags ? null : await readMemory(ctx.adapter);
    if (before !== null && "unknown" in before && config.gpuMemoryUtilization !== undefined) {
      throw new RangeError(
        `Cannot apply --gpu-memory-utilization: the GPU's memory is unknown (${before.unknown}); ` +
          "give --kv-cache-memory MIB instead",
      );
    }
    // The share: as given (and free now), or 0.9 of what is free now (rounded down to 0.001).
    let utilization = config.gpuMemoryUtilization ?? DEFAULT_GPU_MEMORY_UTILIZATION;
    if (before !== null && "memory" in before) {
      const { totalMiB, usedMiB, source } = before.memory;
      const free = Math.max(0, totalMiB - usedMiB);
      if (config.gpuMemoryUtilization === undefined) {
        utilization = Math.floor((1000 * DEFAULT_GPU_MEMORY_UTILIZATION * free) / totalMiB) / 1000;
      } else if (free < utilization * totalMiB) {
        throw new RangeError(
          `Cannot use ${utilization} of the GPU's memory (--gpu-memory-utilization): ${
            f(Math.floor(utilization * totalMiB))
          } of ${f(totalMiB)} MiB, but ${f(usedMiB)} MiB are in use (${source}); give a lower ` +
            "share or --kv-cache-memory MIB",
        );
      }
    }
    const plan = new KvCachePlan(
      config,
      ctx,
      shape,
      maxModelLen,
      readMemory,
      before !== null && "memory" in before ? before.memory : null,
      utilization,
    );
    // Sized now unless by memory (a size that holds no block fails before the load).
    if (before === null || "unknown" in before) plan.#size(before ?? undefined);
    return plan;
  }

  /**
   * The model runner's `numKvBlocks`: the blocks, or (sized by the GPU's memory) a function
   * that reads the memory once the weights are loaded and sizes the cache from it.
   */
  get numKvBlocks(): number | (() => Promise<number>) {
    // Sized before the load unless the memory was read then (see create).
    const before = this.before;
    if (this.#sized !== null || before === null) return this.sized.kvBlocks;
    return async () => {
      // Uploads finished, so their staging memory is not counted as in use.
      await this.ctx.device.queue.onSubmittedWorkDone();
      const now = await this.readMemory(this.ctx.adapter);
      if ("unknown" in now) {
        throw new Error(
          `Cannot size the KV cache: the GPU's memory was read before loading, not after (${now.unknown})`,
        );
      }
      this.#loaded = now.memory;
      return this.#size({
        totalMiB: now.memory.totalMiB,
        modelMiB: Math.max(0, now.memory.usedMiB - before.usedMiB),
        source: now.memory.source,
        utilization: this.utilization,
        byDefault: this.config.gpuMemoryUtilization === undefined,
      }).kvBlocks;
    };
  }

  /**
   * The sizing, once done (before the load, or when the runner asked).
   *
   * @throws {Error} when asked before the runner allocated a cache sized by memory.
   */
  get sized(): KvCacheSized {
    if (this.#sized === null) throw new Error("The KV cache is sized once the model is loaded");
    return this.#sized;
  }

  /**
   * The log's lines on the GPU's memory in use before the load and now (with the KV cache), or
   * none where it is not read, and {@linkcode residencyWarnings} where the cache was sized from
   * it: whether the weights (`weightBytes`) and the cache landed on the GPU.
   */
  async memoryLines(weightBytes: number): Promise<string[]> {
    if (this.before === null) return [];
    await this.ctx.device.queue.onSubmittedWorkDone();
    const now = await this.readMemory(this.ctx.adapter);
    if (!("memory" in now)) return [`GPU memory: no longer read (${now.unknown})`];
    const m = now.memory;
    const before = this.before;
    return [
      `GPU memory in use: ${f(before.usedMiB)} MiB before loading, ` +
      `${f(m.usedMiB)} of ${f(m.totalMiB)} MiB with the model and KV cache (${m.source})`,
      ...(this.#loaded !== null && this.#sized !== null
        ? residencyWarnings({
          weightsMiB: weightBytes / 2 ** 20,
          cacheMiB: (this.#sized.kvBlocks * blockBytes(this.shape)) / 2 ** 20,
          beforeMiB: before.usedMiB,
          loadedMiB: this.#loaded.usedMiB,
          nowMiB: m.usedMiB,
        })
        : []),
    ];
  }

  #size(gpuMemory: GpuMemoryShare | { readonly unknown: string } | undefined): KvCacheSized {
    const c = this.config;
    const perBlock = blockBytes(this.shape);
    const { kvBlocks, notes } = kvCacheBlocks({
      ...(c.numKvBlocks === undefined ? {} : { numKvBlocks: c.numKvBlocks }),
      ...(c.kvCacheMemory === undefined ? {} : { kvCacheMemory: c.kvCacheMemory }),
      ...(gpuMemory === undefined ? {} : { gpuMemory }),
      blockBytes: perBlock,
      limitBlocks: maxBlocks(this.ctx, this.shape),
      blockSize: c.blockSize,
      maxNumSeqs: c.maxNumSeqs,
      maxModelLen: this.maxModelLen,
    });
    const swapMiB = c.swapSpace ?? (c.preemptionMode === "swap" ? 256 : 0);
    this.#sized = {
      kvBlocks,
      numSwapBlocks: Math.floor((swapMiB * 2 ** 20) / perBlock),
      notes,
    };
    return this.#sized;
  }
}

/** MiB of an allocation that may go unaccounted for before a warning (the allocator's chunks). */
const RESIDENCY_SLACK_MIB = 64;

/**
 * Warnings that the weights or the KV cache may lie in host memory: wgpu's Vulkan allocator
 * turns to it when the GPU's is full (see gpu/device_memory.ts), silently, and the kernels then
 * read them over the bus. Each is warned of when the GPU's memory in use (read before the load,
 * once loaded, and with the cache) rose by less than half its size, and by at least
 * {@linkcode RESIDENCY_SLACK_MIB} less than its size (small buffers may fit chunks already held).
 */
export function residencyWarnings(m: {
  readonly weightsMiB: number;
  readonly cacheMiB: number;
  readonly beforeMiB: number;
  readonly loadedMiB: number;
  readonly nowMiB: number;
}): string[] {
  const short = (size: number, rise: number) =>
    rise < size / 2 && size - rise >= RESIDENCY_SLACK_MIB;
  const lines: string[] = [];
  const weightsRise = m.loadedMiB - m.beforeMiB;
  if (short(m.weightsMiB, weightsRise)) {
    lines.push(
      `Warning: the model's ${f(Math.round(m.weightsMiB))} MiB of weights raised the GPU's ` +
        `memory in use by ${f(Math.round(weightsRise))} MiB: part of them may lie in host memory ` +
        "(wgpu's allocator turns to it when the GPU's is full), where every step reads them " +
        "slowly; the model may not fit this GPU",
    );
  }
  const cacheRise = m.nowMiB - m.loadedMiB;
  if (short(m.cacheMiB, cacheRise)) {
    lines.push(
      `Warning: the KV cache's ${f(Math.round(m.cacheMiB))} MiB raised the GPU's memory in use ` +
        `by ${f(Math.round(cacheRise))} MiB: part of it may lie in host memory (wgpu's allocator ` +
        "turns to it when the GPU's is full), where attention reads it slowly; a lower " +
        "--gpu-memory-utilization or --kv-cache-memory keeps it on the GPU",
    );
  }
  return lines;
}
