import assert from "node:assert/strict";
import { DEFAULT_KV_CACHE_MIB, kvCacheBlocks, kvCacheLines } from "../engine/kv_cache_size.ts";

/** Qwen3-0.6B's f16 KV: 28 layers x K and V x 8 heads x 16 tokens x 128 dims x 2 bytes a block. */
const QWEN3 = {
  blockBytes: 28 * 2 * 8 * 16 * 128 * 2,
  limitBlocks: 32_768,
  blockSize: 16,
  maxNumSeqs: 64,
  maxModelLen: 4096,
};

Deno.test("kvCacheBlocks() fills the 1 GiB default and says so when that limits the cache", () => {
  assert.equal(DEFAULT_KV_CACHE_MIB, 1024);
  const s = kvCacheBlocks(QWEN3);
  // 2^30 / 1,835,008 = 585.1 blocks, 9,360 tokens: 146 for each of 64 requests.
  assert.equal(s.kvBlocks, 585);
  assert.deepEqual(s.notes, [
    "KV cache limited by its 1,024 MiB default (the GPU's memory is unknown: WebGPU cannot " +
    "report it): 64 running requests (--max-num-seqs) get 146 tokens each before the scheduler " +
    "preempts; --kv-cache-memory MIB gives it more (28,672 holds 64 of 4,096 tokens)",
  ]);
  // The reason the memory could not be read (gpu/device_memory.ts) replaces the generic one.
  const unknown = kvCacheBlocks({ ...QWEN3, gpuMemory: { unknown: "nvidia-smi not found" } });
  assert.equal(unknown.kvBlocks, 585);
  assert.match(unknown.notes[0]!, /\(the GPU's memory is unknown: nvidia-smi not found\): 64 /);
});

/** An H200 as nvidia-smi reports it, the model taking 2,100 MiB of it. */
const H200 = { totalMiB: 143_771, modelMiB: 2_100, source: "nvidia-smi", utilization: 0.9 };

Deno.test("kvCacheBlocks() fills what the model leaves of its --gpu-memory-utilization share", () => {
  // 8 requests of 4,096 tokens hold 2,048 blocks (3,584 MiB): less than 0.9 x 143,771 - 2,100.
  const whole = kvCacheBlocks({ ...QWEN3, maxNumSeqs: 8, gpuMemory: H200 });
  assert.equal(whole.kvBlocks, 2048);
  assert.deepEqual(whole.notes, [
    "KV cache sized from the GPU's memory (nvidia-smi): 0.9 of 143,771 MiB " +
    "(--gpu-memory-utilization) less the model's 2,100 MiB leaves 127,293 MiB; 3,584 MiB of it " +
    "hold all 8 requests (--max-num-seqs) of 4,096 tokens",
  ]);
  // A share that holds fewer: 0.5 x 8,192 - 3,000 = 1,096 MiB, floor(1,096 / 1.75) = 626 blocks.
  const gpu = { totalMiB: 8192, modelMiB: 3000, source: "nvidia-smi", utilization: 0.5 };
  const part = kvCacheBlocks({ ...QWEN3, gpuMemory: gpu });
  assert.equal(part.kvBlocks, 626);
  assert.deepEqual(part.notes, [
    "KV cache sized from the GPU's memory (nvidia-smi): 0.5 of 8,192 MiB " +
    "(--gpu-memory-utilization) less the model's 3,000 MiB leaves 1,096 MiB",
  ]);
  // One binding per layer still caps it, and says so.
  const capped = kvCacheBlocks({ ...QWEN3, limitBlocks: 1000, gpuMemory: H200 });
  assert.equal(capped.kvBlocks, 1000);
  assert.equal(
    capped.notes[1],
    "KV cache capped at 1000 blocks: one layer's K or V must fit one binding",
  );
  // A flag's size wins over the memory (the engine does not read it then, engine/kv_cache_plan.ts).
  assert.deepEqual(kvCacheBlocks({ ...QWEN3, kvCacheMemory: 512, gpuMemory: H200 }), {
    kvBlocks: 292,
    notes: [],
  });
});

Deno.test("kvCacheBlocks() refuses a --gpu-memory-utilization that leaves no room for a block", () => {
  for (const modelMiB of [7_372, 9_000]) {
    const gpu = { totalMiB: 8192, modelMiB, source: "nvidia-smi", utilization: 0.9 };
    assert.throws(
      () => kvCacheBlocks({ ...QWEN3, gpuMemory: gpu }),
      (e) =>
        e instanceof RangeError &&
        e.message === "--gpu-memory-utilization 0.9 leaves no room for the KV cache: the model " +
            `took ${modelMiB.toLocaleString("en-US")} MiB of the 7,372 it allows of the GPU's ` +
            "8,192 (nvidia-smi); one KV block of this model takes 1.750 MiB",
    );
  }
  // 0.9 x 8,192 - 7,370 = 2.8 MiB: one block.
  const one = { totalMiB: 8192, modelMiB: 7370, source: "nvidia-smi", utilization: 0.9 };
  assert.equal(kvCacheBlocks({ ...QWEN3, gpuMemory: one }).kvBlocks, 1);
});

Deno.test("kvCacheBlocks() sizes by --kv-cache-memory or --num-kv-blocks without the default's note", () => {
  assert.deepEqual(kvCacheBlocks({ ...QWEN3, kvCacheMemory: 4096 }), { kvBlocks: 2340, notes: [] });
  assert.deepEqual(kvCacheBlocks({ ...QWEN3, kvCacheMemory: 512 }), { kvBlocks: 292, notes: [] });
  assert.deepEqual(kvCacheBlocks({ ...QWEN3, numKvBlocks: 1000 }), { kvBlocks: 1000, notes: [] });
  // A memory size past what max_num_seqs requests of max_model_len could hold: that much only.
  assert.deepEqual(kvCacheBlocks({ ...QWEN3, maxNumSeqs: 2, kvCacheMemory: 8192 }), {
    kvBlocks: 512,
    notes: [],
  });
});

Deno.test("kvCacheBlocks() keeps the default without a note when it holds every request whole", () => {
  // 4 requests of 4,096 tokens: 1,024 blocks wanted... of a model with 1/8 the bytes a block.
  const small = { ...QWEN3, blockBytes: QWEN3.blockBytes / 8, maxNumSeqs: 4 };
  assert.deepEqual(kvCacheBlocks(small), { kvBlocks: 1024, notes: [] });
});

Deno.test("kvCacheBlocks() caps at one binding per layer and says so", () => {
  const s = kvCacheBlocks({ ...QWEN3, limitBlocks: 100 });
  assert.deepEqual(s, {
    kvBlocks: 100,
    notes: [
      "KV cache capped at 100 blocks: one layer's K or V must fit one binding",
      "KV cache holds 1,600 tokens, fewer than max_model_len 4,096: a request needing more is " +
      "refused",
    ],
  });
  // Past one binding's limit the default's note names what the limit allows: 1,000 blocks,
  // 16,000 tokens, 3 requests of 4,096.
  const capped = kvCacheBlocks({ ...QWEN3, limitBlocks: 1000 }).notes[0]!;
  assert.match(
    capped,
    /get 146 tokens each .* \(1,750 holds 3, the most one binding per layer allows, of 4,096 tokens\)$/,
  );
  assert.deepEqual(
    kvCacheBlocks({ ...QWEN3, numKvBlocks: 5000, limitBlocks: 4096 }).kvBlocks,
    4096,
  );
});

Deno.test("kvCacheBlocks() refuses a memory size that holds no block, and notes one short of max_model_len", () => {
  assert.throws(
    () => kvCacheBlocks({ ...QWEN3, kvCacheMemory: 1 }),
    (e) =>
      e instanceof RangeError &&
      e.message === "--kv-cache-memory 1 MiB holds no KV block: one block of this model takes " +
          "1.750 MiB",
  );
  // 100 MiB: 57 blocks, 912 tokens.
  assert.deepEqual(kvCacheBlocks({ ...QWEN3, kvCacheMemory: 100 }), {
    kvBlocks: 57,
    notes: [
      "KV cache holds 912 tokens, fewer than max_model_len 4,096: a request needing more is refused",
    ],
  });
  assert.deepEqual(kvCacheBlocks({ ...QWEN3, numKvBlocks: 256 }).notes, []);
});

Deno.test("kvCacheLines() gives the cache's tokens and the concurrency at max_model_len", () => {
  assert.deepEqual(kvCacheLines(585, 16, 4096), [
    "KV cache: 585 blocks x 16 tokens = 9,360 tokens",
    "Maximum concurrency for 4,096 tokens per request: 2.29x",
  ]);
});
