import assert from "node:assert/strict";
import { ModelRunner } from "../engine/model_runner.ts";
import { makeModel } from "../tools/make_model.ts";
import { ReferenceModel } from "./reference/model.ts";
import { GPU_TEST, testContext } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { soloGreedy } from "./support/solo_run.ts";

const PRESETS = ["tiny-qwen3", "tiny-qwen2", "tiny-llama", "tiny-gpt2"] as const;
const MAX_TOKENS = 12;

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
