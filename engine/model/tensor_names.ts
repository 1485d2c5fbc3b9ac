/**
 * The tensor names of a checkpoint, in every layout transformers itself loads. The engine's
 * loaders ask for **canonical** names, those `save_pretrained` writes for a `*ForCausalLM` /
 * `GPT2LMHeadModel` (`transformer.h.0.attn.c_attn.weight`, `model.layers.0.mlp.up_proj.weight`,
 * `lm_head.weight`); {@linkcode TensorNames} maps them to the names a checkpoint stores:
 *
 * | layout | met in the wild | stored names |
 * | --- | --- | --- |
 * | `prefixed` | `save_pretrained` of a causal-LM class (Qwen, Llama, transformers' GPT-2 today) | the canonical names |
 * | `unprefixed` | the hub's `gpt2` and `distilgpt2` files, checkpoints saved from a base model (`GPT2Model`, `LlamaModel`) | without the base model prefix (`transformer.` for GPT-2, `model.` otherwise): `wte.weight`, `h.0.attn.c_attn.weight`, `layers.0.mlp.up_proj.weight`; `lm_head.weight` (outside the base model) as it is |
 *
 * As transformers does (it strips or adds `base_model_prefix`), the layout is detected from the
 * names: a checkpoint none of whose tensors starts with the prefix is unprefixed. Non-weight
 * buffers that checkpoints carry are left out by name: GPT-2's causal masks `attn.bias` and
 * `attn.masked_bias`, and `rotary_emb.inv_freq` of older Llama-family files.
 *
 * @module
 */

import type { Architecture } from "./config.ts";

/** How a checkpoint names its tensors (see the module doc). */
export type TensorLayout = "prefixed" | "unprefixed";

/** The base model prefix transformers strips or adds (`base_model_prefix`). */
export function baseModelPrefix(arch: Architecture): string {
  return arch === "GPT2LMHeadModel" ? "transformer" : "model";
}

/** Tensors outside the base model: they keep their name in every layout. */
const HEAD = /^lm_head\./;

/** Buffers that are not weights (masks, RoPE tables): never loaded, never counted. */
const BUFFERS = /(^|\.)attn\.(masked_)?bias$|(^|\.)rotary_emb\.inv_freq$/;

/** Whether a stored tensor name is a known non-weight buffer (see the module doc). */
export function isNonWeightBuffer(name: string): boolean {
  return BUFFERS.test(name);
}

/** The canonical <-> stored name mapping of one checkpoint. */
export class TensorNames {
  readonly layout: TensorLayout;
  readonly prefix: string;
  /** Canonical name -> stored name, for every weight. */
  readonly #stored = new Map<string, string>();
  /** Stored names left out as non-weight buffers. */
  readonly buffers: readonly string[];

  /** @param stored every tensor name the checkpoint's files hold. */
  constructor(arch: Architecture, stored: Iterable<string>) {
    this.prefix = baseModelPrefix(arch);
    const names = [...stored];
    const p = `${this.prefix}.`;
    this.layout = names.some((n) => n.startsWith(p)) ? "prefixed" : "unprefixed";
    const buffers: string[] = [];
    for (const name of names) {
      if (isNonWeightBuffer(name)) {
        buffers.push(name);
        continue;
      }
      const canonical = this.layout === "prefixed" || HEAD.test(name) ? name : p + name;
      this.#stored.set(canonical, name);
    }
    this.buffers = buffers;
  }

  /** The canonical names of every weight. */
  canonical(): IterableIterator<string> {
    return this.#stored.keys();
  }

  /** The stored name of canonical `name`, or undefined when the checkpoint lacks it. */
  stored(name: string): string | undefined {
    return this.#stored.get(name);
  }

  /** For error messages: the layout and the stored name `name` was looked for under. */
  describeLookup(name: string): string {
    if (this.layout === "prefixed" || HEAD.test(name) || !name.startsWith(`${this.prefix}.`)) {
      return `layout: ${this.layout} ("${this.prefix}." names)`;
    }
    return `layout: unprefixed, as the hub ships some models; looked for "${
      name.slice(this.prefix.length + 1)
    }"`;
  }

  /** A describing label, e.g. "prefixed (transformer.*)". */
  get label(): string {
    return this.layout === "prefixed"
      ? `prefixed (${this.prefix}.*)`
      : `unprefixed (no ${this.prefix}.)`;
  }
}
