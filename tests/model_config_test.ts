import assert from "node:assert/strict";
import { type ModelConfig, parseModelConfig, ropeInvFreq } from "../engine/model/config.ts";
import { ConfigError } from "../engine/model/errors.ts";
import { parseGenerationConfig } from "../engine/model/generation_config.ts";
import { ropeInvFreqReference } from "./reference/safetensors.ts";

/** Asserts `fn` throws a one-line ConfigError matching `pattern`. */
function assertConfigError(fn: () => unknown, pattern: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ConfigError, `expected ConfigError, got ${e}`);
    assert.ok(!e.message.includes("\n"), `message is not one line: ${e.message}`);
    assert.match(e.message, pattern);
    return true;
  });
}

/** Qwen3-0.6B's config.json (transformers 4.x), abridged to what matters plus noise. */
const qwen3v4 = {
  architectures: ["Qwen3ForCausalLM"],
  attention_bias: false,
  attention_dropout: 0.0,
  bos_token_id: 151643,
  eos_token_id: 151645,
  head_dim: 128,
  hidden_act: "silu",
  hidden_size: 1024,
  initializer_range: 0.02,
  intermediate_size: 3072,
  max_position_embeddings: 40960,
  max_window_layers: 28,
  model_type: "qwen3",
  num_attention_heads: 16,
  num_hidden_layers: 28,
  num_key_value_heads: 8,
  rms_norm_eps: 1e-6,
  rope_scaling: null,
  rope_theta: 1000000,
  sliding_window: null,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  transformers_version: "4.51.0",
  use_cache: true,
  use_sliding_window: false,
  vocab_size: 151936,
};

/** The same model as transformers 5.x writes it: `rope_parameters` and `dtype`. */
function toV5(c: Record<string, unknown>, ropeExtra: Record<string, unknown> = {}) {
  const { rope_theta, rope_scaling: _s, torch_dtype, ...rest } = c;
  return {
    ...rest,
    dtype: torch_dtype,
    rope_parameters: { rope_type: "default", rope_theta, ...ropeExtra },
    transformers_version: "5.0.0",
  };
}

const qwen2v4 = {
  architectures: ["Qwen2ForCausalLM"],
  bos_token_id: 151643,
  eos_token_id: 151643,
  hidden_act: "silu",
  hidden_size: 896,
  intermediate_size: 4864,
  max_position_embeddings: 32768,
  model_type: "qwen2",
  num_attention_heads: 14,
  num_hidden_layers: 24,
  num_key_value_heads: 2,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000.0,
  sliding_window: 32768,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  use_sliding_window: false,
  vocab_size: 151936,
};

const llama32v4 = {
  architectures: ["LlamaForCausalLM"],
  attention_bias: false,
  bos_token_id: 128000,
  eos_token_id: [128001, 128008, 128009],
  head_dim: 64,
  hidden_act: "silu",
  hidden_size: 2048,
  intermediate_size: 8192,
  max_position_embeddings: 131072,
  mlp_bias: false,
  model_type: "llama",
  num_attention_heads: 32,
  num_hidden_layers: 16,
  num_key_value_heads: 8,
  rms_norm_eps: 1e-5,
  rope_scaling: {
    factor: 32.0,
    high_freq_factor: 4.0,
    low_freq_factor: 1.0,
    original_max_position_embeddings: 8192,
    rope_type: "llama3",
  },
  rope_theta: 500000.0,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  vocab_size: 128256,
};

const gpt2 = {
  activation_function: "gelu_new",
  architectures: ["GPT2LMHeadModel"],
  attn_pdrop: 0.1,
  bos_token_id: 50256,
  embd_pdrop: 0.1,
  eos_token_id: 50256,
  initializer_range: 0.02,
  layer_norm_epsilon: 1e-5,
  model_type: "gpt2",
  n_ctx: 1024,
  n_embd: 768,
  n_head: 12,
  n_inner: null,
  n_layer: 12,
  n_positions: 1024,
  vocab_size: 50257,
};

Deno.test("parseModelConfig() normalises Qwen3 configs in transformers 4.x and 5.x style alike", () => {
  const expected: ModelConfig = {
    arch: "Qwen3ForCausalLM",
    vocabSize: 151936,
    hiddenSize: 1024,
    numLayers: 28,
    numHeads: 16,
    numKvHeads: 8,
    headDim: 128,
    intermediateSize: 3072,
    normType: "rms",
    normEps: 1e-6,
    positionEmbedding: "rope",
    ropeTheta: 1000000,
    ropeScaling: { type: "none" },
    maxPositionEmbeddings: 40960,
    slidingWindow: null,
    tieWordEmbeddings: true,
    qkvBias: false,
    oProjBias: false,
    mlpBias: false,
    qkNorm: true,
    hiddenAct: "silu",
    bosTokenId: 151643,
    eosTokenIds: [151645],
    torchDtype: "bfloat16",
  };
  assert.deepEqual(parseModelConfig(qwen3v4), expected);
  assert.deepEqual(parseModelConfig(toV5(qwen3v4)), expected);
  // attention_bias is honoured; head_dim absent falls back to hidden / heads.
  const { head_dim: _h, ...noHeadDim } = qwen3v4;
  const c = parseModelConfig({ ...noHeadDim, attention_bias: true });
  assert.equal(c.headDim, 64);
  assert.equal(c.qkvBias, true);
  assert.ok(Object.isFrozen(c));
});

Deno.test("parseModelConfig() normalises Qwen2 configs: qkv bias always, kv heads, 4.x and 5.x", () => {
  for (const json of [qwen2v4, toV5(qwen2v4)]) {
    const c = parseModelConfig(json);
    assert.equal(c.arch, "Qwen2ForCausalLM");
    assert.equal(c.headDim, 64);
    assert.equal(c.numKvHeads, 2);
    assert.equal(c.qkvBias, true);
    assert.equal(c.oProjBias, false);
    assert.equal(c.qkNorm, false);
    assert.equal(c.ropeTheta, 1e6);
    assert.deepEqual(c.ropeScaling, { type: "none" });
    assert.deepEqual(c.eosTokenIds, [151643]);
    assert.equal(c.maxPositionEmbeddings, 32768);
  }
  // num_key_value_heads absent: one KV head per query head.
  const { num_key_value_heads: _k, ...mha } = qwen2v4;
  assert.equal(parseModelConfig(mha).numKvHeads, 14);
});

Deno.test("parseModelConfig() normalises Llama configs with llama3 rope scaling in 4.x (type and rope_type) and 5.x style", () => {
  const { rope_type: _t, ...scaling } = llama32v4.rope_scaling;
  const variants = [
    llama32v4,
    { ...llama32v4, rope_scaling: { ...scaling, type: "llama3" } },
    toV5(llama32v4, { ...llama32v4.rope_scaling }),
  ];
  for (const json of variants) {
    const c = parseModelConfig(json);
    assert.equal(c.arch, "LlamaForCausalLM");
    assert.equal(c.headDim, 64);
    assert.equal(c.ropeTheta, 500000);
    assert.deepEqual(c.ropeScaling, {
      type: "llama3",
      factor: 32,
      lowFreqFactor: 1,
      highFreqFactor: 4,
      originalMaxPositionEmbeddings: 8192,
    });
    assert.deepEqual(c.eosTokenIds, [128001, 128008, 128009]);
    assert.equal(c.normEps, 1e-5);
    assert.equal(c.qkvBias, false);
  }
  const biased = parseModelConfig({ ...llama32v4, attention_bias: true, mlp_bias: true });
  assert.deepEqual([biased.qkvBias, biased.oProjBias, biased.mlpBias], [true, true, true]);
  // Defaults of a minimal TinyLlama-like config.
  const minimal = parseModelConfig({
    architectures: ["LlamaForCausalLM"],
    hidden_size: 64,
    intermediate_size: 160,
    num_attention_heads: 4,
    num_hidden_layers: 2,
    vocab_size: 100,
  });
  assert.equal(minimal.ropeTheta, 10000);
  assert.equal(minimal.maxPositionEmbeddings, 2048);
  assert.equal(minimal.tieWordEmbeddings, false);
  assert.equal(minimal.hiddenAct, "silu");
  assert.deepEqual(minimal.eosTokenIds, []);
  assert.equal(minimal.bosTokenId, null);
  assert.equal(minimal.torchDtype, null);
});

Deno.test("parseModelConfig() normalises GPT-2 names: n_embd, n_inner null, gelu_new, learned positions", () => {
  const c = parseModelConfig(gpt2);
  assert.deepEqual(c, {
    arch: "GPT2LMHeadModel",
    vocabSize: 50257,
    hiddenSize: 768,
    numLayers: 12,
    numHeads: 12,
    numKvHeads: 12,
    headDim: 64,
    intermediateSize: 3072,
    normType: "layer",
    normEps: 1e-5,
    positionEmbedding: "learned",
    ropeTheta: 0,
    ropeScaling: { type: "none" },
    maxPositionEmbeddings: 1024,
    slidingWindow: null,
    tieWordEmbeddings: true,
    qkvBias: true,
    oProjBias: true,
    mlpBias: true,
    qkNorm: false,
    hiddenAct: "gelu_tanh",
    bosTokenId: 50256,
    eosTokenIds: [50256],
    torchDtype: null,
  });
  assert.equal(
    parseModelConfig({ ...gpt2, n_inner: 1000, dtype: "float32" }).intermediateSize,
    1000,
  );
  assert.equal(parseModelConfig({ ...gpt2, torch_dtype: "float32" }).torchDtype, "float32");
  assert.throws(() => ropeInvFreq(c), /GPT2LMHeadModel has no RoPE/);
});

Deno.test("parseModelConfig() rejects unsupported architectures, rope types and missing fields in one line", () => {
  assertConfigError(
    () => parseModelConfig({ ...qwen3v4, architectures: ["MixtralForCausalLM"] }),
    /^config\.json: unsupported architectures \["MixtralForCausalLM"\]/,
  );
  const { architectures: _a, ...noArch } = qwen3v4;
  assertConfigError(() => parseModelConfig(noArch), /missing required field "architectures"/);
  assertConfigError(
    () => parseModelConfig({ ...llama32v4, rope_scaling: { rope_type: "yarn", factor: 4 } }),
    /^config\.json: unsupported rope_scaling\.rope_type "yarn"/,
  );
  assertConfigError(
    () => parseModelConfig({ ...llama32v4, rope_scaling: { type: "dynamic", factor: 4 } }),
    /unsupported rope_scaling\.type "dynamic"/,
  );
  assertConfigError(
    () => parseModelConfig(toV5(llama32v4, { rope_type: "longrope" })),
    /unsupported rope_parameters\.rope_type "longrope"/,
  );
  assertConfigError(
    () => parseModelConfig({ ...llama32v4, rope_scaling: { rope_type: "llama3", factor: 8 } }),
    /missing required field "rope_scaling\.low_freq_factor"/,
  );
  for (
    const field of [
      "hidden_size",
      "vocab_size",
      "num_hidden_layers",
      "num_attention_heads",
      "intermediate_size",
    ]
  ) {
    const json: Record<string, unknown> = { ...qwen2v4 };
    delete json[field];
    assertConfigError(
      () => parseModelConfig(json),
      new RegExp(`^config\\.json: missing required field "${field}"$`),
    );
  }
  const { n_embd: _e, ...noEmbd } = gpt2;
  assertConfigError(() => parseModelConfig(noEmbd), /missing required field "n_embd"/);
  assertConfigError(
    () => parseModelConfig({ ...qwen2v4, hidden_size: "896" }),
    /^config\.json: invalid field "hidden_size": "896"/,
  );
  assertConfigError(
    () => parseModelConfig({ ...qwen2v4, hidden_act: "relu" }),
    /unsupported hidden_act "relu"/,
  );
  assertConfigError(
    () => parseModelConfig({ ...qwen2v4, num_key_value_heads: 3 }),
    /num_attention_heads 14 is not a multiple of num_key_value_heads 3/,
  );
  assertConfigError(
    () => parseModelConfig({ ...qwen2v4, use_sliding_window: true }),
    /^config\.json: use_sliding_window true is not supported$/,
  );
  assertConfigError(() => parseModelConfig([1]), /expected a JSON object/);
  assertConfigError(() => parseModelConfig(noArch, "/m/config.json"), /^\/m\/config\.json: /);
});

Deno.test("ropeInvFreq() matches transformers' default, linear and llama3 frequencies", () => {
  const qwen3 = parseModelConfig(qwen3v4);
  const got3 = ropeInvFreq(qwen3);
  assert.equal(got3.length, 64);
  assert.deepEqual([...got3], ropeInvFreqReference(128, 1e6, { type: "none" }));
  assert.equal(got3[0], 1);

  const linear = parseModelConfig({ ...qwen2v4, rope_scaling: { type: "linear", factor: 4 } });
  const gotLinear = ropeInvFreq(linear);
  const refLinear = ropeInvFreqReference(64, 1e6, { type: "linear", factor: 4 });
  gotLinear.forEach((v, i) => assert.ok(Math.abs(v - refLinear[i]!) <= 1e-15 * refLinear[i]!));

  const llama = parseModelConfig(llama32v4);
  const got = ropeInvFreq(llama);
  const ref = ropeInvFreqReference(64, 500000, {
    type: "llama3",
    factor: 32,
    low: 1,
    high: 4,
    original: 8192,
  });
  assert.equal(got.length, 32);
  got.forEach((v, i) => {
    assert.ok(Math.abs(v - ref[i]!) <= 1e-12 * ref[i]!, `pair ${i}: ${v} vs ${ref[i]}`);
  });
  // The three bands: high frequencies unchanged, low ones divided by the factor, and a smooth
  // band in between (for these parameters pairs 13..16 or so).
  const base = ropeInvFreqReference(64, 500000, { type: "none" });
  assert.equal(got[0], base[0]);
  assert.equal(got[31], base[31]! / 32);
  const medium = got.filter((v, i) => v !== base[i] && v !== base[i]! / 32).length;
  assert.ok(medium >= 2 && medium <= 8, `${medium} smoothed pairs`);
  for (let i = 1; i < got.length; i++) assert.ok(got[i]! < got[i - 1]!, "decreasing");
});

Deno.test("parseGenerationConfig() reads sampling defaults and eos lists, ignoring unknown fields", () => {
  const g = parseGenerationConfig({
    bos_token_id: 151643,
    do_sample: true,
    eos_token_id: [151645, 151643],
    pad_token_id: 151643,
    temperature: 0.6,
    top_k: 20,
    top_p: 0.95,
    min_p: 0,
    repetition_penalty: 1.1,
    max_new_tokens: 256,
    max_length: 4096,
    transformers_version: "4.51.0",
  });
  assert.deepEqual(g, {
    bosTokenId: 151643,
    eosTokenIds: [151645, 151643],
    padTokenId: 151643,
    doSample: true,
    temperature: 0.6,
    topP: 0.95,
    topK: 20,
    minP: 0,
    repetitionPenalty: 1.1,
    maxNewTokens: 256,
    maxLength: 4096,
  });
  assert.deepEqual(parseGenerationConfig({ eos_token_id: 50256, pad_token_id: null }), {
    eosTokenIds: [50256],
  });
  assert.deepEqual(parseGenerationConfig({}), {});
  assertConfigError(
    () => parseGenerationConfig({ temperature: "hot" }),
    /^generation_config\.json: invalid field "temperature": "hot"/,
  );
  assertConfigError(() => parseGenerationConfig({ top_p: 1.5 }), /invalid field "top_p": 1\.5/);
  assertConfigError(
    () => parseGenerationConfig({ eos_token_id: [1, -2] }),
    /invalid field "eos_token_id\.1": \[1,-2\]/,
  );
});

Deno.test("parseModelConfig() refuses an activation the architecture's kernels do not compute", () => {
  assert.throws(
    () => parseModelConfig({ ...qwen2v4, hidden_act: "gelu" }),
    /unsupported hidden_act "gelu" for this architecture \(its kernels compute silu\)/,
  );
  assert.throws(
    () =>
      parseModelConfig({
        architectures: ["GPT2LMHeadModel"],
        n_embd: 64,
        n_head: 4,
        n_layer: 2,
        vocab_size: 100,
        activation_function: "gelu",
      }),
    /unsupported activation_function "gelu" for this architecture \(its kernels compute gelu_new\)/,
  );
});
