/**
 * The paged KV cache's bookkeeping (no GPU work): a fixed pool of `numBlocks` blocks of
 * `blockSize` token slots, ids 0..numBlocks-1, with reference counts, prefix caching and a
 * bounded host swap space.
 *
 * Block choice is exact and deterministic:
 * - A fresh block comes from the front of the FREE queue (blocks holding no cached content;
 *   initially 0, 1, ..., numBlocks-1). Only when it is empty is the least recently used
 *   EVICTABLE block (ref count 0, content cached) taken, and its cache entry dropped.
 * - Freeing a sequence releases its blocks last-to-first, each going to the back of the free
 *   queue, or of the evictable queue when it holds cached content. So a sequence's tail blocks
 *   are reused or evicted before its head blocks, which are the ones most likely to be shared.
 * - A prefix hit on an evictable block takes it out of the evictable queue (ref count 1).
 *
 * Prefix caching (vLLM style): a full block whose token ids are all known and whose KV has
 * been scheduled for computation is entered in the cache under {@linkcode hashBlock}(parent
 * key, token ids). A new request reuses the longest cached run of leading blocks, except the
 * block holding its last token, so at least one token is computed and a token gets sampled.
 * Hits are collision-proof: the cached block keeps its token ids and its parent's identity
 * (block id + allocation generation), and both are compared on every hit.
 *
 * Swap: `swapOut` moves a sequence's blocks to host slots and `swapIn` brings them back into
 * fresh blocks; both return plain copy lists for the executor, which must run a step's swap-out
 * copies, then its swap-in copies, then the step's forward pass. Host slots released by a
 * swap-in are reusable only from the next step on (see {@linkcode BlockManager.endStep}).
 *
 * @module
 */

import { type BlockHash, hashBlock, saltKey } from "./block_hash.ts";
import { IdQueue } from "./id_queue.ts";
import type { Sequence } from "./sequence.ts";

/** Construction options of a {@linkcode BlockManager}. */
export interface BlockManagerOptions {
  /** Number of KV blocks in the GPU pool. */
  readonly numBlocks: number;
  /** Token slots per block. */
  readonly blockSize: number;
  /** Reuse cached full blocks across requests (default true). */
  readonly enablePrefixCaching?: boolean;
  /** Host swap space, in blocks (default 0: swapping impossible). */
  readonly numSwapBlocks?: number;
}

/** A run of cached leading blocks found for a sequence. */
export interface PrefixHit {
  /** Block ids, in block order. */
  readonly blocks: readonly number[];
  /** Tokens covered: blocks.length * blockSize. */
  readonly numTokens: number;
}

/** One block copy GPU block -> host slot, produced by a swap-out. */
export interface SwapOutCopy {
  readonly gpuBlock: number;
  readonly hostSlot: number;
}

/** One block copy host slot -> GPU block, produced by a swap-in. */
export interface SwapInCopy {
  readonly hostSlot: number;
  readonly gpuBlock: number;
}

/** No cached prefix. */
export const NO_PREFIX_HIT: PrefixHit = Object.freeze({
  blocks: Object.freeze([]),
  numTokens: 0,
});

/** KV block allocator with reference counts, prefix caching and swap bookkeeping. */
export class BlockManager {
  /** Blocks in the GPU pool. */
  readonly numBlocks: number;
  /** Token slots per block. */
  readonly blockSize: number;
  /** Whether full blocks are cached and reused across requests. */
  readonly enablePrefixCaching: boolean;
  /** Host swap slots. */
  readonly numSwapBlocks: number;

  readonly #refCount: Int32Array;
  readonly #generation: Uint32Array;
  readonly #hashOf: (BlockHash | null)[];
  readonly #cachedTokens: Int32Array;
  readonly #parent: Int32Array;
  readonly #parentGeneration: Uint32Array;
  /** The cache salt of each cached first block (`Sequence.cacheSalt`; null: unsalted). */
  readonly #rootSalt: (string | null)[];
  readonly #cache = new Map<BlockHash, number>();
  readonly #free: IdQueue;
  readonly #evictable: IdQueue;
  readonly #hostFree: number[];
  readonly #hostPending: number[] = [];
  #prefixQueries = 0;
  #prefixHits = 0;

  /** Creates an empty pool; throws RangeError on non-positive or non-integer sizes. */
  constructor(options: BlockManagerOptions) {
    const { numBlocks, blockSize, enablePrefixCaching = true, numSwapBlocks = 0 } = options;
    for (
      const [name, v, min] of [["numBlocks", numBlocks, 1], ["blockSize", blockSize, 1], [
        "numSwapBlocks",
        numSwapBlocks,
        0,
      ]] as const
    ) {
      if (!Number.isInteger(v) || v < min) {
        throw new RangeError(
          `Cannot create block manager: ${name} is ${v}, expected an integer >= ${min}`,
        );
      }
    }
    this.numBlocks = numBlocks;
    this.blockSize = blockSize;
    this.enablePrefixCaching = enablePrefixCaching;
    this.numSwapBlocks = numSwapBlocks;
    this.#refCount = new Int32Array(numBlocks);
    this.#generation = new Uint32Array(numBlocks);
    this.#hashOf = new Array<BlockHash | null>(numBlocks).fill(null);
    this.#cachedTokens = new Int32Array(numBlocks * blockSize);
    this.#parent = new Int32Array(numBlocks).fill(-1);
    this.#parentGeneration = new Uint32Array(numBlocks);
    this.#rootSalt = new Array<string | null>(numBlocks).fill(null);
    this.#free = new IdQueue(numBlocks);
    this.#evictable = new IdQueue(numBlocks);
    for (let b = 0; b < numBlocks; b++) this.#free.pushBack(b);
    this.#hostFree = Array.from({ length: numSwapBlocks }, (_, i) => i);
  }

  /** Blocks a fresh allocation can take: uncached free blocks plus evictable cached ones. */
  get numFreeBlocks(): number {
    return this.#free.size + this.#evictable.size;
  }

  /** Blocks with ref count > 0. */
  get numUsedBlocks(): number {
    return this.numBlocks - this.numFreeBlocks;
  }

  /** Fraction of the pool in use (vllm:kv_cache_usage_perc), 0..1. */
  get usage(): number {
    return this.numUsedBlocks / this.numBlocks;
  }

  /** Host slots available to a swap-out now. */
  get numFreeHostSlots(): number {
    return this.#hostFree.length;
  }

  /** Tokens looked up in the prefix cache at admissions (vllm:prefix_cache_queries). */
  get prefixCacheQueries(): number {
    return this.#prefixQueries;
  }

  /** Tokens found in the prefix cache at admissions (vllm:prefix_cache_hits). */
  get prefixCacheHits(): number {
    return this.#prefixHits;
  }

  /** Reference count of block `b`. */
  refCount(b: number): number {
    return this.#refCount[b] ?? 0;
  }

  /** Cache key of block `b`, or null when it holds no cached content. */
  blockHash(b: number): BlockHash | null {
    return this.#hashOf[b] ?? null;
  }

  /** Uncached free blocks, in allocation order. */
  freeQueue(): number[] {
    return [...this.#free];
  }

  /** Evictable cached blocks, least recently used first. */
  evictableQueue(): number[] {
    return [...this.#evictable];
  }

  /** Number of blocks needed to hold `numTokens` tokens. */
  blocksFor(numTokens: number): number {
    return Math.ceil(numTokens / this.blockSize);
  }

  /**
   * The longest run of cached leading blocks usable by `seq` (which holds no blocks yet),
   * never including the block that holds its last token. Pure: changes no ref count.
   */
  findCachedPrefix(seq: Sequence): PrefixHit {
    if (!this.enablePrefixCaching || seq.blockTable.length > 0) return NO_PREFIX_HIT;
    this.#updateHashes(seq);
    const limit = Math.min(
      Math.floor((seq.numTokens - 1) / this.blockSize),
      seq.blockHashes.length,
    );
    const blocks: number[] = [];
    let parent = -1;
    for (let i = 0; i < limit; i++) {
      const b = this.#cache.get(seq.blockHashes[i]!);
      if (b === undefined || !this.#matches(b, seq, i * this.blockSize, parent)) break;
      blocks.push(b);
      parent = b;
    }
    return blocks.length === 0
      ? NO_PREFIX_HIT
      : { blocks, numTokens: blocks.length * this.blockSize };
  }

  /**
   * Makes `seq` hold blocks for `seq.numComputedTokens + hit.numTokens + numNewTokens` tokens:
   * first the `hit` blocks (a prefix hit from {@linkcode findCachedPrefix}, only for a sequence
   * holding no blocks), then fresh blocks. Returns false, changing nothing, when the pool is
   * too small. A hit is counted in the prefix-cache statistics.
   */
  allocateSlots(seq: Sequence, numNewTokens: number, hit: PrefixHit = NO_PREFIX_HIT): boolean {
    const total = seq.numComputedTokens + hit.numTokens + numNewTokens;
    const fresh = Math.max(0, this.blocksFor(total) - seq.blockTable.length - hit.blocks.length);
    let revived = 0;
    for (const b of hit.blocks) if (this.#refCount[b] === 0) revived++;
    if (fresh + revived > this.numFreeBlocks) return false;
    if (seq.blockTable.length === 0 && seq.numComputedTokens === 0 && this.enablePrefixCaching) {
      this.#prefixQueries += seq.numTokens;
      this.#prefixHits += hit.numTokens;
    }
    for (const b of hit.blocks) {
      if (this.#refCount[b] === 0) this.#evictable.remove(b);
      this.#refCount[b]!++;
      seq.blockTable.push(b);
    }
    if (hit.blocks.length > 0) seq.numCachedBlocks = seq.blockTable.length;
    for (let i = 0; i < fresh; i++) seq.blockTable.push(this.#allocateFresh());
    return true;
  }

  /**
   * Like {@linkcode allocateSlots} but throws RangeError ("Cannot allocate 12 KV blocks: 3
   * free") instead of returning false.
   */
  allocateOrThrow(seq: Sequence, numNewTokens: number, hit: PrefixHit = NO_PREFIX_HIT): void {
    if (!this.allocateSlots(seq, numNewTokens, hit)) {
      const total = seq.numComputedTokens + hit.numTokens + numNewTokens;
      const need = this.blocksFor(total) - seq.blockTable.length - hit.blocks.length;
      throw new RangeError(`Cannot allocate ${need} KV blocks: ${this.numFreeBlocks} free`);
    }
  }

  /**
   * Enters in the prefix cache every block of `seq` that is full, whose token ids are all
   * known and whose KV is computed or scheduled (`seq.numComputedTokens`). A key already
   * cached in another block is left alone (that block stays the cached copy).
   */
  cacheFullBlocks(seq: Sequence): void {
    if (!this.enablePrefixCaching) return;
    this.#updateHashes(seq);
    const limit = Math.min(
      Math.floor(seq.numComputedTokens / this.blockSize),
      seq.blockHashes.length,
      seq.blockTable.length,
    );
    for (let i = seq.numCachedBlocks; i < limit; i++) {
      const b = seq.blockTable[i]!;
      const h = seq.blockHashes[i]!;
      if (this.#hashOf[b] !== null || this.#cache.has(h)) continue;
      this.#cache.set(h, b);
      this.#hashOf[b] = h;
      this.#cachedTokens.set(
        seq.tokenIds.slice(i * this.blockSize, (i + 1) * this.blockSize),
        b * this.blockSize,
      );
      const parent = i > 0 ? seq.blockTable[i - 1]! : -1;
      this.#parent[b] = parent;
      this.#rootSalt[b] = parent < 0 ? seq.cacheSalt : null;
      this.#parentGeneration[b] = parent >= 0 ? this.#generation[parent]! : 0;
    }
    seq.numCachedBlocks = Math.max(seq.numCachedBlocks, limit);
  }

  /** Releases all of `seq`'s GPU blocks (last to first) and host slots. */
  free(seq: Sequence): void {
    for (let i = seq.blockTable.length - 1; i >= 0; i--) this.#release(seq.blockTable[i]!);
    seq.blockTable = [];
    seq.numCachedBlocks = 0;
    for (const s of seq.hostSlots) this.#hostFree.push(s);
    seq.hostSlots = [];
  }

  /** Whether `seq`'s blocks fit in the free host slots. */
  canSwapOut(seq: Sequence): boolean {
    return seq.blockTable.length <= this.#hostFree.length;
  }

  /**
   * Moves `seq`'s blocks to host slots (taken in queue order) and releases the GPU blocks.
   * Returns the copies to run, in block order. Throws RangeError when the space is short.
   */
  swapOut(seq: Sequence): SwapOutCopy[] {
    if (!this.canSwapOut(seq)) {
      throw new RangeError(
        `Cannot swap out ${seq.blockTable.length} KV blocks: ${this.#hostFree.length} host slots free`,
      );
    }
    const copies: SwapOutCopy[] = [];
    for (const gpuBlock of seq.blockTable) {
      const hostSlot = this.#hostFree.shift()!;
      seq.hostSlots.push(hostSlot);
      copies.push({ gpuBlock, hostSlot });
    }
    for (let i = seq.blockTable.length - 1; i >= 0; i--) this.#release(seq.blockTable[i]!);
    seq.blockTable = [];
    seq.numCachedBlocks = 0;
    return copies;
  }

  /** Whether `seq` can be swapped in with room for `numNewTokens` more tokens. */
  canSwapIn(seq: Sequence, numNewTokens: number): boolean {
    const need = Math.max(
      seq.hostSlots.length,
      this.blocksFor(seq.numComputedTokens + numNewTokens),
    );
    return need <= this.numFreeBlocks;
  }

  /**
   * Brings `seq`'s blocks back into fresh GPU blocks. Returns the copies to run, in block
   * order. The host slots become free at the next {@linkcode endStep}. Throws RangeError when
   * the pool is short.
   */
  swapIn(seq: Sequence): SwapInCopy[] {
    if (seq.hostSlots.length > this.numFreeBlocks) {
      throw new RangeError(
        `Cannot allocate ${seq.hostSlots.length} KV blocks: ${this.numFreeBlocks} free`,
      );
    }
    const copies: SwapInCopy[] = [];
    for (const hostSlot of seq.hostSlots) {
      const gpuBlock = this.#allocateFresh();
      seq.blockTable.push(gpuBlock);
      copies.push({ hostSlot, gpuBlock });
      this.#hostPending.push(hostSlot);
    }
    seq.hostSlots = [];
    seq.numCachedBlocks = 0;
    return copies;
  }

  /** Ends a scheduling step: host slots read by this step's swap-ins become reusable. */
  endStep(): void {
    for (const s of this.#hostPending) this.#hostFree.push(s);
    this.#hostPending.length = 0;
  }

  /** Drops every cache entry of a block with ref count 0 (vLLM's reset_prefix_cache). */
  resetPrefixCache(): void {
    for (const b of [...this.#evictable]) {
      this.#evictable.remove(b);
      this.#uncache(b);
      this.#free.pushBack(b);
    }
  }

  #allocateFresh(): number {
    let b = this.#free.popFront();
    if (b < 0) {
      b = this.#evictable.popFront();
      if (b < 0) throw new RangeError("Cannot allocate 1 KV blocks: 0 free");
      this.#uncache(b);
    }
    this.#generation[b]!++;
    this.#refCount[b] = 1;
    return b;
  }

  #release(b: number): void {
    if (!(this.#refCount[b]! > 0)) {
      throw new RangeError(`Cannot free KV block ${b}: it is not allocated`);
    }
    if (--this.#refCount[b]! === 0) {
      if (this.#hashOf[b] !== null) this.#evictable.pushBack(b);
      else this.#free.pushBack(b);
    }
  }

  #uncache(b: number): void {
    const h = this.#hashOf[b];
    if (h === null || h === undefined) return;
    if (this.#cache.get(h) === b) this.#cache.delete(h);
    this.#hashOf[b] = null;
    this.#parent[b] = -1;
    this.#rootSalt[b] = null;
  }

  /** Whether cached block `b` holds `seq`'s tokens from `start`, after block `parent`. */
  #matches(b: number, seq: Sequence, start: number, parent: number): boolean {
    if (this.#parent[b] !== parent) return false;
    if (parent >= 0 && this.#parentGeneration[b] !== this.#generation[parent]) return false;
    // A first block is shared only within its salt (a hash collision cannot cross salts).
    if (parent < 0 && this.#rootSalt[b] !== seq.cacheSalt) return false;
    const tokens = seq.tokenIds;
    const base = b * this.blockSize;
    for (let j = 0; j < this.blockSize; j++) {
      if (this.#cachedTokens[base + j] !== tokens[start + j]) return false;
    }
    return true;
  }

  #updateHashes(seq: Sequence): void {
    const bs = this.blockSize;
    const tokens = seq.tokenIds;
    // A salted sequence's first block hangs off its salt's key (block_hash.ts `saltKey`).
    const root = seq.cacheSalt === null ? null : saltKey(seq.cacheSalt);
    for (let i = seq.blockHashes.length; (i + 1) * bs <= tokens.length; i++) {
      seq.blockHashes.push(
        hashBlock(i > 0 ? seq.blockHashes[i - 1]! : root, tokens, i * bs, (i + 1) * bs),
      );
    }
  }
}
