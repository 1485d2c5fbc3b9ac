/**
 * How many KV blocks the engine allocates (engine/engine_setup.ts), and what the start-up log
 * says about that choice: `numKvBlocks` when given; else `kvCacheMemory` MiB (default
 * {@linkcode DEFAULT_KV_CACHE_MIB}), but no more than `maxNumSeqs` requests of `maxModelLen`
 * tokens could ever hold; never more than one binding per layer holds. WebGPU cannot report how
 * much memory a GPU has, so the default is a fixed size, not a share of the GPU's memory as
 * vLLM's `--gpu-memory-utilization`: when it is what limits the cache, the log says how many
 * tokens each of `maxNumSeqs` requests gets before the scheduler must preempt, and which flag
 * gives more. The log also says when the cache holds fewer tokens than `maxModelLen` (longer
 * requests are then refused, scheduler/scheduler_api.ts); a memory size that holds no block is
 * an error.
 *
 * @module
 */

/** "9,360" (the log's number format). */
const f = (n: number) => n.toLocaleString("en-US");

/** The KV cache's size in MiB unless `kvCacheMemory` or `numKvBlocks` is given. */
export const DEFAULT_KV_CACHE_MIB = 1024;

/** What {@linkcode kvCacheBlocks} sizes the cache from. */
export interface KvCacheRequest {
  /** Blocks asked for (`--num-kv-blocks`). */
  readonly numKvBlocks?: number;
  /** MiB asked for (`--kv-cache-memory`). */
  readonly kvCacheMemory?: number;
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
 * @throws {RangeError} when `kvCacheMemory` holds no block.
 */
export function kvCacheBlocks(r: KvCacheRequest): KvCacheSizing {
  const useful = r.maxNumSeqs * Math.ceil(r.maxModelLen / r.blockSize);
  const mib = r.kvCacheMemory ?? DEFAULT_KV_CACHE_MIB;
  const byMemory = Math.floor((mib * 2 ** 20) / r.blockBytes);
  if (r.numKvBlocks === undefined && byMemory < 1) {
    throw new RangeError(
      `--kv-cache-memory ${mib} MiB holds no KV block: one block of this model takes ` +
        `${(r.blockBytes / 2 ** 20).toFixed(3)} MiB`,
    );
  }
  const wanted = r.numKvBlocks ?? Math.min(byMemory, useful);
  const kvBlocks = Math.min(wanted, r.limitBlocks);
  const notes: string[] = [];
  if (kvBlocks < wanted) {
    notes.push(`KV cache capped at ${kvBlocks} blocks: one layer's K or V must fit one binding`);
  } else if (r.numKvBlocks === undefined && r.kvCacheMemory === undefined && byMemory < useful) {
    const perRequest = Math.floor((kvBlocks * r.blockSize) / r.maxNumSeqs);
    // The most that helps: every request whole, or what one binding per layer allows.
    const most = Math.min(useful, r.limitBlocks);
    const mostMiB = Math.ceil((most * r.blockBytes) / 2 ** 20);
    const held = most === useful
      ? `${f(r.maxNumSeqs)}`
      : `${
        f(Math.floor((most * r.blockSize) / r.maxModelLen))
      }, the most one binding per layer allows,`;
    notes.push(
      `KV cache limited by its ${f(DEFAULT_KV_CACHE_MIB)} MiB default (WebGPU cannot report the ` +
        `GPU's memory): ${f(r.maxNumSeqs)} running requests (--max-num-seqs) get ` +
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
