/**
 * End to end with `--kv-cache-dtype fp8`: greedy tokens of a ModelRunner whose KV cache holds
 * e4m3 codes equal those of the float64 reference whose K and V are rounded to e4m3 before
 * attention (tests/reference/kv_values.ts, from the format's definition), for every
 * architecture, under the kernel profile the suite runs (CI runs both), with f32 weights and
 * with f16 weights (an fp8 cache stages its values in f16 then), up to the first step whose
 * reference top-2 logit gap is a near-tie.
 *
 * The rounded reference is a different model from the plain one: where the prompts compared
 * never part the two, more are drawn until they do, and the runner must follow the rounded one
 * (so a cache that kept f16 / f32 values would fail).
 */

import assert from "node:assert/strict";
import { ModelRunner } from "../engine/model_runner.ts";
import { blockBytes } from "../engine/kv_cache.ts";
import { makeModel } from "../tools/make_model.ts";
import { ReferenceModel } from "./reference/model.ts";
import { GPU_TEST, testContext } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { assertGreedyMatchesChangedReference, SOLO_RUNNER_OPTIONS } from "./support/solo_run.ts";

for (const preset of ["tiny-qwen3", "tiny-qwen2", "tiny-llama", "tiny-gpt2"] as const) {
  for (const weights of ["f32", "f16"] as const) {
    Deno.test(
      `ModelRunner with an fp8 KV cache generates the greedy tokens of the float64 reference with e4m3 K and V for ${preset}, ${weights} weights`,
      GPU_TEST,
      async () => {
        const ctx = await testContext(weights === "f32" ? { forceF32: true } : {});
        if (weights === "f16" && !ctx.hasF16) return;
        const dir = await Deno.makeTempDir();
        try {
          const { seed, rng } = testSeed(`fp8 kv runner ${preset} ${weights}`);
          await makeModel({ out: dir, preset, dtype: weights, seed: seed % 1000, shards: 1 });
          const ref = await ReferenceModel.load(dir, { kvCacheDtype: "fp8_e4m3" });
          const plain = await ReferenceModel.load(dir);
          const runner = await ModelRunner.load(ctx, dir, {
            ...SOLO_RUNNER_OPTIONS,
            kvCacheDtype: "fp8_e4m3",
          });
          try {
            const shape = runner.kv.shape;
            assert.equal(shape.dtype, "fp8_e4m3");
            const c = ref.config;
            assert.equal(
              blockBytes(shape),
              2 * c.numLayers * c.numKvHeads * shape.blockSize * c.headDim,
              "one byte per element",
            );
            await assertGreedyMatchesChangedReference(runner, ref, plain, rng, seed, "fp8 KV");
          } finally {
            runner.destroy();
          }
        } finally {
          await Deno.remove(dir, { recursive: true });
        }
      },
    );
  }
}
