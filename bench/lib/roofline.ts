/**
 * FLOPs and bytes of a decoder-only transformer's prefill and decode steps, from its shapes,
 * and a roofline bound (time >= max(FLOPs / peak compute, bytes / memory bandwidth)).
 *
 * Counted: every linear layer (2 FLOPs per weight per token), attention scores and weighted
 * values (causal: position p attends over p + 1 keys), the LM head on the sampled row only
 * (as the model runner does); bytes: every weight read once per step, KV cache read for the
 * context and written for the new tokens. Not counted: norms, RoPE, activations, sampling, and
 * activation traffic between kernels (all small against the weights at these shapes).
 *
 * @module
 */

/** The shapes that set FLOPs and bytes. */
export interface ModelShape {
  readonly name: string;
  readonly layers: number;
  readonly hidden: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** MLP width. */
  readonly intermediate: number;
  readonly vocab: number;
  /** Gated MLP (gate, up, down: 3 matrices) or plain (up, down: 2). */
  readonly gatedMlp: boolean;
  /** Embedding and LM head share one matrix. */
  readonly tiedEmbeddings: boolean;
}

/**
 * Standard shapes for the roofline table: Qwen3-0.6B (config.json of Qwen/Qwen3-0.6B) and
 * LLaMA-2 7B / 13B / 70B (config.json of meta-llama/Llama-2-*-hf; 70B uses 8 KV heads).
 */
export const STANDARD_SHAPES: readonly ModelShape[] = [
  {
    name: "Qwen3-0.6B",
    layers: 28,
    hidden: 1024,
    heads: 16,
    kvHeads: 8,
    headDim: 128,
    intermediate: 3072,
    vocab: 151936,
    gatedMlp: true,
    tiedEmbeddings: true,
  },
  {
    name: "LLaMA-2-7B",
    layers: 32,
    hidden: 4096,
    heads: 32,
    kvHeads: 32,
    headDim: 128,
    intermediate: 11008,
    vocab: 32000,
    gatedMlp: true,
    tiedEmbeddings: false,
  },
  {
    name: "LLaMA-2-13B",
    layers: 40,
    hidden: 5120,
    heads: 40,
    kvHeads: 40,
    headDim: 128,
    intermediate: 13824,
    vocab: 32000,
    gatedMlp: true,
    tiedEmbeddings: false,
  },
  {
    name: "LLaMA-2-70B",
    layers: 80,
    hidden: 8192,
    heads: 64,
    kvHeads: 8,
    headDim: 128,
    intermediate: 28672,
    vocab: 32000,
    gatedMlp: true,
    tiedEmbeddings: false,
  },
];

/** Weights of the transformer layers' linear maps (attention projections and MLP). */
export function layerLinearParams(m: ModelShape): number {
  const q = m.heads * m.headDim;
  const kv = m.kvHeads * m.headDim;
  const attn = m.hidden * q + 2 * m.hidden * kv + q * m.hidden;
  const mlp = (m.gatedMlp ? 3 : 2) * m.hidden * m.intermediate;
  return m.layers * (attn + mlp);
}

/** All parameters (layers' linear maps, embedding, LM head unless tied; norms ignored). */
export function totalParams(m: ModelShape): number {
  return layerLinearParams(m) + m.vocab * m.hidden * (m.tiedEmbeddings ? 1 : 2);
}

/** FLOPs and bytes of one step. */
export interface StepCost {
  readonly flops: number;
  readonly bytes: number;
}

/** Bytes per element of the weights and of the KV cache. */
export interface Precision {
  readonly weightBytes: number;
  readonly kvBytes: number;
}

function weightBytesRead(m: ModelShape, p: Precision, tokens: number): number {
  // Layers and LM head read whole; the embedding only at the tokens' rows (when not tied).
  const embedRows = m.tiedEmbeddings ? 0 : tokens * m.hidden;
  return p.weightBytes * (layerLinearParams(m) + m.vocab * m.hidden + embedRows);
}

/** Prefill of one `promptLen`-token sequence in one step (one row sampled). */
export function prefillCost(m: ModelShape, p: Precision, promptLen: number): StepCost {
  const n = promptLen;
  const attn = m.layers * m.heads * m.headDim * 2 * n * (n + 1); // QK^T + PV, causal
  const flops = 2 * n * layerLinearParams(m) + attn + 2 * m.vocab * m.hidden;
  const kvWrite = n * 2 * m.layers * m.kvHeads * m.headDim * p.kvBytes;
  return { flops, bytes: weightBytesRead(m, p, n) + kvWrite };
}

/** One decode step of `batch` sequences, each with `context` tokens in the KV after it. */
export function decodeCost(m: ModelShape, p: Precision, context: number, batch = 1): StepCost {
  const attn = m.layers * m.heads * m.headDim * 4 * context;
  const flops = batch * (2 * layerLinearParams(m) + attn + 2 * m.vocab * m.hidden);
  const kv = batch * context * 2 * m.layers * m.kvHeads * m.headDim * p.kvBytes;
  return { flops, bytes: weightBytesRead(m, p, batch) + kv };
}

/** Roofline time of a step in ms, and which resource bounds it. */
export function rooflineMs(
  cost: StepCost,
  peakGflops: number,
  bandwidthGBs: number,
): { ms: number; bound: "compute" | "memory" } {
  const compute = cost.flops / (peakGflops * 1e6);
  const memory = cost.bytes / (bandwidthGBs * 1e6);
  return compute >= memory ? { ms: compute, bound: "compute" } : { ms: memory, bound: "memory" };
}
