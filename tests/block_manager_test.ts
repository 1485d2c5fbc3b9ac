import { deepStrictEqual as assertEquals, ok as assert, throws } from "node:assert/strict";
import { BlockManager } from "../scheduler/block_manager.ts";
import { hashBlock, saltKey } from "../scheduler/block_hash.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import { Sequence } from "../scheduler/sequence.ts";

/** Asserts that `fn` throws an `type` whose message contains `text`. */
function assertThrows(fn: () => unknown, type: ErrorConstructor, text: string): void {
  throws(fn, (e: unknown) => e instanceof type && e.message.includes(text));
}

let order = 0;
function seq(id: string, prompt: number[], salt: string | null = null): Sequence {
  return new Sequence(id, prompt, samplingParams(), 16, 0, 0, order++, salt);
}

function range(lo: number, hi: number): number[] {
  return Array.from({ length: hi - lo }, (_, i) => lo + i);
}

/** Admits `s` as the scheduler does: prefix lookup, allocation, computed tokens, caching. */
function admit(bm: BlockManager, s: Sequence): number {
  const hit = bm.findCachedPrefix(s);
  assert(bm.allocateSlots(s, s.numTokens - hit.numTokens, hit), `admit ${s.requestId}`);
  s.numComputedTokens = s.numTokens;
  bm.cacheFullBlocks(s);
  return hit.numTokens;
}

function refCounts(bm: BlockManager): number[] {
  return range(0, bm.numBlocks).map((b) => bm.refCount(b));
}

/** Plain BigInt FNV-1a 64 over the little-endian bytes of u32 words, for reference. */
function fnv1a64(words: number[], basis = 0xcbf29ce484222325n): string {
  let h = basis;
  for (const w of words) {
    for (let s = 0; s < 32; s += 8) {
      h ^= BigInt((w >>> s) & 0xff);
      h = (h * 0x100000001b3n) & 0xffffffffffffffffn;
    }
  }
  return h.toString(16).padStart(16, "0");
}

Deno.test("hashBlock() is 64-bit FNV-1a over the token bytes, chained from the parent key", () => {
  const tokens = [0, 1, 151935, 0xffffffff, 42, 7];
  assertEquals(hashBlock(null, tokens, 0, 3), fnv1a64([0, 1, 151935]));
  const parent = hashBlock(null, tokens, 0, 3);
  assertEquals(
    hashBlock(parent, tokens, 3, 6),
    fnv1a64([0xffffffff, 42, 7], BigInt("0x" + parent)),
  );
  assert(hashBlock(null, tokens, 3, 6) !== hashBlock(parent, tokens, 3, 6));
});

Deno.test("allocateSlots() hands out blocks in queue order and free() returns them last-first", () => {
  const bm = new BlockManager({ numBlocks: 8, blockSize: 4, enablePrefixCaching: false });
  const a = seq("a", range(1, 11)); // 10 tokens -> 3 blocks
  const b = seq("b", range(1, 6)); // 5 tokens -> 2 blocks
  admit(bm, a);
  admit(bm, b);
  assertEquals(a.blockTable, [0, 1, 2]);
  assertEquals(b.blockTable, [3, 4]);
  // Growth: 2 more tokens fit in block 2, the 3rd needs a new block.
  assert(bm.allocateSlots(a, 2));
  assertEquals(a.blockTable, [0, 1, 2]);
  assert(bm.allocateSlots(a, 3));
  assertEquals(a.blockTable, [0, 1, 2, 5]);
  assertEquals(bm.numUsedBlocks, 6);
  assertEquals(bm.usage, 6 / 8);
  bm.free(a);
  assertEquals(a.blockTable, []);
  assertEquals(bm.freeQueue(), [6, 7, 5, 2, 1, 0]);
  const c = seq("c", range(1, 10));
  admit(bm, c);
  assertEquals(c.blockTable, [6, 7, 5]);
  assertEquals(refCounts(bm), [0, 0, 0, 1, 1, 1, 1, 1]);
  // Too big: nothing changes, and the throwing variant names the numbers.
  const d = seq("d", range(1, 30));
  assertEquals(bm.allocateSlots(d, 29), false);
  assertEquals(d.blockTable, []);
  assertEquals(bm.numFreeBlocks, 3);
  assertThrows(() => bm.allocateOrThrow(d, 29), RangeError, "Cannot allocate 8 KV blocks: 3 free");
  bm.free(b);
  bm.free(c);
  assertEquals(refCounts(bm), [0, 0, 0, 0, 0, 0, 0, 0]);
  assertEquals(bm.numFreeBlocks, 8);
});

Deno.test("findCachedPrefix() reuses full cached blocks, never the block of the last token", () => {
  const bm = new BlockManager({ numBlocks: 16, blockSize: 4 });
  const a = seq("a", range(1, 11)); // blocks [1..4] [5..8] [9,10]
  assertEquals(admit(bm, a), 0);
  assertEquals(a.blockTable, [0, 1, 2]);
  assert(bm.blockHash(0) !== null && bm.blockHash(1) !== null);
  assertEquals(bm.blockHash(2), null, "a partial last block is not cached");

  const b = seq("b", [...range(1, 9), 99, 98]);
  assertEquals(admit(bm, b), 8);
  assertEquals(b.blockTable, [0, 1, 3]);
  assertEquals(b.numCachedBlocks, 2);
  assertEquals(refCounts(bm).slice(0, 4), [2, 2, 1, 1]);

  // Prompt of exactly two blocks: the block holding its last token is recomputed.
  const c = seq("c", range(1, 9));
  assertEquals(bm.findCachedPrefix(c).blocks, [0]);
  // Same tokens after a different first block: chained keys differ, no hit.
  const d = seq("d", [50, 2, 3, 4, 5, 6, 7, 8, 9]);
  assertEquals(bm.findCachedPrefix(d).numTokens, 0);
  const e = seq("e", [1, 2, 3, 4, 5, 6, 7, 0, 9]);
  assertEquals(bm.findCachedPrefix(e).blocks, [0]);

  assertEquals(bm.prefixCacheQueries, 20);
  assertEquals(bm.prefixCacheHits, 8);
  bm.free(b);
  assertEquals(refCounts(bm).slice(0, 4), [1, 1, 1, 0]);
  bm.free(a);
  assertEquals(bm.numFreeBlocks, 16);
  assertEquals(bm.evictableQueue(), [1, 0], "a's cached blocks, tail first");
});

Deno.test("findCachedPrefix() shares blocks only among sequences of the same cache salt", () => {
  const bm = new BlockManager({ numBlocks: 32, blockSize: 4 });
  const prompt = range(0, 13);
  assertEquals(admit(bm, seq("a", prompt)), 0);
  // Another salt, or a salt against the unsalted cache: no hit; the same salt: a hit.
  assertEquals(admit(bm, seq("b", prompt, "tenant-1")), 0);
  assertEquals(admit(bm, seq("c", prompt, "tenant-2")), 0);
  assertEquals(admit(bm, seq("d", prompt, "tenant-1")), 12);
  assertEquals(admit(bm, seq("e", prompt)), 12);
  // A salted first block hangs off the salt's key, so its keys differ from the unsalted ones.
  const salted = seq("f", prompt, "tenant-1");
  bm.findCachedPrefix(salted);
  assertEquals(salted.blockHashes[0], hashBlock(saltKey("tenant-1"), prompt, 0, 4));
  assert(salted.blockHashes[0] !== hashBlock(null, prompt, 0, 4));
  assert(saltKey("ab") !== saltKey("ba") && saltKey("a") !== saltKey("a\u0000"));
});

Deno.test("cached free blocks are evicted least recently used, after the uncached ones", () => {
  const bm = new BlockManager({ numBlocks: 6, blockSize: 2 });
  const x = seq("x", [1, 2, 3, 4, 5]); // blocks 0,1 cached, 2 partial
  const y = seq("y", [7, 8, 9]); // block 3 cached, 4 partial
  admit(bm, x);
  admit(bm, y);
  assertEquals([x.blockTable, y.blockTable], [[0, 1, 2], [3, 4]]);
  bm.free(x);
  bm.free(y);
  assertEquals(bm.freeQueue(), [5, 2, 4]);
  assertEquals(bm.evictableQueue(), [1, 0, 3]);
  // Reusing x's first block moves it to the back once freed again.
  const x2 = seq("x2", [1, 2, 6]);
  assertEquals(admit(bm, x2), 2);
  assertEquals(x2.blockTable, [0, 5]);
  assertEquals(bm.evictableQueue(), [1, 3]);
  bm.free(x2);
  assertEquals(bm.evictableQueue(), [1, 3, 0]);
  assertEquals(bm.freeQueue(), [2, 4, 5]);
  // 5 fresh blocks: the 3 uncached first, then LRU 1 and 3; block 0 stays cached.
  const z = seq("z", range(20, 30));
  admit(bm, z);
  assertEquals(z.blockTable, [2, 4, 5, 1, 3]);
  assertEquals(bm.findCachedPrefix(seq("x3", [1, 2, 3, 4, 5])).blocks, [0]);
  assertEquals(bm.findCachedPrefix(seq("y2", [7, 8, 9])).blocks, []);
  bm.free(z);
  bm.resetPrefixCache();
  assertEquals(bm.evictableQueue(), []);
  assertEquals(bm.numFreeBlocks, 6);
});

Deno.test("swapOut() and swapIn() return exact copy lists and keep counts consistent", () => {
  const bm = new BlockManager({ numBlocks: 8, blockSize: 4, numSwapBlocks: 4 });
  const a = seq("a", range(1, 11));
  const b = seq("b", range(50, 63));
  admit(bm, a);
  admit(bm, b);
  assertEquals([a.blockTable, b.blockTable], [[0, 1, 2], [3, 4, 5, 6]]);
  assert(bm.canSwapOut(a));
  assertEquals(bm.swapOut(a), [
    { gpuBlock: 0, hostSlot: 0 },
    { gpuBlock: 1, hostSlot: 1 },
    { gpuBlock: 2, hostSlot: 2 },
  ]);
  assertEquals([a.blockTable, a.hostSlots, bm.numFreeHostSlots], [[], [0, 1, 2], 1]);
  assertEquals(refCounts(bm), [0, 0, 0, 1, 1, 1, 1, 0]);
  assertEquals(bm.canSwapOut(b), false);
  assertThrows(() => bm.swapOut(b), RangeError, "Cannot swap out 4 KV blocks: 1 host slots free");
  assert(bm.canSwapIn(a, 1));
  assertEquals(bm.canSwapIn(a, 100), false);
  assertEquals(bm.swapIn(a), [
    { hostSlot: 0, gpuBlock: 7 },
    { hostSlot: 1, gpuBlock: 2 },
    { hostSlot: 2, gpuBlock: 1 },
  ]);
  assertEquals(a.blockTable, [7, 2, 1]);
  assertEquals(bm.numFreeHostSlots, 1, "slots read by this step's swap-ins stay busy");
  bm.endStep();
  assertEquals(bm.numFreeHostSlots, 4);
  bm.free(a);
  bm.free(b);
  assertEquals(bm.numFreeBlocks, 8);
  assertEquals(refCounts(bm), [0, 0, 0, 0, 0, 0, 0, 0]);
});

Deno.test("BlockManager rejects invalid sizes and double frees", () => {
  assertThrows(
    () => new BlockManager({ numBlocks: 0, blockSize: 16 }),
    RangeError,
    "numBlocks is 0",
  );
  const bm = new BlockManager({ numBlocks: 2, blockSize: 2 });
  const a = seq("a", [1, 2, 3]);
  admit(bm, a);
  const table = a.blockTable;
  bm.free(a);
  a.blockTable = table;
  assertThrows(() => bm.free(a), RangeError, "is not allocated");
});
