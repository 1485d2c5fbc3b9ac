/**
 * The engine's options at the edge (engine/engine_config.ts): defaults, one-line errors naming
 * the option, and the options that only one executor, scheduler or preemption mode reads,
 * refused where they would be ignored.
 */

import assert from "node:assert/strict";
import { type EngineOptions, resolveEngineConfig } from "../engine/engine_config.ts";

Deno.test("resolveEngineConfig() applies the defaults and freezes the result", () => {
  const c = resolveEngineConfig({ executor: "mock" });
  assert.equal(c.scheduler, "continuous");
  assert.equal(c.maxNumSeqs, 64);
  assert.equal(c.quantization, "auto");
  assert.equal(c.kvCacheDtype, "auto");
  assert.equal(c.preemptionMode, "recompute");
  assert.ok(Object.isFrozen(c));
});

Deno.test("resolveEngineConfig() names the first invalid option in one line", () => {
  assert.throws(
    () => resolveEngineConfig({ executor: "mock", maxNumSeqs: 0 }),
    (e) => e instanceof RangeError && /^Invalid engine option maxNumSeqs: /.test(e.message),
  );
  assert.throws(
    () => resolveEngineConfig({}),
    /Invalid engine option model: the webgpu executor needs a model directory/,
  );
  assert.throws(
    () => resolveEngineConfig({ executor: "mock", maxInFlight: 65 }),
    /^RangeError: Invalid engine option maxInFlight: .*64/,
  );
  assert.equal(resolveEngineConfig({ executor: "mock", maxInFlight: 64 }).maxInFlight, 64);
  assert.throws(
    () => resolveEngineConfig({ executor: "mock", kvCacheMemory: 64, numKvBlocks: 8 }),
    /give kvCacheMemory or numKvBlocks, not both/,
  );
});

Deno.test("resolveEngineConfig() refuses an option that the executor, scheduler or preemption mode would ignore", () => {
  const cases: [EngineOptions, string][] = [
    [
      { executor: "mock", quantization: "int4" },
      "quantization: it applies to the webgpu executor, not executor mock",
    ],
    [
      { executor: "mock", kernelProfile: "gpu" },
      "kernelProfile: it applies to the webgpu executor",
    ],
    [
      { executor: "mock", kernelTuning: "measure" },
      "kernelTuning: it applies to the webgpu executor",
    ],
    [{ executor: "mock", forceF32: true }, "forceF32: it applies to the webgpu executor"],
    [{ executor: "mock", dtype: "float32" }, "dtype: it applies to the webgpu executor"],
    [
      { executor: "mock", kvCacheDtype: "fp8_e4m3" },
      "kvCacheDtype: it applies to the webgpu executor",
    ],
    [
      { executor: "mock", overrideGenerationConfig: { temperature: 0 } },
      "overrideGenerationConfig: it applies to the webgpu executor",
    ],
    [
      { model: "/m", overrideGenerationConfig: { max_tokens: 3 } as object },
      "overrideGenerationConfig: Unrecognized key",
    ],
    [
      { executor: "mock", chatTemplate: "{{ messages }}" },
      "chatTemplate: it applies to a model's tokenizer, not an engine without a model",
    ],
    [
      { model: "/m", mockBaseMs: 3 },
      "mockBaseMs: it applies to the mock executor, not executor webgpu",
    ],
    [{ model: "/m", mockFailAtStep: 2 }, "mockFailAtStep: it applies to the mock executor"],
    [
      { executor: "mock", maxBatchSize: 4 },
      "maxBatchSize: it applies to the static and dynamic schedulers, not scheduler continuous",
    ],
    [
      { executor: "mock", scheduler: "static", batchWaitMs: 50 },
      "batchWaitMs: it applies to the dynamic scheduler, not scheduler static",
    ],
    [
      { executor: "mock", swapSpace: 64 },
      "swapSpace: it applies to preemption mode swap, not preemption mode recompute",
    ],
  ];
  for (const [options, message] of cases) {
    assert.throws(
      () => resolveEngineConfig(options),
      (e) => e instanceof RangeError && e.message.startsWith(`Invalid engine option ${message}`),
      JSON.stringify(options),
    );
  }
});

Deno.test("resolveEngineConfig() refuses dtype float16 beside forceF32, in one line", () => {
  assert.throws(
    () => resolveEngineConfig({ model: "/m", dtype: "float16", forceF32: true }),
    (e) =>
      e instanceof RangeError &&
      e.message === "Invalid engine options: dtype float16 contradicts forceF32",
  );
  assert.throws(
    () => resolveEngineConfig({ model: "/m", dtype: "bfloat16" as "float16" }),
    (e) => e instanceof RangeError && e.message.startsWith("Invalid engine option dtype:"),
  );
});

Deno.test("resolveEngineConfig() accepts those options where they apply, and at their defaults anywhere", () => {
  resolveEngineConfig({ executor: "mock", scheduler: "dynamic", maxBatchSize: 4, batchWaitMs: 5 });
  resolveEngineConfig({ executor: "mock", scheduler: "static", maxBatchSize: 4 });
  resolveEngineConfig({ executor: "mock", preemptionMode: "swap", swapSpace: 64 });
  resolveEngineConfig({ executor: "mock", mockBaseMs: 1, mockFailAtStep: 3 });
  resolveEngineConfig({ model: "/m", quantization: "int8", kernelProfile: "cpu", forceF32: true });
  resolveEngineConfig({ model: "/m", dtype: "float32", forceF32: true });
  resolveEngineConfig({ executor: "mock", model: "/m", chatTemplate: "{{ messages }}" });
  // Defaults change nothing, so they pass anywhere (the CLI always sets the profile to auto).
  resolveEngineConfig({
    executor: "mock",
    quantization: "auto",
    kernelProfile: "auto",
    forceF32: false,
    batchWaitMs: 10,
  });
  // A resolved config resolves again (the mock set-up does so).
  const c = resolveEngineConfig({ executor: "mock", scheduler: "dynamic", batchWaitMs: 5 });
  assert.deepEqual(resolveEngineConfig(c), c);
});
