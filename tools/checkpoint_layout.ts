/**
 * The tensor layouts `make-model` can write (see engine/model/tensor_names.ts for how the loader
 * reads them):
 *
 * | layout | names | extra tensors |
 * | --- | --- | --- |
 * | `save-pretrained` (default) | as `save_pretrained` of the causal-LM class writes them (`transformer.wte.weight`, `model.layers.0...`) | none |
 * | `hub` | as the hub's files for the architecture have them: GPT-2 (`gpt2`, `distilgpt2`) unprefixed; the Llama family as `save-pretrained` | GPT-2: each block's causal-mask buffers `h.N.attn.bias` (f32 `[1, 1, P, P]`, lower-triangular ones) and `h.N.attn.masked_bias` (f32 `[]`, -1e4), as older files carry them |
 * | `unprefixed` | without the base model prefix (`transformer.` / `model.`), as a base model (`GPT2Model`, `LlamaModel`) saves them; `lm_head.weight` unchanged | none |
 *
 * Weights keep their values in every layout: each is drawn from a stream seeded by its canonical
 * name, so checkpoints of one seed in two layouts hold the same model.
 *
 * @module
 */

import { encodeTensorData, type TensorToWrite } from "../engine/model/safetensors.ts";
import type { ModelPreset } from "../engine/model/presets.ts";
import type { TensorSpec } from "../engine/model/preset_tensors.ts";

/** A layout `make-model` writes. */
export type CheckpointLayout = "save-pretrained" | "hub" | "unprefixed";

/** The layouts, for flag parsing. */
export const CHECKPOINT_LAYOUTS: readonly CheckpointLayout[] = [
  "save-pretrained",
  "hub",
  "unprefixed",
];

/** A tensor to write: its name in the layout, and its canonical spec (values) or its own data. */
export interface LaidOutTensor {
  readonly name: string;
  /** The canonical weight behind it; null for a non-weight buffer. */
  readonly spec: TensorSpec | null;
  /** A buffer's tensor, written as it is. */
  readonly buffer?: TensorToWrite;
}

function strip(name: string, prefix: string): string {
  return name.startsWith(`${prefix}.`) ? name.slice(prefix.length + 1) : name;
}

/** The tensors of `specs` (canonical, in model order) as `layout` writes them for `preset`. */
export function layOut(
  specs: readonly TensorSpec[],
  preset: ModelPreset,
  layout: CheckpointLayout,
): LaidOutTensor[] {
  const gpt2 = preset.architecture === "gpt2";
  const prefix = gpt2 ? "transformer" : "model";
  const unprefixed = layout === "unprefixed" || (layout === "hub" && gpt2);
  const out: LaidOutTensor[] = [];
  for (const spec of specs) {
    out.push({ name: unprefixed ? strip(spec.name, prefix) : spec.name, spec });
    // GPT-2 on the hub: the causal-mask buffers follow each block's attention weights.
    const m = layout === "hub" && gpt2
      ? /^transformer\.h\.(\d+)\.attn\.c_attn\.weight$/.exec(spec.name)
      : null;
    if (m !== null) {
      const p = preset.maxPositions;
      const mask = new Float32Array(p * p);
      for (let i = 0; i < p; i++) mask.fill(1, i * p, i * p + i + 1);
      for (
        const [name, shape, values] of [
          [`h.${m[1]}.attn.bias`, [1, 1, p, p], mask],
          [`h.${m[1]}.attn.masked_bias`, [], Float32Array.of(-1e4)],
        ] as const
      ) {
        out.push({
          name,
          spec: null,
          buffer: { name, dtype: "F32", shape, data: () => encodeTensorData(values, "F32") },
        });
      }
    }
  }
  return out;
}
