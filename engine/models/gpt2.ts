/**
 * `GPT2LMHeadModel` (GPT-2, distilgpt2): learned position embeddings, LayerNorm with bias,
 * fused `c_attn` projection, `gelu_new` MLP, LM head tied to the token embedding.
 *
 *   h = wte(ids) + wpe(positions)
 *   per layer:  x = ln_1(h);  q,k,v = x Wattn + b;  cache(k,v);  h += attn(q, cache) Wproj + b
 *               x = ln_2(h);  h += gelu_new(x Wfc + b) Wproj2 + b
 *   logits = ln_f(h) wte^T
 *
 * Conv1D weights are stored `[in, out]` in the checkpoint and transposed at load.
 *
 * @module
 */

import type { GpuMatrix } from "../../gpu/tensor.ts";
import type { ModelConfig } from "../model/config.ts";
import type { WeightLoader } from "../model/weight_loader.ts";
import type { AttentionBlock } from "./attention_block.ts";
import type { KvCacheAllocator, ModelTargets } from "./bind_targets.ts";
import { BoundModel, type EncodeForward } from "./model.ts";
import { KERNEL_GROUPS } from "./step_passes.ts";
import { ConfigError } from "../model/errors.ts";
import type { EmbeddingOp } from "../../kernels/embedding.ts";
import type { LayerNormOp } from "../../kernels/layer_norm.ts";
import type { MatmulOp } from "../../kernels/matmul.ts";
import type { GeluNewOp } from "../../kernels/gelu_new.ts";
import type { AddOp } from "../../kernels/add.ts";
import type { GatherRowsOp } from "../../kernels/gather_rows.ts";

/** GPT-2's kernel groups (see step_passes.ts), as the model bench prints them. */
const GROUPS = {
  ...KERNEL_GROUPS,
  norm: "layer_norm (2 per layer)",
  residual: "add residual (2 per layer)",
  fc: "matmul fc",
  act: "gelu_new",
  proj: "matmul mlp proj",
  final: "final gather + norm",
} as const;

/** One layer's call sites, in the order they run. */
interface Gpt2Layer {
  ln1: LayerNormOp;
  qkv: MatmulOp;
  attn: AttentionBlock;
  proj: MatmulOp;
  ln2: LayerNormOp;
  fc: MatmulOp;
  gelu: GeluNewOp;
  proj2: MatmulOp;
}

/** The call sites outside the layers. */
interface Gpt2Ends {
  embed: EmbeddingOp;
  embedPos: EmbeddingOp;
  /** `hidden += delta`, twice per layer. */
  addDelta: AddOp;
  gather: GatherRowsOp;
  lnF: LayerNormOp;
}

const b = (buffer: GPUBuffer) => ({ buffer });

/** Loads and binds GPT-2's call sites, reading the checkpoint in its order. */
class Gpt2Binder {
  constructor(
    readonly c: ModelConfig,
    readonly w: WeightLoader,
    readonly t: ModelTargets,
  ) {}

  /** LayerNorm `name` (weight and bias) from `x` to `out`. */
  async norm(name: string, x: GPUBuffer, out: GPUBuffer): Promise<LayerNormOp> {
    const H = this.c.hiddenSize;
    return this.t.kernels.layerNorm.bind(this.t.arena, {
      weight: await this.w.vector(`${name}.weight`, H),
      bias: await this.w.vector(`${name}.bias`, H),
      x: b(x),
      out: b(out),
    }, this.c.normEps);
  }

  /** Conv1D `name` (`[in, out]` weight, transposed at load, and bias) from `x` to `y`. */
  async linear(
    name: string,
    inDim: number,
    outDim: number,
    x: GPUBuffer,
    y: GPUBuffer,
  ): Promise<MatmulOp> {
    const w = this.w;
    return this.t.kernels.matmul(true).bind(this.t.arena, {
      x: b(x),
      weight: await w.transposed(name, [{ name: `${name}.weight`, cols: outDim }], inDim),
      bias: b(await w.bias(`${name}.bias`, [{ name: `${name}.bias`, size: outDim }])),
      y: b(y),
    });
  }

  /** Layer `l`'s call sites but its attention (bound once the KV cache exists). */
  async layer(l: number): Promise<Omit<Gpt2Layer, "attn">> {
    const { c, t } = this;
    const { bufs, arena } = t;
    const H = c.hiddenSize;
    const I = c.intermediateSize;
    const p = `transformer.h.${l}`;
    return {
      ln1: await this.norm(`${p}.ln_1`, bufs.hidden, bufs.normed),
      qkv: await this.linear(`${p}.attn.c_attn`, H, 3 * H, bufs.normed, bufs.qkv),
      proj: await this.linear(`${p}.attn.c_proj`, H, H, bufs.attnOut, bufs.delta),
      ln2: await this.norm(`${p}.ln_2`, bufs.hidden, bufs.normed),
      fc: await this.linear(`${p}.mlp.c_fc`, H, I, bufs.normed, bufs.mlpUp),
      gelu: t.kernels.geluNew.bind(arena, { input: b(bufs.mlpUp) }),
      proj2: await this.linear(`${p}.mlp.c_proj`, I, H, bufs.mlpUp, bufs.delta),
    };
  }

  /** The token and position embeddings (wte is also the LM head) and the residual add. */
  async embeddings(): Promise<
    { wte: GpuMatrix } & Pick<Gpt2Ends, "embed" | "embedPos" | "addDelta">
  > {
    const { c, w, t } = this;
    const { kernels, arena, bufs } = t;
    const H = c.hiddenSize;
    const wte = await w.matrix("wte", [{ name: "transformer.wte.weight", rows: c.vocabSize }], H);
    // wte is also the LM head (quantized with the projections); position embeddings are not.
    const wpe = await w.matrix(
      "wpe",
      [{ name: "transformer.wpe.weight", rows: c.maxPositionEmbeddings }],
      H,
      { quantize: false },
    );
    const embed = kernels.embedding.bind(arena, {
      ids: b(bufs.ids),
      table: wte,
      out: b(bufs.hidden),
    });
    const embedPos = kernels.embedding.bind(
      arena,
      { ids: b(bufs.positions), table: wpe, out: b(bufs.hidden) },
      { accumulate: true },
    );
    const addDelta = kernels.add.bind(arena, { a: b(bufs.hidden), b: b(bufs.delta) });
    return { wte, embed, embedPos, addDelta };
  }
}

/** The forward pass over GPT-2's bound call sites. */
function forward(c: ModelConfig, ends: Gpt2Ends, layers: Gpt2Layer[]): EncodeForward {
  const H = c.hiddenSize;
  const I = c.intermediateSize;
  const { embed, embedPos, addDelta, gather, lnF } = ends;
  return (passes, step) => {
    const T = step.numTokens;
    embed.encode(passes.at(GROUPS.embedding), T);
    embedPos.encode(passes.at(GROUPS.embedding), T);
    for (const L of layers) {
      L.ln1.encode(passes.at(GROUPS.norm), T);
      L.qkv.encode(passes.at(GROUPS.qkv), T);
      L.attn.encode(passes.at(GROUPS.attention), step);
      L.proj.encode(passes.at(GROUPS.o), T);
      addDelta.encode(passes.at(GROUPS.residual), T * H);
      L.ln2.encode(passes.at(GROUPS.norm), T);
      L.fc.encode(passes.at(GROUPS.fc), T);
      L.gelu.encode(passes.at(GROUPS.act), T * I);
      L.proj2.encode(passes.at(GROUPS.proj), T);
      addDelta.encode(passes.at(GROUPS.residual), T * H);
    }
    if (step.numSampled > 0) {
      const pass = passes.at(GROUPS.final);
      gather.encode(pass, step.numSampled, H);
      lnF.encode(pass, step.numSampled);
    }
  };
}

/** A loaded GPT-2 model with its call sites bound. */
export class Gpt2Model extends BoundModel {
  /** Loads the weights and binds every call site against the buffers of `targets`. */
  static async load(
    config: ModelConfig,
    loader: WeightLoader,
    targets: ModelTargets,
    kvCache: KvCacheAllocator,
  ): Promise<Gpt2Model> {
    if (!config.tieWordEmbeddings) {
      // The head is wte here; an untied lm_head.weight would be ignored: a wrong answer.
      throw new ConfigError("GPT2LMHeadModel with tie_word_embeddings false is not supported yet");
    }
    const binder = new Gpt2Binder(config, loader, targets);
    const { wte, ...embeddings } = await binder.embeddings();
    const loaded: Omit<Gpt2Layer, "attn">[] = [];
    for (let l = 0; l < config.numLayers; l++) loaded.push(await binder.layer(l));
    const { kernels, arena, bufs } = targets;
    const gather = kernels.gatherRows.bind(arena, {
      src: b(bufs.hidden),
      indices: b(bufs.sampleIndices),
      out: b(bufs.lastHidden),
    });
    const lnF = await binder.norm("transformer.ln_f", bufs.lastHidden, bufs.lastNormed);
    // The KV cache once the weights are on the device (see bind_targets.ts).
    const kv = await kvCache();
    const layers = loaded.map((L, l): Gpt2Layer => ({
      ...L,
      attn: targets.attention.bind(arena, bufs, kv, l),
    }));
    const encode = forward(config, { ...embeddings, gather, lnF }, layers);
    return new Gpt2Model(config, wte, encode, loader);
  }
}
