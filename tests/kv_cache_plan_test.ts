import assert from "node:assert/strict";
import type { DeviceMemoryReader, DeviceMemoryReading } from "../gpu/device_memory.ts";
import { LLMEngine } from "../engine/llm_engine.ts";
import { residencyWarnings } from "../engine/kv_cache_plan.ts";
import type { EngineOptions } from "../engine/engine_config.ts";
import { makeModel } from "../tools/make_model.ts";

/** A reader that answers `readings` in turn (the last one from then on) and counts its calls. */
function fakeMemory(...readings: DeviceMemoryReading[]): DeviceMemoryReader & { calls: number } {
  const read = Object.assign(
    () => Promise.resolve(readings[Math.min(read.calls++, readings.length - 1)]!),
    { calls: 0 },
  );
  return read;
}

const gpu = (usedMiB: number): DeviceMemoryReading => ({
  memory: { totalMiB: 1000, usedMiB, source: "fake" },
});

/**
 * Runs `fn` on a tiny-qwen3 checkpoint (f32: 3 layers x K and V x 2 kv heads x 16 tokens x 32
 * dims x 4 bytes = 24,576 bytes a KV block).
 */
async function withTinyModel(fn: (options: EngineOptions) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "kv_cache_plan_" });
  try {
    await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed: 3 });
    // 4 requests of 512 tokens: 128 blocks at most.
    await fn({ model: dir, showProgress: false, forceF32: true, maxNumSeqs: 4, maxModelLen: 512 });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("LLMEngine.create() sizes the KV cache from the GPU's memory read once the model is loaded", async () => {
  await withTinyModel(async (options) => {
    // Before the load 100 MiB in use, after it 599: the model took 499 MiB of the 500 that 0.5
    // of the GPU allows, so 1 MiB is left, 42 blocks.
    const read = fakeMemory(gpu(100), gpu(599), gpu(600));
    const log: string[] = [];
    const engine = await LLMEngine.create(
      { ...options, gpuMemoryUtilization: 0.5 },
      (l) => log.push(l),
      read,
    );
    try {
      assert.equal(engine.stats().kvBlocksTotal, 42);
      assert.equal(read.calls, 3);
      assert.ok(log.includes("KV cache: 42 blocks x 16 tokens = 672 tokens"), log.join("\n"));
      assert.ok(
        log.includes(
          "KV cache sized from the GPU's memory (fake): 0.5 of 1,000 MiB " +
            "(--gpu-memory-utilization) less the model's 499 MiB leaves 1 MiB",
        ),
        log.join("\n"),
      );
      assert.ok(
        log.includes(
          "GPU memory in use: 100 MiB before loading, 600 of 1,000 MiB with the model and KV " +
            "cache (fake)",
        ),
        log.join("\n"),
      );
    } finally {
      await engine.shutdown();
    }
    // The default share, 0.9 of the 900 MiB free: 810 - 499 MiB hold far more than 4 requests'
    // 128 blocks (3 MiB), here without a rise in the memory in use: too small to warn of
    // (residencyWarnings).
    const quiet: string[] = [];
    const roomy = await LLMEngine.create(
      options,
      (l) => quiet.push(l),
      fakeMemory(gpu(100), gpu(599)),
    );
    try {
      assert.equal(roomy.stats().kvBlocksTotal, 128);
      assert.ok(
        quiet.includes(
          "KV cache sized from the GPU's memory (fake): 0.81 of 1,000 MiB " +
            "(--gpu-memory-utilization, by default 0.9 of the memory free at start-up) less the " +
            "model's 499 MiB leaves 311 MiB; 3 MiB of it hold all 4 requests (--max-num-seqs) of " +
            "512 tokens",
        ),
        quiet.join("\n"),
      );
      assert.ok(![...log, ...quiet].some((l) => l.startsWith("Warning")), quiet.join("\n"));
    } finally {
      await roomy.shutdown();
    }
  });
});

Deno.test("LLMEngine.create() refuses a --gpu-memory-utilization share that is not free, or that the model fills", async () => {
  await withTinyModel(async (options) => {
    const create = (...readings: DeviceMemoryReading[]) =>
      LLMEngine.create(
        { ...options, gpuMemoryUtilization: 0.5 },
        () => {},
        fakeMemory(...readings),
      );
    // 600 MiB in use by others: 500 of 1,000 are not free (checked before the load).
    const busy = fakeMemory(gpu(600));
    await assert.rejects(
      () => LLMEngine.create({ ...options, gpuMemoryUtilization: 0.5 }, () => {}, busy),
      (e) =>
        e instanceof RangeError &&
        e.message === "Cannot use 0.5 of the GPU's memory (--gpu-memory-utilization): 500 of " +
            "1,000 MiB, but 600 MiB are in use (fake); give a lower share or --kv-cache-memory MIB",
    );
    assert.equal(busy.calls, 1);
    // Not given, the share is 0.9 of what is free (0.36 of 1,000 MiB): the engine serves.
    const shared = await LLMEngine.create(options, () => {}, fakeMemory(gpu(600), gpu(700)));
    try {
      assert.equal(shared.stats().kvBlocksTotal, 128);
    } finally {
      await shared.shutdown();
    }
    // The model took 600 MiB of its 500.
    await assert.rejects(
      () => create(gpu(100), gpu(700)),
      (e) =>
        e instanceof RangeError &&
        e.message === "--gpu-memory-utilization 0.5 leaves no room for the KV cache: the model " +
            "took 600 MiB of the 500 it allows of the GPU's 1,000 (fake); one KV block of this " +
            "model takes 0.023 MiB",
    );
  });
});

Deno.test("LLMEngine.create() keeps the fixed default where the GPU's memory is unknown, and refuses --gpu-memory-utilization there", async () => {
  await withTinyModel(async (options) => {
    const unknown = { unknown: "nvidia-smi not found" };
    const read = fakeMemory(unknown);
    const log: string[] = [];
    const engine = await LLMEngine.create(options, (l) => log.push(l), read);
    try {
      // 1,024 MiB hold the 128 blocks: no note, one read (before the load).
      assert.equal(engine.stats().kvBlocksTotal, 128);
      assert.equal(read.calls, 1);
      assert.ok(!log.some((l) => l.startsWith("GPU memory") || l.includes("sized from")));
    } finally {
      await engine.shutdown();
    }
    await assert.rejects(
      () =>
        LLMEngine.create({ ...options, gpuMemoryUtilization: 0.8 }, () => {}, fakeMemory(unknown)),
      (e) =>
        e instanceof RangeError &&
        e.message === "Cannot apply --gpu-memory-utilization: the GPU's memory is unknown " +
            "(nvidia-smi not found); give --kv-cache-memory MIB instead",
    );
    // A flag's size: the memory is not read at all.
    const flagged = fakeMemory(gpu(0));
    const sized = await LLMEngine.create({ ...options, numKvBlocks: 7 }, () => {}, flagged);
    try {
      assert.equal(sized.stats().kvBlocksTotal, 7);
      assert.equal(flagged.calls, 0);
    } finally {
      await sized.shutdown();
    }
  });
});

Deno.test("LLMEngine.create() refuses --gpu-memory-utilization beside a KV size, out of range, or for the mock", async () => {
  for (
    const [options, message] of [
      [
        { executor: "mock", gpuMemoryUtilization: 0.5 },
        "Invalid engine option gpuMemoryUtilization: it applies to the webgpu executor, not executor mock",
      ],
      [
        { model: "x", gpuMemoryUtilization: 0.5, kvCacheMemory: 100 },
        "Invalid engine options: gpuMemoryUtilization sizes the KV cache as kvCacheMemory and " +
        "numKvBlocks do: give one of them",
      ],
      [{ model: "x", gpuMemoryUtilization: 1.5 }, /^Invalid engine option gpuMemoryUtilization: /],
      [{ model: "x", gpuMemoryUtilization: 0 }, /^Invalid engine option gpuMemoryUtilization: /],
    ] as const
  ) {
    await assert.rejects(
      () => LLMEngine.create(options as EngineOptions),
      (e) =>
        e instanceof RangeError &&
        (typeof message === "string" ? e.message === message : message.test(e.message)),
    );
  }
});

Deno.test("residencyWarnings() warns of weights or a KV cache that did not raise the GPU's memory in use", () => {
  const base = {
    weightsMiB: 1200,
    cacheMiB: 28_672,
    beforeMiB: 600,
    loadedMiB: 1900,
    nowMiB: 30_600,
  };
  assert.deepEqual(residencyWarnings(base), []);
  // The weights rose the memory by 500 of their 1,200 MiB; the cache by 2,000 of 28,672.
  assert.deepEqual(residencyWarnings({ ...base, loadedMiB: 1100, nowMiB: 3100 }), [
    "Warning: the model's 1,200 MiB of weights raised the GPU's memory in use by 500 MiB: part " +
    "of them may lie in host memory (wgpu's allocator turns to it when the GPU's is full), where " +
    "every step reads them slowly; the model may not fit this GPU",
    "Warning: the KV cache's 28,672 MiB raised the GPU's memory in use by 2,000 MiB: part of it " +
    "may lie in host memory (wgpu's allocator turns to it when the GPU's is full), where " +
    "attention reads it slowly; a lower --gpu-memory-utilization or --kv-cache-memory keeps it " +
    "on the GPU",
  ]);
  // Less than 64 MiB unaccounted for, or at least half risen: no warning.
  assert.deepEqual(residencyWarnings({ ...base, weightsMiB: 100, cacheMiB: 60, nowMiB: 1900 }), []);
  assert.deepEqual(residencyWarnings({ ...base, loadedMiB: 1200, nowMiB: 15_536 }), []);
});
