/**
 * A float64 reference of the four supported architectures (Qwen3, Qwen2, Llama, GPT-2), written
 * from the Hugging Face modeling code's definitions with no KV cache, no batching and no
 * shortcuts: every step recomputes the whole sequence. It is the yardstick the engine's greedy
 * generation is compared with, token for token.
 *
 * Weights are read from the checkpoint as stored (f32, f16 or bf16 values are exact in float64;
 * a fine-grained FP8 checkpoint's weights as their dequantized values, tests/reference/fp8.ts;
 * a GPTQ or AWQ checkpoint's likewise, tests/reference/packed_int.ts).
 * With `quantize` (Qwen3, Qwen2, Llama), the projections, the LM head and a tied embedding are
 * replaced by their dequantized int8 / int4 values `w'` (tests/reference/quant.ts, written from
 * the format's text). With `kvCacheDtype`, every K (after its norm and RoPE) and V vector is
 * rounded to that dtype before attention reads it, as a KV cache of that dtype holds it
 * (tests/reference/kv_values.ts; fp8 from the format's definition).
 *
 * @module
 */

import { type Checkpoint, openCheckpoint } from "../../engine/model/checkpoint.ts";
import { type ModelConfig, ropeInvFreq } from "../../engine/model/config.ts";
import { isPackedInt } from "../../engine/model/checkpoint_quantization.ts";
import { fp8WeightRef } from "./fp8.ts";
import { packedWeightRef } from "./packed_int.ts";
import { quantizeRef } from "./quant.ts";
import { roundToKv } from "./kv_values.ts";
import type { KvDtype } from "../../gpu/dtype.ts";

/** A dense float64 matrix `[rows, cols]`, row-major. */
interface Mat {
  readonly rows: number;
  readonly cols: number;
  readonly data: Float64Array;
}

async function load(ck: Checkpoint, name: string): Promise<Mat> {
  const info = ck.tensor(name);
  const cols = info.shape.length === 0 ? 1 : info.shape[info.shape.length - 1]!;
  // FP8, GPTQ and AWQ weights are dequantized here, from their bytes (tests/reference/fp8.ts,
  // tests/reference/packed_int.ts).
  const q = ck.quantization;
  const data = info.dtype === "F8_E4M3"
    ? await fp8WeightRef(ck, name)
    : q !== null && isPackedInt(q) && /^(GPTQ|AWQ|CT)_I\d$/.test(info.dtype)
    ? (await packedWeightRef(ck.dir, name, q)).data
    : Float64Array.from(await ck.readTensor(name, "f32"));
  return { rows: data.length / cols, cols, data };
}

/** `m` transposed. */
function transpose(m: Mat): Mat {
  const out = new Float64Array(m.data.length);
  for (let r = 0; r < m.rows; r++) {
    for (let c = 0; c < m.cols; c++) out[c * m.rows + r] = m.data[r * m.cols + c]!;
  }
  return { rows: m.cols, cols: m.rows, data: out };
}

/** `x [T, in] * W^T` with W in the Hugging Face `[out, in]` layout, plus an optional bias. */
function linear(x: Mat, w: Mat, bias?: Mat): Mat {
  if (x.cols !== w.cols) {
    throw new RangeError(`linear: input has ${x.cols} columns, weight ${w.cols}`);
  }
  const out = new Float64Array(x.rows * w.rows);
  for (let t = 0; t < x.rows; t++) {
    for (let o = 0; o < w.rows; o++) {
      let s = bias ? bias.data[o]! : 0;
      for (let i = 0; i < x.cols; i++) s += x.data[t * x.cols + i]! * w.data[o * w.cols + i]!;
      out[t * w.rows + o] = s;
    }
  }
  return { rows: x.rows, cols: w.rows, data: out };
}

/** GPT-2 Conv1D: `x [T, in] * W` with W stored `[in, out]`, plus bias. */
function conv1d(x: Mat, w: Mat, bias: Mat): Mat {
  const out = new Float64Array(x.rows * w.cols);
  for (let t = 0; t < x.rows; t++) {
    for (let o = 0; o < w.cols; o++) {
      let s = bias.data[o]!;
      for (let i = 0; i < x.cols; i++) s += x.data[t * x.cols + i]! * w.data[i * w.cols + o]!;
      out[t * w.cols + o] = s;
    }
  }
  return { rows: x.rows, cols: w.cols, data: out };
}

/** RMSNorm over rows of width `w.data.length` (also per head when `x.cols` is a multiple). */
function rmsNorm(x: Mat, w: Mat, eps: number): Mat {
  const n = w.data.length;
  const out = new Float64Array(x.data.length);
  for (let r = 0; r < x.data.length / n; r++) {
    let ss = 0;
    for (let i = 0; i < n; i++) ss += x.data[r * n + i]! ** 2;
    const inv = 1 / Math.sqrt(ss / n + eps);
    for (let i = 0; i < n; i++) out[r * n + i] = x.data[r * n + i]! * inv * w.data[i]!;
  }
  return { ...x, data: out };
}

function layerNorm(x: Mat, w: Mat, b: Mat, eps: number): Mat {
  const n = x.cols;
  const out = new Float64Array(x.data.length);
  for (let r = 0; r < x.rows; r++) {
    let mean = 0;
    for (let i = 0; i < n; i++) mean += x.data[r * n + i]!;
    mean /= n;
    let v = 0;
    for (let i = 0; i < n; i++) v += (x.data[r * n + i]! - mean) ** 2;
    const inv = 1 / Math.sqrt(v / n + eps);
    for (let i = 0; i < n; i++) {
      out[r * n + i] = (x.data[r * n + i]! - mean) * inv * w.data[i]! + b.data[i]!;
    }
  }
  return { ...x, data: out };
}

function add(a: Mat, b: Mat): Mat {
  return { ...a, data: a.data.map((v, i) => v + b.data[i]!) };
}

function geluNew(x: number): number {
  return 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
}

/** Rotate-half RoPE in place on `heads` heads of `x [T, heads * d]` at positions 0..T-1. */
function rope(x: Mat, heads: number, d: number, invFreq: Float64Array): void {
  const half = d / 2;
  for (let t = 0; t < x.rows; t++) {
    for (let h = 0; h < heads; h++) {
      const base = t * x.cols + h * d;
      for (let i = 0; i < half; i++) {
        const angle = t * invFreq[i]!;
        const c = Math.cos(angle);
        const s = Math.sin(angle);
        const a = x.data[base + i]!;
        const b = x.data[base + i + half]!;
        x.data[base + i] = a * c - b * s;
        x.data[base + i + half] = b * c + a * s;
      }
    }
  }
}

/** Causal grouped-query attention: q `[T, Hq*d]`, k, v `[T, Hkv*d]` -> `[T, Hq*d]`. */
function attention(q: Mat, k: Mat, v: Mat, hq: number, hkv: number, d: number): Mat {
  const T = q.rows;
  const out = new Float64Array(T * hq * d);
  const scale = 1 / Math.sqrt(d);
  const scores = new Float64Array(T);
  for (let h = 0; h < hq; h++) {
    const kh = Math.floor(h / (hq / hkv));
    for (let t = 0; t < T; t++) {
      let max = -Infinity;
      for (let j = 0; j <= t; j++) {
        let s = 0;
        for (let i = 0; i < d; i++) {
          s += q.data[t * q.cols + h * d + i]! * k.data[j * k.cols + kh * d + i]!;
        }
        scores[j] = s * scale;
        max = Math.max(max, scores[j]!);
      }
      let sum = 0;
      for (let j = 0; j <= t; j++) sum += scores[j] = Math.exp(scores[j]! - max);
      for (let i = 0; i < d; i++) {
        let acc = 0;
        for (let j = 0; j <= t; j++) acc += scores[j]! * v.data[j * v.cols + kh * d + i]!;
        out[t * hq * d + h * d + i] = acc / sum;
      }
    }
  }
  return { rows: T, cols: hq * d, data: out };
}

/** Columns `[start, start + width)` of every row. */
function columns(x: Mat, start: number, width: number): Mat {
  const out = new Float64Array(x.rows * width);
  for (let t = 0; t < x.rows; t++) {
    out.set(x.data.subarray(t * x.cols + start, t * x.cols + start + width), t * width);
  }
  return { rows: x.rows, cols: width, data: out };
}

/** One greedy step's outcome: the chosen token and the gap between the top two logits. */
export interface ReferenceStep {
  readonly token: number;
  readonly gap: number;
}

/** The float64 reference model of one checkpoint. */
export class ReferenceModel {
  readonly config: ModelConfig;
  readonly #w: Map<string, Mat>;
  /** The dtype K and V are rounded to before attention, or null (kept in float64). */
  readonly #kv: KvDtype | null;

  private constructor(config: ModelConfig, weights: Map<string, Mat>, kv: KvDtype | null) {
    this.config = config;
    this.#w = weights;
    this.#kv = kv;
  }

  /**
   * Loads every tensor of the checkpoint in `dir` into float64 (with `quantize`, the quantized
   * ones as their dequantized values: every linear projection and the LM head, a tied embedding
   * too; GPT-2's Conv1D weights grouped along their input dimension). `keepPacked`: a GPTQ / AWQ
   * checkpoint's weights keep their values under `quantize` (the format holds its codes as they
   * are; the other quantized tensors are quantized all the same). `kvCacheDtype`: K and V rounded
   * to it, as a KV cache of that dtype holds them.
   */
  static async load(
    dir: string,
    options: { quantize?: "int8" | "int4"; keepPacked?: boolean; kvCacheDtype?: KvDtype } = {},
  ): Promise<ReferenceModel> {
    const ck = await openCheckpoint(dir);
    try {
      const weights = new Map<string, Mat>();
      const format = options.quantize;
      const gpt2 = ck.config.arch === "GPT2LMHeadModel";
      // GPT-2's Conv1D weights are stored [in, out]; the format's groups run along `in`.
      const isConv1d = (name: string) => gpt2 && /\.(c_attn|c_proj|c_fc)\.weight$/.test(name);
      const quantized = (name: string) =>
        gpt2
          ? isConv1d(name) || name === "transformer.wte.weight"
          : /_proj\.weight$/.test(name) || name === "lm_head.weight" ||
            (ck.config.tieWordEmbeddings && name === "model.embed_tokens.weight");
      // A row-major [out, in] matrix as its dequantized values (kept when `in % 32 != 0`).
      const dequantized = (m: Mat, f: "int8" | "int4"): Mat =>
        m.cols % 32 === 0 ? { ...m, data: quantizeRef(m.data, m.cols, f).dequantized } : m;
      for (const [name, info] of ck.tensors) {
        const m = await load(ck, name);
        const kept = options.keepPacked === true && /^(GPTQ|AWQ|CT)_I\d$/.test(info.dtype);
        weights.set(
          name,
          format === undefined || !quantized(name) || kept
            ? m
            : isConv1d(name)
            ? transpose(dequantized(transpose(m), format))
            : dequantized(m, format),
        );
      }
      return new ReferenceModel(ck.config, weights, options.kvCacheDtype ?? null);
    } finally {
      ck.close();
    }
  }

  /** `m` as the KV cache holds it: rounded to its dtype, when one was given. */
  #cached(m: Mat): Mat {
    return this.#kv === null ? m : { ...m, data: roundToKv(m.data, this.#kv) };
  }

  #get(name: string): Mat {
    const m = this.#w.get(name);
    if (m === undefined) throw new RangeError(`reference model: missing tensor ${name}`);
    return m;
  }

  /** Logits `[T, vocab]` for every position of `tokens`. */
  forward(tokens: readonly number[]): Mat {
    const c = this.config;
    return c.arch === "GPT2LMHeadModel" ? this.#gpt2(tokens) : this.#llamaLike(tokens);
  }

  #embed(name: string, ids: readonly number[]): Mat {
    const table = this.#get(name);
    const out = new Float64Array(ids.length * table.cols);
    ids.forEach((id, t) =>
      out.set(table.data.subarray(id * table.cols, (id + 1) * table.cols), t * table.cols)
    );
    return { rows: ids.length, cols: table.cols, data: out };
  }

  #llamaLike(tokens: readonly number[]): Mat {
    const c = this.config;
    const g = (n: string) => this.#get(n);
    const d = c.headDim;
    const invFreq = ropeInvFreq(c);
    let h = this.#embed("model.embed_tokens.weight", tokens);
    for (let l = 0; l < c.numLayers; l++) {
      const p = `model.layers.${l}.`;
      const x = rmsNorm(h, g(p + "input_layernorm.weight"), c.normEps);
      const bias = (n: string) => (c.qkvBias ? g(p + `self_attn.${n}_proj.bias`) : undefined);
      let q = linear(x, g(p + "self_attn.q_proj.weight"), bias("q"));
      let k = linear(x, g(p + "self_attn.k_proj.weight"), bias("k"));
      const v = linear(x, g(p + "self_attn.v_proj.weight"), bias("v"));
      if (c.qkNorm) {
        q = rmsNorm(q, g(p + "self_attn.q_norm.weight"), c.normEps);
        k = rmsNorm(k, g(p + "self_attn.k_norm.weight"), c.normEps);
      }
      rope(q, c.numHeads, d, invFreq);
      rope(k, c.numKvHeads, d, invFreq);
      const a = attention(q, this.#cached(k), this.#cached(v), c.numHeads, c.numKvHeads, d);
      h = add(h, linear(a, g(p + "self_attn.o_proj.weight")));
      const y = rmsNorm(h, g(p + "post_attention_layernorm.weight"), c.normEps);
      const gate = linear(y, g(p + "mlp.gate_proj.weight"));
      const up = linear(y, g(p + "mlp.up_proj.weight"));
      const act = {
        ...gate,
        data: gate.data.map((v, i) => (v / (1 + Math.exp(-v))) * up.data[i]!),
      };
      h = add(h, linear(act, g(p + "mlp.down_proj.weight")));
    }
    h = rmsNorm(h, g("model.norm.weight"), c.normEps);
    const head = c.tieWordEmbeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    return linear(h, g(head));
  }

  #gpt2(tokens: readonly number[]): Mat {
    const c = this.config;
    const g = (n: string) => this.#get(n);
    const n = c.hiddenSize;
    let h = add(
      this.#embed("transformer.wte.weight", tokens),
      this.#embed("transformer.wpe.weight", tokens.map((_, i) => i)),
    );
    for (let l = 0; l < c.numLayers; l++) {
      const p = `transformer.h.${l}.`;
      const x = layerNorm(h, g(p + "ln_1.weight"), g(p + "ln_1.bias"), c.normEps);
      const qkv = conv1d(x, g(p + "attn.c_attn.weight"), g(p + "attn.c_attn.bias"));
      const a = attention(
        columns(qkv, 0, n),
        this.#cached(columns(qkv, n, n)),
        this.#cached(columns(qkv, 2 * n, n)),
        c.numHeads,
        c.numHeads,
        c.headDim,
      );
      h = add(h, conv1d(a, g(p + "attn.c_proj.weight"), g(p + "attn.c_proj.bias")));
      const y = layerNorm(h, g(p + "ln_2.weight"), g(p + "ln_2.bias"), c.normEps);
      const m = conv1d(y, g(p + "mlp.c_fc.weight"), g(p + "mlp.c_fc.bias"));
      const act = { ...m, data: m.data.map(geluNew) };
      h = add(h, conv1d(act, g(p + "mlp.c_proj.weight"), g(p + "mlp.c_proj.bias")));
    }
    h = layerNorm(h, g("transformer.ln_f.weight"), g("transformer.ln_f.bias"), c.normEps);
    return linear(h, g("transformer.wte.weight"));
  }

  /**
   * Greedy generation of `maxTokens` tokens (no stop conditions), with the top-2 logit gap of
   * each step: where the gap is tiny, a reduced-precision engine may legitimately differ.
   */
  greedy(prompt: readonly number[], maxTokens: number): ReferenceStep[] {
    const tokens = [...prompt];
    const steps: ReferenceStep[] = [];
    for (let s = 0; s < maxTokens; s++) {
      const logits = this.forward(tokens);
      const row = logits.data.subarray((logits.rows - 1) * logits.cols);
      let best = 0;
      for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i;
      let second = -Infinity;
      for (let i = 0; i < row.length; i++) if (i !== best && row[i]! > second) second = row[i]!;
      steps.push({ token: best, gap: row[best]! - second });
      tokens.push(best);
    }
    return steps;
  }
}
