/**
 * The JSON files of a preset's checkpoint as `transformers` writes them for its architecture:
 * `config.json` ({@linkcode presetConfig}), `generation_config.json`, `tokenizer_config.json`
 * (with a chat template) and `special_tokens_map.json` (presets in engine/model/presets.ts).
 *
 * @module
 */

import {
  type Architecture,
  type CheckpointDtype,
  ENDOFTEXT,
  IM_END,
  IM_START,
  intermediateSizeOf,
  type ModelPreset,
  vocabSizeOf,
} from "./presets.ts";

/**
 * The ChatML template of the Qwen presets: `<|im_start|>{role}\n{content}<|im_end|>\n` per
 * message, then `<|im_start|>assistant\n` when `add_generation_prompt`.
 */
export const CHATML_TEMPLATE = "{%- for message in messages %}" +
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}" +
  "{%- endfor %}" +
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/**
 * The Llama presets' template: ChatML preceded by `bos_token`, as Llama 3 templates start with
 * `<|begin_of_text|>` (so chat prompts are encoded without adding special tokens).
 */
export const LLAMA_CHAT_TEMPLATE = "{{- bos_token }}" + CHATML_TEMPLATE;

/**
 * GPT-2 has no chat template in reality; the generated checkpoints get a plain one so chat
 * requests work: `{role}: {content}\n` per message, then `assistant:` when
 * `add_generation_prompt`.
 */
export const PLAIN_CHAT_TEMPLATE = "{%- for message in messages %}" +
  "{{- message['role'] + ': ' + message['content'] + '\\n' }}" +
  "{%- endfor %}" +
  "{%- if add_generation_prompt %}{{- 'assistant:' }}{%- endif %}";

/** Ids of a preset's special tokens in its generated tokenizer. */
export interface SpecialIds {
  bos: number;
  eos: number;
  /** `<|endoftext|>`. */
  endoftext: number;
}

const DTYPE_NAMES: Record<CheckpointDtype, string> = {
  f32: "float32",
  f16: "float16",
  bf16: "bfloat16",
};

/** A preset's BOS/EOS ids: BOS is `<|endoftext|>`; EOS is `<|im_end|>` (GPT-2: `<|endoftext|>`). */
export function specialIdsOf(preset: ModelPreset, ids: ReadonlyMap<string, number>): SpecialIds {
  const get = (t: string) => {
    const id = ids.get(t);
    if (id === undefined) throw new RangeError(`Tokenizer of ${preset.name} lacks ${t}`);
    return id;
  };
  const endoftext = get(ENDOFTEXT);
  const eos = preset.architecture === "gpt2" ? endoftext : get(IM_END);
  return { bos: endoftext, eos, endoftext };
}

/** The `transformers_version` the generated JSON files carry. */
const TRANSFORMERS_VERSION = "4.51.3";

/**
 * `config.json` as `transformers` writes it for the preset's architecture (field names, order
 * and defaults of `Qwen3Config`, `Qwen2Config`, `LlamaConfig`, `GPT2Config`; keys sorted, as
 * `transformers` writes them).
 */
export function presetConfig(
  preset: ModelPreset,
  dtype: CheckpointDtype,
  ids: SpecialIds,
): Record<string, unknown> {
  const p = preset;
  switch (p.architecture) {
    case "qwen3":
      return sortedKeys({
        ...decoderConfig(p, dtype, ids),
        architectures: ["Qwen3ForCausalLM"],
        attention_bias: false,
        head_dim: p.headDim,
        max_window_layers: p.numLayers,
        sliding_window: null,
        use_sliding_window: false,
      });
    case "qwen2":
      return sortedKeys({
        ...decoderConfig(p, dtype, ids),
        architectures: ["Qwen2ForCausalLM"],
        max_window_layers: p.numLayers,
        sliding_window: p.maxPositions,
        use_sliding_window: false,
      });
    case "llama":
      return sortedKeys({
        ...decoderConfig(p, dtype, ids),
        architectures: ["LlamaForCausalLM"],
        attention_bias: false,
        head_dim: p.headDim,
        mlp_bias: false,
        pretraining_tp: 1,
      });
    case "gpt2":
      return gpt2Config(p, dtype, ids);
  }
}

/** The fields the Qwen3, Qwen2 and Llama configs share (unsorted). */
function decoderConfig(
  p: ModelPreset,
  dtype: CheckpointDtype,
  ids: SpecialIds,
): Record<string, unknown> {
  return {
    attention_dropout: 0.0,
    bos_token_id: ids.bos,
    eos_token_id: ids.eos,
    hidden_act: "silu",
    hidden_size: p.hiddenSize,
    initializer_range: 0.02,
    intermediate_size: intermediateSizeOf(p),
    max_position_embeddings: p.maxPositions,
    model_type: p.architecture,
    num_attention_heads: p.numHeads,
    num_hidden_layers: p.numLayers,
    num_key_value_heads: p.numKvHeads,
    rms_norm_eps: p.normEps,
    rope_scaling: p.ropeScaling,
    rope_theta: p.ropeTheta,
    tie_word_embeddings: p.tieWordEmbeddings,
    torch_dtype: DTYPE_NAMES[dtype],
    transformers_version: TRANSFORMERS_VERSION,
    use_cache: true,
    vocab_size: vocabSizeOf(p),
  };
}

/** `GPT2Config`'s `config.json`. */
function gpt2Config(
  p: ModelPreset,
  dtype: CheckpointDtype,
  ids: SpecialIds,
): Record<string, unknown> {
  return {
    activation_function: "gelu_new",
    architectures: ["GPT2LMHeadModel"],
    attn_pdrop: 0.1,
    bos_token_id: ids.bos,
    embd_pdrop: 0.1,
    eos_token_id: ids.eos,
    initializer_range: 0.02,
    layer_norm_epsilon: p.normEps,
    model_type: "gpt2",
    n_ctx: p.maxPositions,
    n_embd: p.hiddenSize,
    n_head: p.numHeads,
    n_inner: p.intermediateSize,
    n_layer: p.numLayers,
    n_positions: p.maxPositions,
    reorder_and_upcast_attn: false,
    resid_pdrop: 0.1,
    scale_attn_by_inverse_layer_idx: false,
    scale_attn_weights: true,
    summary_activation: null,
    summary_first_dropout: 0.1,
    summary_proj_to_labels: true,
    summary_type: "cls_index",
    summary_use_proj: true,
    task_specific_params: { "text-generation": { do_sample: true, max_length: 50 } },
    tie_word_embeddings: true,
    torch_dtype: DTYPE_NAMES[dtype],
    transformers_version: TRANSFORMERS_VERSION,
    use_cache: true,
    vocab_size: vocabSizeOf(p),
  };
}

/** `o` with its keys in code-point order (Python's `json.dumps(..., sort_keys=True)`). */
function sortedKeys(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(o).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)),
  );
}

/** Sampling defaults of the real models' `generation_config.json`, by architecture. */
const SAMPLING_DEFAULTS: Readonly<Record<Exclude<Architecture, "gpt2">, Record<string, number>>> = {
  qwen3: { temperature: 0.6, top_k: 20, top_p: 0.95 },
  qwen2: { repetition_penalty: 1.1, temperature: 0.7, top_k: 20, top_p: 0.8 },
  llama: { temperature: 0.6, top_p: 0.9 },
};

/** `generation_config.json` for the preset (sampling defaults of the real model). */
export function presetGenerationConfig(
  preset: ModelPreset,
  ids: SpecialIds,
): Record<string, unknown> {
  const arch = preset.architecture;
  if (arch === "gpt2") {
    return {
      _from_model_config: true,
      bos_token_id: ids.bos,
      eos_token_id: ids.eos,
      transformers_version: TRANSFORMERS_VERSION,
    };
  }
  return sortedKeys({
    bos_token_id: ids.bos,
    do_sample: true,
    eos_token_id: [ids.eos, ids.endoftext],
    // Qwen's pad token; Llama 3 has none.
    ...(arch === "llama" ? {} : { pad_token_id: ids.endoftext }),
    ...SAMPLING_DEFAULTS[arch],
    transformers_version: TRANSFORMERS_VERSION,
  });
}

function addedTokensDecoder(ids: ReadonlyMap<string, number>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [content, id] of ids) {
    out[String(id)] = {
      content,
      lstrip: false,
      normalized: false,
      rstrip: false,
      single_word: false,
      special: true,
    };
  }
  return out;
}

/**
 * `tokenizer_config.json` for the preset: special tokens, `add_bos_token` (true for Llama, whose
 * tokenizer prepends `<|endoftext|>` as BOS), `clean_up_tokenization_spaces: false` (so decoding
 * is the exact inverse of encoding) and the chat template.
 */
export function presetTokenizerConfig(
  preset: ModelPreset,
  ids: ReadonlyMap<string, number>,
): Record<string, unknown> {
  const common = {
    added_tokens_decoder: addedTokensDecoder(ids),
    clean_up_tokenization_spaces: false,
    model_max_length: preset.maxPositions,
  };
  switch (preset.architecture) {
    case "gpt2":
      return {
        add_bos_token: false,
        add_prefix_space: false,
        ...common,
        bos_token: ENDOFTEXT,
        chat_template: PLAIN_CHAT_TEMPLATE,
        eos_token: ENDOFTEXT,
        errors: "replace",
        pad_token: null,
        tokenizer_class: "GPT2Tokenizer",
        unk_token: ENDOFTEXT,
      };
    case "llama":
      return {
        add_bos_token: true,
        ...common,
        bos_token: ENDOFTEXT,
        chat_template: LLAMA_CHAT_TEMPLATE,
        eos_token: IM_END,
        model_input_names: ["input_ids", "attention_mask"],
        tokenizer_class: "PreTrainedTokenizerFast",
      };
    default:
      return {
        add_bos_token: false,
        add_prefix_space: false,
        ...common,
        additional_special_tokens: [IM_START, IM_END],
        bos_token: null,
        chat_template: CHATML_TEMPLATE,
        eos_token: IM_END,
        errors: "replace",
        pad_token: ENDOFTEXT,
        split_special_tokens: false,
        tokenizer_class: "Qwen2Tokenizer",
        unk_token: null,
      };
  }
}

/** `special_tokens_map.json` for the preset. */
export function presetSpecialTokensMap(preset: ModelPreset): Record<string, unknown> {
  const tok = (content: string) => ({
    content,
    lstrip: false,
    normalized: false,
    rstrip: false,
    single_word: false,
  });
  switch (preset.architecture) {
    case "gpt2":
      return { bos_token: tok(ENDOFTEXT), eos_token: tok(ENDOFTEXT), unk_token: tok(ENDOFTEXT) };
    case "llama":
      return { bos_token: tok(ENDOFTEXT), eos_token: tok(IM_END) };
    default:
      return {
        additional_special_tokens: [IM_START, IM_END],
        eos_token: tok(IM_END),
        pad_token: tok(ENDOFTEXT),
      };
  }
}
