/**
 * The tensors of a preset's checkpoint: exact Hugging Face names and shapes, and how each one's
 * random values are drawn ({@linkcode presetTensors}; presets in engine/model/presets.ts).
 *
 * @module
 */

import { intermediateSizeOf, type ModelPreset, vocabSizeOf } from "./presets.ts";

/** How a generated tensor's values are drawn. */
export type TensorInit =
  /** Normal(0, std): linear weights, embeddings, biases. */
  | { kind: "normal"; std: number }
  /** Normal(1, std): norm scales. */
  | { kind: "ones"; std: number };

/** One tensor of a checkpoint: its name, shape (outermost first) and how it is initialised. */
export interface TensorSpec {
  readonly name: string;
  readonly shape: readonly number[];
  readonly init: TensorInit;
}

/**
 * Every tensor of the preset's checkpoint, with the exact names and shapes of the real Hugging
 * Face checkpoints (`nn.Linear` weights are `[out, in]`; GPT-2's `Conv1D` weights are
 * `[in, out]`), in model order. Tied presets have no `lm_head.weight`.
 *
 * Values: token embeddings and linear weights Normal(0, 1 / sqrt(hidden or fan_in)) so that
 * every layer changes the residual stream as much as a trained one does, and tied LM heads give
 * logits of order 1 (with HF's `initializer_range` 0.02 everywhere, a random model's residual
 * stream is its input embedding, greedy decoding just repeats the last prompt token, which would
 * hide engine bugs such as feeding the wrong token, and top-2 logit gaps are too small to compare
 * reduced-precision runs); GPT-2's position embeddings Normal(0, 0.01); biases Normal(0, 0.02),
 * norm weights Normal(1, 0.02) and
 * LayerNorm biases Normal(0, 0.02) (noise, so a loader that swaps or skips them produces visibly
 * different results).
 */
export function presetTensors(preset: ModelPreset): TensorSpec[] {
  const p = preset;
  const H = p.hiddenSize;
  const I = intermediateSizeOf(p);
  const V = vocabSizeOf(p);
  const w = { kind: "normal", std: 0.02 } as const;
  const lin = (fanIn: number): TensorInit => ({ kind: "normal", std: 1 / Math.sqrt(fanIn) });
  const norm = { kind: "ones", std: 0.02 } as const;
  const specs: TensorSpec[] = [];
  const add = (name: string, shape: number[], init: TensorInit) =>
    specs.push({ name, shape, init });

  if (p.architecture === "gpt2") {
    add("transformer.wte.weight", [V, H], lin(H));
    add("transformer.wpe.weight", [p.maxPositions, H], { kind: "normal", std: 0.01 });
    for (let l = 0; l < p.numLayers; l++) {
      const h = `transformer.h.${l}`;
      add(`${h}.ln_1.weight`, [H], norm);
      add(`${h}.ln_1.bias`, [H], w);
      add(`${h}.attn.c_attn.weight`, [H, 3 * H], lin(H));
      add(`${h}.attn.c_attn.bias`, [3 * H], w);
      add(`${h}.attn.c_proj.weight`, [H, H], lin(H));
      add(`${h}.attn.c_proj.bias`, [H], w);
      add(`${h}.ln_2.weight`, [H], norm);
      add(`${h}.ln_2.bias`, [H], w);
      add(`${h}.mlp.c_fc.weight`, [H, I], lin(H));
      add(`${h}.mlp.c_fc.bias`, [I], w);
      add(`${h}.mlp.c_proj.weight`, [I, H], lin(I));
      add(`${h}.mlp.c_proj.bias`, [H], w);
    }
    add("transformer.ln_f.weight", [H], norm);
    add("transformer.ln_f.bias", [H], w);
    return specs;
  }

  const q = p.numHeads * p.headDim;
  const kv = p.numKvHeads * p.headDim;
  add("model.embed_tokens.weight", [V, H], lin(H));
  for (let l = 0; l < p.numLayers; l++) {
    const m = `model.layers.${l}`;
    add(`${m}.input_layernorm.weight`, [H], norm);
    add(`${m}.self_attn.q_proj.weight`, [q, H], lin(H));
    if (p.architecture === "qwen2") add(`${m}.self_attn.q_proj.bias`, [q], w);
    add(`${m}.self_attn.k_proj.weight`, [kv, H], lin(H));
    if (p.architecture === "qwen2") add(`${m}.self_attn.k_proj.bias`, [kv], w);
    add(`${m}.self_attn.v_proj.weight`, [kv, H], lin(H));
    if (p.architecture === "qwen2") add(`${m}.self_attn.v_proj.bias`, [kv], w);
    add(`${m}.self_attn.o_proj.weight`, [H, q], lin(q));
    if (p.architecture === "qwen3") {
      add(`${m}.self_attn.q_norm.weight`, [p.headDim], norm);
      add(`${m}.self_attn.k_norm.weight`, [p.headDim], norm);
    }
    add(`${m}.post_attention_layernorm.weight`, [H], norm);
    add(`${m}.mlp.gate_proj.weight`, [I, H], lin(H));
    add(`${m}.mlp.up_proj.weight`, [I, H], lin(H));
    add(`${m}.mlp.down_proj.weight`, [H, I], lin(I));
  }
  add("model.norm.weight", [H], norm);
  if (!p.tieWordEmbeddings) add("lm_head.weight", [V, H], lin(H));
  return specs;
}
