/**
 * The Llama-family decoder: `LlamaForCausalLM` (and `MistralForCausalLM`, the same layout),
 * `Qwen2ForCausalLM` (bias on q, k, v) and
 * `Qwen3ForCausalLM` (per-head RMSNorm on q and k before RoPE; `head_dim` independent of
 * `hidden_size / heads`). Pre-norm residual blocks:
 *
 *   h = embed(ids)
 *   per layer:  x = rms(h);  q,k,v = x Wqkv (+b);  [q,k = rms_head(q,k)];  rope(q,k)
 *               cache(k,v);  h += attn(q, cache) Wo
 *               x = rms(h);  h += (silu(x Wg) * (x Wu)) Wd
 *   logits = rms(h) Wlm       (Wlm = embed when tied)
 *
 * The residual add is fused into the next RMSNorm (`h += delta; x = rms(h)`); where the matmul
 * kernels read the norm themselves (the gpu kernel profile), the norm and the add are fused into
 * the qkv and gate/up projections instead (X form `rms_residual`: no rms_norm dispatch; the
 * residual stream then alternates between two buffers, the projection writing `h + delta` into
 * the other one); under the cpu profile, where o / down and the projection after them run
 * `unrolled`, steps of at most SPLIT_NORM_MAX_TOKENS tokens split the norm between them, and only
 * layer 0's input norm is a dispatch (see norm_placement.ts). Q/k/v and
 * gate/up are fused projections, the q/k head norms, RoPE and the K/V cache write are one
 * kernel (`rope_and_cache`; in all-decode steps the decode attention's own prologue, where its
 * fused variant was compiled), so attention runs without its own cache write, and the down
 * projection reads its X as `silu(gate) * up` straight from the gate/up output (matmul
 * `xForm: "swiglu"`), so SwiGLU has no dispatch of its own.
 *
 * @module
 */

import type { GpuMatrix } from "../../gpu/tensor.ts";
import type { ModelConfig } from "../model/config.ts";
import type { WeightLoader } from "../model/weight_loader.ts";
import type { AttentionBlock } from "./attention_block.ts";
import type { BindTargets, KvCacheAllocator, ModelTargets } from "./bind_targets.ts";
import { BoundModel, type EncodeForward } from "./model.ts";
import { KERNEL_GROUPS } from "./step_passes.ts";
import {
  advance,
  bindNormed,
  bindSubLayerOut,
  type NormSplit,
  type Op,
  splitsNorm,
  type Stream,
} from "./norm_placement.ts";
import { ConfigError } from "../model/errors.ts";

interface LayerWeights {
  inputNorm: GpuMatrix;
  qkv: GpuMatrix;
  qkvBias: GPUBuffer | null;
  qNorm: GpuMatrix | null;
  kNorm: GpuMatrix | null;
  o: GpuMatrix;
  postNorm: GpuMatrix;
  gateUp: GpuMatrix;
  down: GpuMatrix;
}

interface Weights {
  embed: GpuMatrix;
  layers: LayerWeights[];
  finalNorm: GpuMatrix;
  lmHead: GpuMatrix;
}

/** Loads the weights of a Llama / Qwen2 / Qwen3 checkpoint. */
async function loadWeights(c: ModelConfig, w: WeightLoader): Promise<Weights> {
  // Refused by name rather than run without them (a wrong answer).
  if (c.oProjBias) {
    throw new ConfigError(
      `${c.arch} with attention_bias true is not supported yet (the o_proj bias is not implemented)`,
    );
  }
  if (c.mlpBias) {
    throw new ConfigError(`${c.arch} with mlp_bias true is not supported yet`);
  }
  const H = c.hiddenSize;
  const D = c.headDim;
  const q = c.numHeads * D;
  const kv = c.numKvHeads * D;
  const I = c.intermediateSize;
  // Quantized only when it is also the LM head (tied): a lookup table is not a projection.
  const embed = await w.matrix(
    "embed_tokens",
    [{
      name: "model.embed_tokens.weight",
      rows: c.vocabSize,
    }],
    H,
    { quantize: c.tieWordEmbeddings },
  );
  const layers: LayerWeights[] = [];
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    const proj = (n: string) => `${p}self_attn.${n}_proj`;
    layers.push({
      inputNorm: await w.vector(`${p}input_layernorm.weight`, H),
      qkv: await w.matrix(`layer${l}.qkv`, [
        { name: `${proj("q")}.weight`, rows: q },
        { name: `${proj("k")}.weight`, rows: kv },
        { name: `${proj("v")}.weight`, rows: kv },
      ], H),
      qkvBias: c.qkvBias
        ? await w.bias(`layer${l}.qkv_bias`, [
          { name: `${proj("q")}.bias`, size: q },
          { name: `${proj("k")}.bias`, size: kv },
          { name: `${proj("v")}.bias`, size: kv },
        ])
        : null,
      qNorm: c.qkNorm ? await w.vector(`${p}self_attn.q_norm.weight`, D) : null,
      kNorm: c.qkNorm ? await w.vector(`${p}self_attn.k_norm.weight`, D) : null,
      o: await w.matrix(`layer${l}.o`, [{ name: `${proj("o")}.weight`, rows: H }], q),
      postNorm: await w.vector(`${p}post_attention_layernorm.weight`, H),
      gateUp: await w.matrix(`layer${l}.gate_up`, [
        { name: `${p}mlp.gate_proj.weight`, rows: I },
        { name: `${p}mlp.up_proj.weight`, rows: I },
      ], H),
      down: await w.matrix(`layer${l}.down`, [{ name: `${p}mlp.down_proj.weight`, rows: H }], I),
    });
  }
  const finalNorm = await w.vector("model.norm.weight", H);
  // Some tied checkpoints still store lm_head.weight (a copy); the embedding is used either way.
  const lmHead = c.tieWordEmbeddings
    ? embed
    : await w.matrix("lm_head", [{ name: "lm_head.weight", rows: c.vocabSize }], H);
  return { embed, layers, finalNorm, lmHead };
}

/** The decoder's kernel groups (see step_passes.ts), as the model bench prints them. */
const GROUPS = {
  ...KERNEL_GROUPS,
  /** Attention alone: `rope_and_cache` wrote K and V. */
  attention: "attention",
  /** The fused decode attention (all-decode steps): `rope_and_cache`'s work too. */
  attentionRope: "attention (+ q/k norm, rope, kv write)",
  norm: "rms_norm (2 per layer, fused residual)",
  /** The one rms_norm left where o and down write the next norm's input (cpu profile). */
  firstNorm: "rms_norm (layer 0's input)",
  /** o and down with the residual epilogue (cpu profile). */
  oResidual: "matmul o (+ residual add, norm input)",
  downResidual: "matmul down (+ silu_mul, residual add, norm input)",
  ropeAndCache: "q/k norm + rope + kv write",
  gateUp: "matmul gate_up",
  /** The projections that read the norm themselves (see the module doc). */
  qkvNormed: "matmul qkv (+ residual add, rms_norm)",
  gateUpNormed: "matmul gate_up (+ residual add, rms_norm)",
  /** The down projection with SwiGLU fused into its X loads. */
  down: "matmul down (+ silu_mul)",
  final: "final add + gather + norm",
} as const;

/**
 * A layer's projections and norms, one way of placing the norms (norm_placement.ts), in the order
 * they run, and the kernel groups of those that vary.
 */
interface LayerOps {
  /** Null where qkv reads the norm itself (see the module doc). */
  inputNorm: Op | null;
  inputNormGroup: string;
  qkv: Op;
  o: Op;
  oGroup: string;
  /** Null where gateUp reads the norm itself. */
  postNorm: Op | null;
  gateUp: Op;
  /** Reads X as silu(gate) * up of gateUp's output. */
  down: Op;
  downGroup: string;
}

/** One layer's call sites. */
interface DecoderLayer {
  /** q/k head norms (Qwen3), RoPE of q and k, K/V cache write. */
  ropeAndCache: Op;
  attn: AttentionBlock;
  /** The norms as dispatches, or read by the projections after them (gpu profile). */
  ops: LayerOps;
  /**
   * The norms split between the projections around them (cpu profile), for steps of at most
   * {@linkcode SPLIT_NORM_MAX_TOKENS} tokens; null where the layer's projections cannot.
   */
  split: LayerOps | null;
}

/**
 * The most tokens a step may have to run the split norms (cpu profile). Per output the residual
 * epilogue reads the stream and writes it and `h * gamma` where a plain projection writes once:
 * on lavapipe (2026-11-29, int4 weights, scratch timing of the engine's kernels) o and down took
 * 9-13% longer at 512 rows and within the noise at 1 and 8, while the 55 rms_norm dispatches it
 * saves were ~4 ms of a batch-1 decode step (77.3 ms before, 72-76 after); a 512-token prefill
 * took 18.3-18.5 s split against 17.5-17.8 s not (docs/benchmarks.md).
 */
export const SPLIT_NORM_MAX_TOKENS = 8;

const b = (buffer: GPUBuffer) => ({ buffer });

/** Binds layer `l`'s q/k norms + RoPE + cache write and its attention. */
function bindAttentionCore(
  c: ModelConfig,
  t: BindTargets,
  lw: LayerWeights,
  l: number,
  invFreq: GPUBuffer,
): Pick<DecoderLayer, "ropeAndCache" | "attn"> {
  const { kernels, arena, bufs } = t;
  const eps = c.normEps;
  const ropeAndCache = kernels.ropeAndCache.bind(arena, {
    qkv: b(bufs.qkv),
    positions: b(bufs.positions),
    invFreq: b(invFreq),
    slotMapping: b(bufs.slotMapping),
    kCache: b(t.kv.k[l]!),
    vCache: b(t.kv.v[l]!),
    ...(lw.qNorm !== null && lw.kNorm !== null ? { qkNorm: { q: lw.qNorm, k: lw.kNorm } } : {}),
  }, {
    numHeads: c.numHeads,
    numKvHeads: c.numKvHeads,
    headDim: c.headDim,
    blockSize: t.kv.shape.blockSize,
    cacheDtype: t.kv.shape.dtype,
    eps,
  });
  const attn = t.attention.bind(arena, bufs, t.kv, l, {
    writeCache: false,
    rope: {
      positions: b(bufs.positions),
      invFreq: b(invFreq),
      slotMapping: b(bufs.slotMapping),
      ...(lw.qNorm !== null && lw.kNorm !== null ? { qkNorm: { q: lw.qNorm, k: lw.kNorm } } : {}),
    },
  });
  return { ropeAndCache, attn };
}

/**
 * Binds layer `l`'s input norm, qkv and o, the residual stream at `stream`, the norms placed as
 * `split` says.
 */
function bindAttentionOps(
  c: ModelConfig,
  t: BindTargets,
  lw: LayerWeights,
  l: number,
  stream: Stream,
  split: NormSplit,
): Pick<LayerOps, "inputNorm" | "inputNormGroup" | "qkv" | "o" | "oGroup"> {
  const { bufs } = t;
  // Layer 0 normalises the embedding; later layers first add the previous MLP output.
  const { norm: inputNorm, projection: qkv } = bindNormed(
    t,
    stream,
    { weight: lw.inputNorm, eps: c.normEps, addDelta: l > 0 },
    { weight: lw.qkv, bias: lw.qkvBias, y: bufs.qkv },
    split.input,
  );
  const x = { buffer: bufs.attnOut, form: "plain" } as const;
  const o = bindSubLayerOut(t, stream, x, lw.o, split.post ? lw.postNorm : null);
  // Where o writes the post norm's input, only layer 0's input norm is a dispatch.
  const inputNormGroup = split.post && l === 0 ? GROUPS.firstNorm : GROUPS.norm;
  const oGroup = split.post ? GROUPS.oResidual : GROUPS.o;
  return { inputNorm, inputNormGroup, qkv, o, oGroup };
}

/**
 * Binds a layer's MLP half: post-attention norm (residual fused), gate/up, down (reading
 * SiLU(gate) * up); `split.post`: o wrote the post norm's input; `nextNorm`: the next layer's
 * input norm, whose input down writes (null: down writes `bufs.delta`).
 */
function bindMlp(
  c: ModelConfig,
  t: BindTargets,
  lw: LayerWeights,
  stream: Stream,
  split: NormSplit,
  nextNorm: GpuMatrix | null,
): Pick<LayerOps, "postNorm" | "gateUp" | "down" | "downGroup"> {
  const { bufs } = t;
  const { norm: postNorm, projection: gateUp } = bindNormed(
    t,
    stream,
    { weight: lw.postNorm, eps: c.normEps, addDelta: true },
    { weight: lw.gateUp, y: bufs.mlpUp },
    split.post,
  );
  const x = { buffer: bufs.mlpUp, form: "swiglu" } as const;
  const down = bindSubLayerOut(t, stream, x, lw.down, nextNorm);
  return {
    postNorm,
    gateUp,
    down,
    downGroup: nextNorm === null ? GROUPS.down : GROUPS.downResidual,
  };
}

/**
 * Binds the model's last call sites and returns the forward pass: `embed`, then each layer's
 * call sites, then (when a row samples) the last residual add, the gather of the sampled rows
 * and the final norm, one `rms_norm` dispatch (its gathered form).
 */
function forward(
  c: ModelConfig,
  t: BindTargets,
  w: Weights,
  embed: Op,
  layers: DecoderLayer[],
  stream: Stream,
): EncodeForward {
  const { kernels, arena, bufs } = t;
  // lastNormed[r] = norm(h + delta) at the token of sampled row r (the stream itself is not
  // needed after the last layer).
  const finalNorm = kernels.rmsNorm.bind(
    arena,
    {
      weight: w.finalNorm,
      x: b(bufs.delta),
      residual: b(stream.at),
      out: b(bufs.lastNormed),
      indices: b(bufs.sampleIndices),
    },
    { eps: c.normEps },
  );
  const qkvGroup = stream.fused ? GROUPS.qkvNormed : GROUPS.qkv;
  const gateUpGroup = stream.fused ? GROUPS.gateUpNormed : GROUPS.gateUp;
  return (passes, step) => {
    const T = step.numTokens;
    embed.encode(passes.at(GROUPS.embedding), T);
    const split = T <= SPLIT_NORM_MAX_TOKENS;
    for (const L of layers) {
      const ops = split && L.split !== null ? L.split : L.ops;
      ops.inputNorm?.encode(passes.at(ops.inputNormGroup), T);
      ops.qkv.encode(passes.at(qkvGroup), T);
      // The fused decode attention does rope_and_cache's work itself in all-decode steps.
      if (step.allDecode && L.attn.fusesRope) {
        L.attn.encode(passes.at(GROUPS.attentionRope), step);
      } else {
        L.ropeAndCache.encode(passes.at(GROUPS.ropeAndCache), T);
        L.attn.encode(passes.at(GROUPS.attention), step);
      }
      ops.o.encode(passes.at(ops.oGroup), T);
      ops.postNorm?.encode(passes.at(GROUPS.norm), T);
      ops.gateUp.encode(passes.at(gateUpGroup), T);
      ops.down.encode(passes.at(ops.downGroup), T);
    }
    if (step.numSampled > 0) finalNorm.encode(passes.at(GROUPS.final), step.numSampled);
  };
}

/** A loaded Llama-family model with its call sites bound. */
export class DecoderModel extends BoundModel {
  /**
   * Loads the weights and binds every call site against the step buffers and KV cache of
   * `targets`; `invFreq` is the f32 `[headDim / 2]` RoPE inverse frequencies.
   */
  static async load(
    config: ModelConfig,
    loader: WeightLoader,
    modelTargets: ModelTargets,
    kvCache: KvCacheAllocator,
    invFreq: GPUBuffer,
  ): Promise<DecoderModel> {
    const w = await loadWeights(config, loader);
    // The KV cache once the weights are on the device (see bind_targets.ts).
    const targets: BindTargets = { ...modelTargets, kv: await kvCache() };
    const { kernels, arena, bufs } = targets;
    const embed = kernels.embedding.bind(arena, {
      ids: b(bufs.ids),
      table: w.embed,
      out: b(bufs.hidden),
    });
    let stream: Stream = {
      fused: kernels.matmul(false).readsNorm,
      at: bufs.hidden,
      other: bufs.normed,
    };
    // Which norms o and down write the input of (cpu profile; see splitsNorm).
    const post = w.layers.map((lw) =>
      splitsNorm(targets, stream, lw.o, { weight: lw.gateUp, bias: null })
    );
    const input = w.layers.map((lw, l) => {
      const before = w.layers[l - 1];
      return before !== undefined &&
        splitsNorm(targets, stream, before.down, { weight: lw.qkv, bias: lw.qkvBias });
    });
    /**
     * Layer `l`'s ops with the norms placed as `split` says (and down writing the next layer's
     * input norm's input when `splitNext`), the stream at `at`.
     */
    const layerOps = (
      lw: LayerWeights,
      l: number,
      at: Stream,
      split: NormSplit,
      splitNext: boolean,
    ) => {
      const attention = bindAttentionOps(config, targets, lw, l, at, split);
      const mid = l > 0 ? advance(at) : at;
      const next = splitNext ? w.layers[l + 1]!.inputNorm : null;
      const mlp = bindMlp(config, targets, lw, mid, split, next);
      return { ops: { ...attention, ...mlp }, after: advance(mid) };
    };
    const layers = w.layers.map((lw, l): DecoderLayer => {
      const core = bindAttentionCore(config, targets, lw, l, invFreq);
      const { ops, after } = layerOps(lw, l, stream, { input: false, post: false }, false);
      const next = input[l + 1] === true;
      const split = input[l]! || post[l]! || next
        ? layerOps(lw, l, stream, { input: input[l]!, post: post[l]! }, next).ops
        : null;
      stream = after;
      return { ...core, ops, split };
    });
    const encode = forward(config, targets, w, embed, layers, stream);
    return new DecoderModel(config, w.lmHead, encode, loader);
  }
}
