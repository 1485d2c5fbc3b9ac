/**
 * Llama-family checkpoints small-model users run, with their own settings: SmolLM2 (tied
 * embeddings, rope_theta 100000, no head_dim), TinyLlama (rope_theta 10000, untied, 2048
 * positions) and `MistralForCausalLM` (Llama's layout without biases plus a `sliding_window`,
 * served where the window changes nothing: `max_model_len` at most the window, a longer one
 * refused naming the setting). Greedy tokens equal the float64 reference.
 */

import assert from "node:assert/strict";
import { LLMEngine } from "../engine/llm_engine.ts";
import { parseModelConfig } from "../engine/model/config.ts";
import { CheckpointError } from "../engine/model/errors.ts";
import { encodeTensorData, writeSafetensors } from "../engine/model/safetensors.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import { makeModel } from "../tools/make_model.ts";
import { ReferenceModel } from "./reference/model.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { referenceRun } from "./support/solo_run.ts";

const WINDOW = 48;

/** tiny-llama's tensors under another config.json (the fields as transformers writes them). */
async function rewriteConfig(
  dir: string,
  make: (llama: Record<string, unknown>) => Record<string, unknown>,
): Promise<void> {
  await makeModel({ out: dir, preset: "tiny-llama", dtype: "f32", seed: 13 });
  const llama = JSON.parse(await Deno.readTextFile(`${dir}/config.json`));
  await Deno.writeTextFile(`${dir}/config.json`, JSON.stringify(make(llama), null, 2));
}

/** A Mistral checkpoint: tiny-llama's tensors under a MistralConfig. */
function makeMistral(dir: string): Promise<void> {
  return rewriteConfig(dir, (llama) => ({
    architectures: ["MistralForCausalLM"],
    model_type: "mistral",
    attention_dropout: 0.0,
    bos_token_id: llama.bos_token_id,
    eos_token_id: llama.eos_token_id,
    head_dim: llama.head_dim,
    hidden_act: "silu",
    hidden_size: llama.hidden_size,
    initializer_range: 0.02,
    intermediate_size: llama.intermediate_size,
    max_position_embeddings: 4096,
    num_attention_heads: llama.num_attention_heads,
    num_hidden_layers: llama.num_hidden_layers,
    num_key_value_heads: llama.num_key_value_heads,
    rms_norm_eps: llama.rms_norm_eps,
    rope_theta: 10000.0,
    sliding_window: WINDOW,
    tie_word_embeddings: false,
    torch_dtype: "float32",
    vocab_size: llama.vocab_size,
  }));
}

Deno.test("parseModelConfig() reads MistralForCausalLM as Llama's layout with its sliding window", () => {
  const c = parseModelConfig({
    architectures: ["MistralForCausalLM"],
    hidden_size: 64,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    num_hidden_layers: 2,
    intermediate_size: 128,
    vocab_size: 100,
    sliding_window: 4096,
  });
  assert.equal(c.arch, "MistralForCausalLM");
  assert.equal(c.slidingWindow, 4096);
  assert.deepEqual([c.qkvBias, c.oProjBias, c.mlpBias, c.qkNorm], [false, false, false, false]);
  const none = parseModelConfig({
    architectures: ["MistralForCausalLM"],
    hidden_size: 64,
    num_attention_heads: 4,
    num_hidden_layers: 2,
    intermediate_size: 128,
    vocab_size: 100,
    sliding_window: null,
  });
  assert.equal(none.slidingWindow, null);
});

Deno.test(
  "LLMEngine serves a Mistral checkpoint within its sliding window, equal to the float64 reference",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      await makeMistral(dir);
      await assert.rejects(
        LLMEngine.create({ model: dir, maxModelLen: WINDOW + 1, showProgress: false }),
        new RegExp(`max_model_len ${WINDOW + 1} exceeds the model's sliding_window ${WINDOW}`),
      );
      // The default max_model_len is the window; the prompt and output fill it.
      const prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38];
      await checkParity(dir, prompt, WINDOW - prompt.length, WINDOW);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

/**
 * Greedy tokens of the engine (f32 on the device) equal those of the float64 reference on
 * `dir`, except after a near-tie of the reference's logits; checks the engine's max_model_len
 * when `maxModelLen` is given.
 */
async function checkParity(
  dir: string,
  prompt: readonly number[],
  maxTokens: number,
  maxModelLen?: number,
): Promise<void> {
  const engine = await LLMEngine.create({ model: dir, showProgress: false, forceF32: true });
  try {
    if (maxModelLen !== undefined) assert.equal(engine.model.maxModelLen, maxModelLen);
    const ref = await ReferenceModel.load(dir);
    const out: number[] = [];
    const stream = engine.generate({
      requestId: "p",
      promptTokenIds: prompt,
      params: samplingParams({ temperature: 0, maxTokens, ignoreEos: true }),
    });
    for await (const o of stream) out.push(...o.tokenIds);
    const expected = referenceRun(ref, prompt, maxTokens);
    for (let i = 0; i < maxTokens; i++) {
      if (expected[i]!.gap < 1e-4) break;
      assert.equal(out[i], expected[i]!.token, `token ${i}`);
    }
  } finally {
    await engine.shutdown();
  }
}

for (
  const [name, make] of [
    [
      "SmolLM2 (tied, rope_theta 100000, no head_dim)",
      (l: Record<string, unknown>) => {
        const { head_dim: _h, rope_scaling: _r, ...rest } = l;
        return { ...rest, tie_word_embeddings: true, rope_theta: 100000.0, pretraining_tp: 1 };
      },
    ],
    [
      "TinyLlama (rope_theta 10000, 2048 positions)",
      (l: Record<string, unknown>) => ({
        ...l,
        rope_scaling: null,
        rope_theta: 10000.0,
        max_position_embeddings: 2048,
      }),
    ],
  ] as const
) {
  Deno.test(
    `LLMEngine runs a ${name} checkpoint equal to the float64 reference`,
    GPU_TEST,
    async () => {
      const dir = await Deno.makeTempDir();
      try {
        await rewriteConfig(dir, make);
        await checkParity(dir, [7, 1, 8, 2, 8, 1, 8, 2, 8], 12);
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    },
  );
}

Deno.test(
  "ModelRunner refuses a checkpoint with weights its config does not account for",
  GPU_TEST,
  async () => {
    // A Llama checkpoint whose config says attention_bias false but which holds an o_proj bias:
    // serving it without the bias would be a wrong answer, so loading fails naming the tensor.
    const dir = await Deno.makeTempDir();
    try {
      await makeModel({ out: dir, preset: "tiny-llama", dtype: "f32", seed: 2, shards: 2 });
      const bias = "model.layers.0.self_attn.o_proj.bias";
      const hidden = JSON.parse(await Deno.readTextFile(`${dir}/config.json`)).hidden_size;
      await writeSafetensors(`${dir}/extra.safetensors`, [{
        name: bias,
        dtype: "F32",
        shape: [hidden],
        data: () => encodeTensorData(new Float32Array(hidden).fill(0.5), "F32"),
      }], { format: "pt" });
      const indexPath = `${dir}/model.safetensors.index.json`;
      const index = JSON.parse(await Deno.readTextFile(indexPath));
      index.weight_map[bias] = "extra.safetensors";
      await Deno.writeTextFile(indexPath, JSON.stringify(index));
      await assert.rejects(
        LLMEngine.create({ model: dir, showProgress: false }),
        (e: unknown) =>
          e instanceof CheckpointError &&
          e.message.includes(
            `1 weight(s) the LlamaForCausalLM config does not account for: ${bias}`,
          ),
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

for (
  const [setting, message] of [["attention_bias", /attention_bias true is not supported/], [
    "mlp_bias",
    /mlp_bias true is not supported/,
  ]] as const
) {
  Deno.test(
    `LLMEngine refuses a Llama checkpoint with ${setting} true, naming the setting`,
    GPU_TEST,
    async () => {
      const dir = await Deno.makeTempDir();
      try {
        await rewriteConfig(dir, (l) => ({ ...l, [setting]: true }));
        await assert.rejects(LLMEngine.create({ model: dir, showProgress: false }), message);
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    },
  );
}

Deno.test(
  "LLMEngine refuses a GPT-2 checkpoint with tie_word_embeddings false, naming the setting",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      await makeModel({ out: dir, preset: "tiny-gpt2", dtype: "f32", seed: 3 });
      const config = JSON.parse(await Deno.readTextFile(`${dir}/config.json`));
      await Deno.writeTextFile(
        `${dir}/config.json`,
        JSON.stringify({ ...config, tie_word_embeddings: false }),
      );
      await assert.rejects(
        LLMEngine.create({ model: dir, showProgress: false }),
        /GPT2LMHeadModel with tie_word_embeddings false is not supported yet/,
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);
