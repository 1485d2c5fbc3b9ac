/**
 * Checkpoints in every layout transformers loads: GPT-2 as the hub ships it (unprefixed keys,
 * causal-mask buffers, no `lm_head`), base-model (unprefixed) files of the Llama family, and
 * `save_pretrained`'s prefixed layout hold the same model and generate the same tokens.
 */

import assert from "node:assert/strict";
import { LLMEngine } from "../engine/llm_engine.ts";
import { CheckpointError } from "../engine/model/errors.ts";
import { openCheckpoint } from "../engine/model/checkpoint.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import type { CheckpointLayout } from "../tools/checkpoint_layout.ts";
import { makeModel, parseMakeModelArgs } from "../tools/make_model.ts";
import { GPU_TEST } from "./support/gpu.ts";

async function withModels(
  preset: string,
  layouts: readonly CheckpointLayout[],
  fn: (dirs: Record<string, string>) => Promise<void>,
): Promise<void> {
  const root = await Deno.makeTempDir();
  try {
    const dirs: Record<string, string> = {};
    for (const layout of layouts) {
      dirs[layout] = `${root}/${layout}`;
      await makeModel({ out: dirs[layout]!, preset, dtype: "f32", seed: 21, layout });
    }
    await fn(dirs);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
}

Deno.test("openCheckpoint() reads GPT-2 as the hub ships it: unprefixed keys, mask buffers left out", async () => {
  await withModels("tiny-gpt2", ["save-pretrained", "hub"], async (dirs) => {
    const hub = await openCheckpoint(dirs.hub!);
    const saved = await openCheckpoint(dirs["save-pretrained"]!);
    try {
      assert.equal(hub.names.layout, "unprefixed");
      assert.equal(saved.names.layout, "prefixed");
      const stored = new Set(hub.names.buffers);
      assert.ok(stored.has("h.0.attn.bias") && stored.has("h.0.attn.masked_bias"));
      assert.ok(hub.has("transformer.wte.weight") && hub.has("transformer.h.1.mlp.c_fc.bias"));
      assert.ok(!hub.has("h.0.attn.bias") && !hub.has("transformer.h.0.attn.bias"));
      assert.ok(!hub.has("lm_head.weight"));
      assert.deepEqual([...hub.tensors.keys()].sort(), [...saved.tensors.keys()].sort());
      for (const name of ["transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"]) {
        assert.deepEqual(await hub.readTensor(name), await saved.readTensor(name), name);
      }
      assert.throws(
        () => hub.tensor("transformer.h.9.attn.c_attn.weight"),
        (e: unknown) =>
          e instanceof CheckpointError &&
          /^transformer\.h\.9\.attn\.c_attn\.weight: tensor not found in model\.safetensors of .* \(layout: unprefixed, as the hub ships some models; looked for "h\.9\.attn\.c_attn\.weight"\)$/
            .test(e.message),
      );
    } finally {
      hub.close();
      saved.close();
    }
  });
});

async function greedy(dir: string): Promise<number[]> {
  const engine = await LLMEngine.create({ model: dir, showProgress: false, forceF32: true });
  try {
    const out: number[] = [];
    const stream = engine.generate({
      requestId: "a",
      promptTokenIds: [5, 17, 2, 9, 33, 4],
      params: samplingParams({ temperature: 0, maxTokens: 8, ignoreEos: true }),
    });
    for await (const o of stream) out.push(...o.tokenIds);
    return out;
  } finally {
    await engine.shutdown();
  }
}

for (
  const [preset, layouts] of [
    ["tiny-gpt2", ["save-pretrained", "hub", "unprefixed"]],
    ["tiny-llama", ["save-pretrained", "unprefixed"]],
    ["tiny-qwen3", ["save-pretrained", "unprefixed"]],
  ] as const
) {
  Deno.test(
    `LLMEngine generates the same greedy tokens from ${preset} in layouts ${layouts.join(", ")}`,
    GPU_TEST,
    async () => {
      await withModels(preset, layouts, async (dirs) => {
        const expected = await greedy(dirs["save-pretrained"]!);
        assert.equal(expected.length, 8);
        for (const layout of layouts.slice(1)) {
          assert.deepEqual(await greedy(dirs[layout]!), expected, layout);
        }
      });
    },
  );
}

Deno.test("parseMakeModelArgs() takes --layout and rejects an unknown one", () => {
  const base = ["--out", "/tmp/x", "--preset", "tiny-gpt2"];
  assert.equal(parseMakeModelArgs([...base, "--layout", "hub"]).layout, "hub");
  assert.equal(parseMakeModelArgs(base).layout, undefined);
  assert.throws(() => parseMakeModelArgs([...base, "--layout", "gguf"]), /--layout must be/);
});
