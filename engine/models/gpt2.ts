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

import type { ParamArena } from "../../gpu/params.ts";
import type { KvCache } from "../kv_cache.ts";
import type { ModelConfig } from "../model/config.ts";
import type { WeightLoader } from "../model/weight_loader.ts";
import type { StepBuffers } from "../step_buffers.ts";
import type { AttentionKernels, StepShape } from "./attention_block.ts";
import type { KernelSet } from "./kernel_set.ts";
import { BoundModel } from "./model.ts";
import { ConfigError } from "../model/errors.ts";

/** A loaded GPT-2 model with its call sites bound. */
export class Gpt2Model extends BoundModel {
  /** Loads the weights and binds every call site against the step buffers and KV cache. */
  static async load(
    config: ModelConfig,
    w: WeightLoader,
    kernels: KernelSet,
    attention: AttentionKernels,
    arena: ParamArena,
    bufs: StepBuffers,
    kv: KvCache,
  ): Promise<Gpt2Model> {
    const c = config;
    if (!c.tieWordEmbeddings) {
      // The head is wte here; an untied lm_head.weight would be ignored: a wrong answer.
      throw new ConfigError("GPT2LMHeadModel with tie_word_embeddings false is not supported yet");
    }
    const H = c.hiddenSize;
    const I = c.intermediateSize;
    const eps = c.normEps;
    const b = (buffer: GPUBuffer) => ({ buffer });
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
    const norm = async (name: string, x: GPUBuffer, out: GPUBuffer) =>
      kernels.layerNorm.bind(arena, {
        weight: await w.vector(`${name}.weight`, H),
        bias: await w.vector(`${name}.bias`, H),
        x: b(x),
        out: b(out),
      }, eps);
    const linear = async (
      name: string,
      inDim: number,
      outDim: number,
      x: GPUBuffer,
      y: GPUBuffer,
    ) =>
      kernels.matmul(true).bind(arena, {
        x: b(x),
        weight: await w.transposed(name, [{ name: `${name}.weight`, cols: outDim }], inDim),
        bias: b(await w.bias(`${name}.bias`, [{ name: `${name}.bias`, size: outDim }])),
        y: b(y),
      });
    const addDelta = kernels.add.bind(arena, { a: b(bufs.hidden), b: b(bufs.delta) });
    const bindLayer = async (l: number) => {
      const p = `transformer.h.${l}`;
      return {
        ln1: await norm(`${p}.ln_1`, bufs.hidden, bufs.normed),
        qkv: await linear(`${p}.attn.c_attn`, H, 3 * H, bufs.normed, bufs.qkv),
        attn: attention.bind(arena, bufs, kv, l),
        proj: await linear(`${p}.attn.c_proj`, H, H, bufs.attnOut, bufs.delta),
        ln2: await norm(`${p}.ln_2`, bufs.hidden, bufs.normed),
        fc: await linear(`${p}.mlp.c_fc`, H, I, bufs.normed, bufs.mlpUp),
        gelu: kernels.geluNew.bind(arena, { input: b(bufs.mlpUp) }),
        proj2: await linear(`${p}.mlp.c_proj`, I, H, bufs.mlpUp, bufs.delta),
      };
    };
    const layers: Awaited<ReturnType<typeof bindLayer>>[] = [];
    for (let l = 0; l < c.numLayers; l++) layers.push(await bindLayer(l));
    const gather = kernels.gatherRows.bind(arena, {
      src: b(bufs.hidden),
      indices: b(bufs.sampleIndices),
      out: b(bufs.lastHidden),
    });
    const lnF = await norm("transformer.ln_f", bufs.lastHidden, bufs.lastNormed);

    const encode = (pass: GPUComputePassEncoder, step: StepShape) => {
      const T = step.numTokens;
      embed.encode(pass, T);
      embedPos.encode(pass, T);
      for (const L of layers) {
        L.ln1.encode(pass, T);
        L.qkv.encode(pass, T);
        L.attn.encode(pass, step);
        L.proj.encode(pass, T);
        addDelta.encode(pass, T * H);
        L.ln2.encode(pass, T);
        L.fc.encode(pass, T);
        L.gelu.encode(pass, T * I);
        L.proj2.encode(pass, T);
        addDelta.encode(pass, T * H);
      }
      if (step.numSampled > 0) {
        gather.encode(pass, step.numSampled, H);
        lnF.encode(pass, step.numSampled);
      }
    };
    return new Gpt2Model(c, wte, encode, w);
  }
}
