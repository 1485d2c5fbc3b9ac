/**
 * How many KV blocks the engine allocates (engine/engine_setup.ts), and what the start-up log
 * says about that choice: `numKvBlocks` when given; else `kvCacheMemory` MiB; else, where the
 * GPU's memory could be read (gpu/device_memory.ts), what is left of the engine's `utilization`
 * share of it once the model is loaded (vLLM's `--gpu-memory-utilization`: the share this engine
 * may use, whatever other processes use; engine/kv_cache_plan.ts checks that it is free); else
 * {@linkcode DEFAULT_KV_CACHE_MIB}. By memory, never more than `maxNumSeqs` requests of
 * `maxModelLen` tokens could ever hold, nor more than one binding per layer holds. When the
 * fixed default is what limits the cache, the log says how many tokens each of `maxNumSeqs`
 * requests gets before the scheduler must preempt, and which flag gives more. The log also says
 * when the cache holds fewer tokens than `maxModelLen` (longer requests are then refused,
 * scheduler/scheduler_api.ts); a memory size that holds no block is an error.
 *
 * @module
 */

/** "9,360" (the log's number format). */
const f = (n: number) => n.toLocaleString("en-US");

/**
 * The KV cache's size in MiB unless `kvCacheMemory` or `numKvBlocks` is given and the GPU's
 * memory cannot be read.
 */
export const DEFAULT_KV_CACHE_MIB = 1024;

/** The share of the GPU's memory the engine fills by default where it can be read (vLLM's). */
export const DEFAULT_GPU_MEMORY_UTILIZATION = 0.9;

/** The GPU's memory, the share of it the engine may use, and what its model took of it. */
export interface GpuMemoryShare {
  readonly totalMiB: number;
  /**
   * What loading the model added to the memory in use (weights, step buffers, kernels; read
   * before and after the load).
   */
  readonly modelMiB: number;
  /** Where the figures were read (gpu/device_memory.ts `DeviceMemory.source`). */
  readonly source: string;
  /** Share of `totalMiB` the engine may fill, KV cache included (`--gpu-memory-utilization`). */
  readonly utilization: number;
  /**
   * The share is the default's: {@linkcode DEFAULT_GPU_MEMORY_UTILIZATION} of the memory free at
   * start-up, not of the whole (engine/kv_cache_plan.ts).
   */
  readonly byDefault?: boolean;
}

/** What {@linkcode kvCacheBlocks} sizes the cache from. */
export interface KvCacheRequest {
  /** Blocks asked for (`--num-kv-blocks`). */
  readonly numKvBlocks?: number;
  /** MiB asked for (`--kv-cache-memory`). */
  readonly kvCacheMemory?: number;
  /**
   * The GPU's memory, read after loading (used when neither of the above is given), or why it
   * could not be read (the log's note on the default says so).
   */
  readonly gpuMemory?: GpuMemoryShare | { readonly unknown: string };
  /** Bytes of one block across all layers, K and V. */
  readonly blockBytes: number;
  /** Most blocks one binding per layer holds (engine/kv_cache.ts `maxBlocks`). */
  readonly limitBlocks: number;
  readonly blockSize: number;
  readonly maxNumSeqs: number;
  readonly maxModelLen: number;
}

/** The blocks to allocate and the log lines that explain a limit. */
export interface KvCacheSizing {
  readonly kvBlocks: number;
  readonly notes: readonly string[];
}

/**
 * The KV cache's blocks for `r` (see the module documentation).
 *
 * @throws {RangeError} when `kvCacheMemory`, or the GPU memory share, holds no block.
 */
export function kvCacheBlocks(r: KvCacheRequest): KvCacheSizing {
  const useful = r.maxNumSeqs * Math.ceil(r.maxModelLen / r.blockSize);
  const noFlags = r.numKvBlocks === undefined && r.kvCacheMemory === undefined;
  const gpu = noFlags && r.gpuMemory !== undefined && "totalMiB" in r.gpuMemory
    ? r.gpuMemory
    : null;
  const share = gpu !== null ? gpu.utilization * gpu.totalMiB : 0;
  const mib = r.kvCacheMemory ?? (gpu !== null ? share - gpu.modelMiB : DEFAULT_KV_CACHE_MIB);
  const byMemory = Math.max(0, Math.floor((mib * 2 ** 20) / r.blockBytes));
  const blockMiB = `${(r.blockBytes / 2 ** 20).toFixed(3)} MiB`;
  if (r.numKvBlocks === undefined && byMemory < 1) {
    throw new RangeError(
      gpu !== null
        ? `--gpu-memory-utilization ${gpu.utilization} leaves no room for the KV cache: the ` +
          `model took ${f(Math.round(gpu.modelMiB))} MiB of the ${f(Math.floor(share))} it ` +
          `allows of the GPU's ${f(gpu.totalMiB)} (${gpu.source}); one KV block of this model ` +
          `takes ${blockMiB}`
        : `--kv-cache-memory ${mib} MiB holds no KV block: one block of this model takes ` +
          blockMiB,
    );
  }
  const wanted = r.numKvBlocks ?? Math.min(byMemory, useful);
  const kvBlocks = Math.min(wanted, r.limitBlocks);
  const notes: string[] = [];
  if (gpu !== null) {
    const whole = Math.ceil((useful * r.blockBytes) / 2 ** 20);
    notes.push(
      `KV cache sized from the GPU's memory (${gpu.source}): ${gpu.utilization} of ` +
        `${f(gpu.totalMiB)} MiB (--gpu-memory-utilization${
          gpu.byDefault === true
            ? `, by default ${DEFAULT_GPU_MEMORY_UTILIZATION} of the memory free at start-up`
            : ""
        }) less the model's ` +
        `${f(Math.round(gpu.modelMiB))} MiB leaves ${f(Math.floor(mib))} MiB` +
        (byMemory > useful
          ? `; ${f(whole)} MiB of it hold all ${f(r.maxNumSeqs)} requests (--max-num-seqs) ` +
            `of ${f(r.maxModelLen)} tokens`
          : ""),
    );
  }
  if (kvBlocks < wanted) {
    notes.push(`KV cache capped at ${kvBlocks} blocks: one layer's K or V must fit one binding`);
  } else if (noFlags && gpu === null && byMemory < useful) {
    const perRequest = Math.floor((kvBlocks * r.blockSize) / r.maxNumSeqs);
    // The most that helps: every request whole, or what one binding per layer allows.
    const most = Math.min(useful, r.limitBlocks);
    const mostMiB = Math.ceil((most * r.blockBytes) / 2 ** 20);
    const held = most === useful
      ? `${f(r.maxNumSeqs)}`
      : `${
        f(Math.floor((most * r.blockSize) / r.maxModelLen))
      }, the most one binding per layer allows,`;
    const why = r.gpuMemory !== undefined && "unknown" in r.gpuMemory
      ? r.gpuMemory.unknown
      : "WebGPU cannot report it";
    notes.push(
      `KV cache limited by its ${f(DEFAULT_KV_CACHE_MIB)} MiB default (the GPU's memory is ` +
        `unknown: ${why}): ${f(r.maxNumSeqs)} running requests (--max-num-seqs) get ` +
        `${f(perRequest)} tokens each before the scheduler preempts; --kv-cache-memory MIB gives ` +
        `it more (${f(mostMiB)} holds ${held} of ${f(r.maxModelLen)} tokens)`,
    );
  }
  if (kvBlocks * r.blockSize < r.maxModelLen) {
    notes.push(
      `KV cache holds ${f(kvBlocks * r.blockSize)} tokens, fewer than max_model_len ` +
        `${f(r.maxModelLen)}: a request needing more is refused`,
    );
  }
  return { kvBlocks, notes };
}

/** The start-up log's lines on a cache of `blocks` blocks: its tokens and the concurrency they allow. */
export function kvCacheLines(blocks: number, blockSize: number, maxModelLen: number): string[] {
  const tokens = blocks * blockSize;
  return [
    `KV cache: ${f(blocks)} blocks x ${f(blockSize)} tokens = ${f(tokens)} tokens`,
    `Maximum concurrency for ${f(maxModelLen)} tokens per request: ${
      (tokens / maxModelLen).toFixed(2)
    }x`,
  ];
}
