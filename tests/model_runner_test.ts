import assert from "node:assert/strict";
import { ModelRunner } from "../engine/model_runner.ts";
import { makeModel } from "../tools/make_model.ts";
import { ReferenceModel } from "./reference/model.ts";
import { GPU_TEST, HAS_F16, testContext } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { soloGreedy } from "./support/solo_run.ts";

const PRESETS = ["tiny-qwen3", "tiny-qwen2", "tiny-llama", "tiny-gpt2"] as const;
const MAX_TOKENS = 32;

for (const preset of PRESETS) {
  Deno.test(
    `ModelRunner greedy generation equals the float64 reference for ${preset} (f32 weights)`,
    GPU_TEST,
    async () => {
      const dir = await Deno.makeTempDir();
      try {
        const { seed, rng } = testSeed(`runner ${preset}`);
        await makeModel({ out: dir, preset, dtype: "f32", seed: seed % 1000, shards: 1 });
        const ref = await ReferenceModel.load(dir);
        const ctx = await testContext({ forceF32: true });
        const runner = await ModelRunner.load(ctx, dir, {
          maxTokens: 64,
          maxSeqs: 4,
          maxModelLen: 128,
          blockSize: 16,
          numKvBlocks: 24,
          showProgress: false,
        });
        try {
          const blocks = rng.permutation(24);
          for (const len of [1, 7, 33]) {
            const prompt = Array.from({ length: len }, () => rng.int(0, 500));
            const expected = ref.greedy(prompt, MAX_TOKENS).map((s) => s.token);
            const got = await soloGreedy(runner, prompt, MAX_TOKENS, { blocks });
            assert.deepEqual(got, expected, `seed ${seed} prompt length ${len}: ${prompt}`);
          }
        } finally {
          runner.destroy();
        }
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    },
  );
}

/**
 * With f16 weights and KV cache (bf16 or f16 checkpoints), greedy tokens must equal the float64
 * reference up to the first step whose top-2 logit gap in the reference is below GAP_TOLERANCE:
 * there, rounding may legitimately flip the argmax and the rest of the sequence is not compared.
 * Each kernel's f16 error is bounded by its own test (3e-3 normwise); if the accumulated logit
 * error of the whole model exceeded 0.02, the comparison below would fail, as it would for a
 * wrong kernel (errors of order 0.1-1 on these models' O(1) logits).
 */
const GAP_TOLERANCE = 0.02;

for (
  const [preset, dtype] of [["tiny-qwen3", "bf16"], ["tiny-gpt2", "f16"], ["tiny-qwen2", "bf16"], [
    "tiny-llama",
    "f16",
  ]] as const
) {
  Deno.test(
    `ModelRunner greedy generation with f16 weights follows the reference for ${preset} (${dtype} checkpoint)`,
    { ...GPU_TEST, ignore: !HAS_F16 },
    async () => {
      const dir = await Deno.makeTempDir();
      try {
        const { seed, rng } = testSeed(`runner f16 ${preset}`);
        await makeModel({ out: dir, preset, dtype, seed: seed % 1000 });
        const ref = await ReferenceModel.load(dir);
        const ctx = await testContext();
        assert.equal(ctx.weightDtype, "f16");
        const runner = await ModelRunner.load(ctx, dir, {
          maxTokens: 64,
          maxSeqs: 4,
          maxModelLen: 128,
          blockSize: 16,
          numKvBlocks: 24,
          showProgress: false,
        });
        try {
          let compared = 0;
          for (const len of [1, 7, 33]) {
            const prompt = Array.from({ length: len }, () => rng.int(0, 500));
            const steps = ref.greedy(prompt, MAX_TOKENS);
            const got = await soloGreedy(runner, prompt, MAX_TOKENS, {
              blocks: rng.permutation(24),
            });
            for (let i = 0; i < steps.length && steps[i]!.gap >= GAP_TOLERANCE; i++, compared++) {
              assert.equal(got[i], steps[i]!.token, `seed ${seed} prompt ${len}, step ${i}`);
            }
          }
          assert.ok(
            compared >= 8,
            `seed ${seed}: only ${compared} steps had a gap >= ${GAP_TOLERANCE}`,
          );
        } finally {
          runner.destroy();
        }
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    },
  );
}
