/**
 * The JSON files of a preset's checkpoint as `transformers` writes them for its architecture:
 * `config.json` ({@linkcode presetConfig}), `generation_config.json`, `tokenizer_config.json`
 * (with a chat template) and `special_tokens_map.json` (presets in engine/model/presets.ts).
 *
 * @module
 */

import {
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

/**
 * `config.json` as `transformers` writes it for the preset's architecture (field names, order
 * and defaults of `Qwen3Config`, `Qwen2Config`, `LlamaConfig`, `GPT2Config`).
 */
export function presetConfig(
  preset: ModelPreset,
  dtype: CheckpointDtype,
  ids: SpecialIds,
): Record<string, unknown> {
  const p = preset;
  const torchDtype = DTYPE_NAMES[dtype];
  const version = "4.51.3";
  const vocab = vocabSizeOf(p);
  switch (p.architecture) {
    case "qwen3":
      return {
        architectures: ["Qwen3ForCausalLM"],
        attention_bias: false,
        attention_dropout: 0.0,
        bos_token_id: ids.bos,
        eos_token_id: ids.eos,
        head_dim: p.headDim,
        hidden_act: "silu",
        hidden_size: p.hiddenSize,
        initializer_range: 0.02,
        intermediate_size: intermediateSizeOf(p),
        max_position_embeddings: p.maxPositions,
        max_window_layers: p.numLayers,
        model_type: "qwen3",
        num_attention_heads: p.numHeads,
        num_hidden_layers: p.numLayers,
        num_key_value_heads: p.numKvHeads,
        rms_norm_eps: p.normEps,
        rope_scaling: p.ropeScaling,
        rope_theta: p.ropeTheta,
        sliding_window: null,
        tie_word_embeddings: p.tieWordEmbeddings,
        torch_dtype: torchDtype,
        transformers_version: version,
        use_cache: true,
        use_sliding_window: false,
        vocab_size: vocab,
      };
    case "qwen2":
      return {
        architectures: ["Qwen2ForCausalLM"],
        attention_dropout: 0.0,
        bos_token_id: ids.bos,
        eos_token_id: ids.eos,
        hidden_act: "silu",
        hidden_size: p.hiddenSize,
        initializer_range: 0.02,
        intermediate_size: intermediateSizeOf(p),
        max_position_embeddings: p.maxPositions,
        max_window_layers: p.numLayers,
        model_type: "qwen2",
        num_attention_heads: p.numHeads,
        num_hidden_layers: p.numLayers,
        num_key_value_heads: p.numKvHeads,
        rms_norm_eps: p.normEps,
        rope_scaling: p.ropeScaling,
        rope_theta: p.ropeTheta,
        sliding_window: p.maxPositions,
        tie_word_embeddings: p.tieWordEmbeddings,
        torch_dtype: torchDtype,
        transformers_version: version,
        use_cache: true,
        use_sliding_window: false,
        vocab_size: vocab,
      };
    case "llama":
      return {
        architectures: ["LlamaForCausalLM"],
        attention_bias: false,
        attention_dropout: 0.0,
        bos_token_id: ids.bos,
        eos_token_id: ids.eos,
        head_dim: p.headDim,
        hidden_act: "silu",
        hidden_size: p.hiddenSize,
        initializer_range: 0.02,
        intermediate_size: intermediateSizeOf(p),
        max_position_embeddings: p.maxPositions,
        mlp_bias: false,
        model_type: "llama",
        num_attention_heads: p.numHeads,
        num_hidden_layers: p.numLayers,
        num_key_value_heads: p.numKvHeads,
        pretraining_tp: 1,
        rms_norm_eps: p.normEps,
        rope_scaling: p.ropeScaling,
        rope_theta: p.ropeTheta,
        tie_word_embeddings: p.tieWordEmbeddings,
        torch_dtype: torchDtype,
        transformers_version: version,
        use_cache: true,
        vocab_size: vocab,
      };
    case "gpt2":
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
        torch_dtype: torchDtype,
        transformers_version: version,
        use_cache: true,
        vocab_size: vocab,
      };
  }
}

/** `generation_config.json` for the preset (sampling defaults of the real model). */
export function presetGenerationConfig(
  preset: ModelPreset,
  ids: SpecialIds,
): Record<string, unknown> {
  const version = "4.51.3";
  switch (preset.architecture) {
    case "qwen3":
      return {
        bos_token_id: ids.bos,
        do_sample: true,
        eos_token_id: [ids.eos, ids.endoftext],
        pad_token_id: ids.endoftext,
        temperature: 0.6,
        top_k: 20,
        top_p: 0.95,
        transformers_version: version,
      };
    case "qwen2":
      return {
        bos_token_id: ids.bos,
        do_sample: true,
        eos_token_id: [ids.eos, ids.endoftext],
        pad_token_id: ids.endoftext,
        repetition_penalty: 1.1,
        temperature: 0.7,
        top_k: 20,
        top_p: 0.8,
        transformers_version: version,
      };
    case "llama":
      return {
        bos_token_id: ids.bos,
        do_sample: true,
        eos_token_id: [ids.eos, ids.endoftext],
        temperature: 0.6,
        top_p: 0.9,
        transformers_version: version,
      };
    case "gpt2":
      return {
        _from_model_config: true,
        bos_token_id: ids.bos,
        eos_token_id: ids.eos,
        transformers_version: version,
      };
  }
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
