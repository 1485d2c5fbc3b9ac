/**
 * Parsing of a Hugging Face `config.json` into a normalised, typed {@linkcode ModelConfig}.
 *
 * Supported architectures: `Qwen3ForCausalLM`, `Qwen2ForCausalLM`, `LlamaForCausalLM`,
 * `MistralForCausalLM` (all pre-norm RMSNorm + RoPE + gated SiLU MLP decoders; Mistral is
 * Llama's layout without biases, plus a `sliding_window` that the engine serves only where it
 * changes nothing: `max_model_len` at most the window) and `GPT2LMHeadModel` (LayerNorm, learned
 * absolute positions, GELU MLP). Both transformers 4.x (`rope_theta`, `rope_scaling` with `type`
 * or `rope_type`, `torch_dtype`) and 5.x (`rope_parameters`, `dtype`) spellings are accepted, as
 * are GPT-2's own names (`n_embd`, `n_layer`, ...). Unknown fields are ignored; a missing or
 * invalid field gives a one-line {@linkcode ConfigError} naming it.
 *
 * @module
 */

import { z } from "zod";
import { ConfigError, describeValue, requiredField } from "./errors.ts";
import { parseRope, ropeDict, type RopeScaling } from "./rope_config.ts";

export type { RopeScaling };

/** The model classes this engine can run (the `architectures` entry of `config.json`). */
export type Architecture =
  | "Qwen3ForCausalLM"
  | "Qwen2ForCausalLM"
  | "LlamaForCausalLM"
  | "MistralForCausalLM"
  | "GPT2LMHeadModel";

const ARCHITECTURES: readonly Architecture[] = [
  "Qwen3ForCausalLM",
  "Qwen2ForCausalLM",
  "LlamaForCausalLM",
  "MistralForCausalLM",
  "GPT2LMHeadModel",
];

function isArchitecture(s: unknown): s is Architecture {
  return ARCHITECTURES.some((a) => a === s);
}

/**
 * Activation of the MLP. `silu`: x * sigmoid(x) (gated: silu(gate) * up). `gelu_tanh`: the tanh
 * approximation (`gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`). `gelu`: the exact erf form.
 */
export type Activation = "silu" | "gelu_tanh" | "gelu";

/** A normalised model configuration. All sizes are element counts. */
export interface ModelConfig {
  readonly arch: Architecture;
  readonly vocabSize: number;
  readonly hiddenSize: number;
  readonly numLayers: number;
  /** Query heads. */
  readonly numHeads: number;
  /** Key/value heads (grouped-query attention); equals `numHeads` when the config omits it. */
  readonly numKvHeads: number;
  /** Per-head size: explicit `head_dim` when given (Qwen3), else `hiddenSize / numHeads`. */
  readonly headDim: number;
  /** MLP inner size (GPT-2: `n_inner`, or `4 * n_embd` when null). */
  readonly intermediateSize: number;
  /** `rms` (RMSNorm: Qwen, Llama) or `layer` (LayerNorm with bias: GPT-2). */
  readonly normType: "rms" | "layer";
  /** Epsilon of the norms (`rms_norm_eps` or `layer_norm_epsilon`). */
  readonly normEps: number;
  /** `rope` (Qwen, Llama) or `learned` absolute position embeddings (GPT-2 `wpe`). */
  readonly positionEmbedding: "rope" | "learned";
  /** RoPE base; 0 when `positionEmbedding` is `learned`. */
  readonly ropeTheta: number;
  readonly ropeScaling: RopeScaling;
  readonly maxPositionEmbeddings: number;
  /**
   * Mistral's `sliding_window`: each token attends to at most this many positions, or null
   * (full attention). The engine runs only `max_model_len <= slidingWindow`, where both agree.
   */
  readonly slidingWindow: number | null;
  /** The LM head reuses the token embedding matrix (no separate `lm_head.weight`). */
  readonly tieWordEmbeddings: boolean;
  /** Q, K and V projections have biases (Qwen2 always; Llama/Qwen3 `attention_bias`; GPT-2). */
  readonly qkvBias: boolean;
  /** The attention output projection has a bias (Llama / Qwen3 `attention_bias`; GPT-2). */
  readonly oProjBias: boolean;
  /** MLP projections have biases (Llama `mlp_bias`; GPT-2). */
  readonly mlpBias: boolean;
  /** Per-head RMSNorm of Q and K before RoPE (Qwen3). */
  readonly qkNorm: boolean;
  readonly hiddenAct: Activation;
  readonly bosTokenId: number | null;
  /** End-of-sequence ids (the config's single id or list, normalised to a list; may be empty). */
  readonly eosTokenIds: readonly number[];
  /** Dtype the checkpoint was saved in (`torch_dtype` / `dtype`), e.g. `bfloat16`; null if absent. */
  readonly torchDtype: string | null;
}

const posInt = z.number().int().positive();
const tokenId = z.number().int().nonnegative();
const posNum = z.number().positive();

/** Every field we read, each optional here; requiredness is checked per architecture. */
const rawSchema = z.object({
  architectures: z.array(z.string()).min(1),
  vocab_size: posInt.optional(),
  hidden_size: posInt.optional(),
  num_hidden_layers: posInt.optional(),
  num_attention_heads: posInt.optional(),
  num_key_value_heads: posInt.nullish(),
  head_dim: posInt.nullish(),
  intermediate_size: posInt.optional(),
  rms_norm_eps: posNum.optional(),
  rope_theta: posNum.optional(),
  rope_scaling: ropeDict.nullish(),
  rope_parameters: ropeDict.nullish(),
  max_position_embeddings: posInt.optional(),
  tie_word_embeddings: z.boolean().optional(),
  attention_bias: z.boolean().optional(),
  mlp_bias: z.boolean().optional(),
  use_sliding_window: z.boolean().nullish(),
  sliding_window: posInt.nullish(),
  hidden_act: z.string().optional(),
  bos_token_id: tokenId.nullish(),
  eos_token_id: z.union([tokenId, z.array(tokenId)]).nullish(),
  torch_dtype: z.string().nullish(),
  dtype: z.string().nullish(),
  // GPT-2 names
  n_embd: posInt.optional(),
  n_layer: posInt.optional(),
  n_head: posInt.optional(),
  n_positions: posInt.optional(),
  n_inner: posInt.nullish(),
  layer_norm_epsilon: posNum.optional(),
  activation_function: z.string().optional(),
});
type RawConfig = z.infer<typeof rawSchema>;

function valueAt(json: unknown, path: readonly PropertyKey[]): unknown {
  let v = json;
  for (const key of path) {
    if (typeof v !== "object" || v === null) return undefined;
    v = Reflect.get(v, key);
  }
  return v;
}

/** `activation(name)`, refused unless it is `supported` (what the model's kernels compute). */
function only(source: string, field: string, name: string, supported: Activation): Activation {
  const act = activation(source, field, name);
  if (act !== supported) {
    throw new ConfigError(
      `${source}: unsupported ${field} ${
        JSON.stringify(name)
      } for this architecture (its kernels compute ${supported === "silu" ? "silu" : "gelu_new"})`,
    );
  }
  return act;
}

function activation(source: string, field: string, name: string): Activation {
  switch (name) {
    case "silu":
    case "swish":
      return "silu";
    case "gelu_new":
    case "gelu_pytorch_tanh":
    case "gelu_fast":
      return "gelu_tanh";
    case "gelu":
      return "gelu";
    default:
      throw new ConfigError(
        `${source}: unsupported ${field} ${
          describeValue(name)
        } (supported: silu, gelu, gelu_new, gelu_pytorch_tanh)`,
      );
  }
}

function eosList(v: number | number[] | null | undefined): readonly number[] {
  if (v === undefined || v === null) return [];
  return Object.freeze(typeof v === "number" ? [v] : [...v]);
}

/**
 * Parses and normalises the contents of a `config.json` (already JSON-decoded).
 *
 * @param json the decoded JSON; anything not an object is rejected.
 * @param source file name to start error messages with (default `config.json`).
 * @throws {ConfigError} one line naming the field: unsupported `architectures`, unsupported
 * `rope_scaling.rope_type`, `missing required field "hidden_size"`, a field of the wrong type,
 * or inconsistent sizes.
 */
export function parseModelConfig(json: unknown, source = "config.json"): ModelConfig {
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw new ConfigError(`${source}: expected a JSON object`);
  }
  const archs = valueAt(json, ["architectures"]);
  if (archs === undefined || archs === null) {
    throw new ConfigError(`${source}: missing required field "architectures"`);
  }
  const arch = Array.isArray(archs) ? archs[0] : undefined;
  if (!isArchitecture(arch)) {
    throw new ConfigError(
      `${source}: unsupported architectures ${describeValue(archs)} (supported: ${
        ARCHITECTURES.join(", ")
      })`,
    );
  }
  const parsed = rawSchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const path = issue?.path ?? [];
    const field = path.map(String).join(".");
    throw new ConfigError(
      `${source}: invalid field "${field}": ${describeValue(valueAt(json, path))} (${
        issue?.message ?? "invalid"
      })`,
    );
  }
  const raw = parsed.data;
  const config = arch === "GPT2LMHeadModel"
    ? gpt2Config(source, raw)
    : decoderConfig(source, raw, arch);
  checkConsistency(source, config);
  return Object.freeze(config);
}

function decoderConfig(
  source: string,
  raw: RawConfig,
  arch: Exclude<Architecture, "GPT2LMHeadModel">,
): ModelConfig {
  const hiddenSize = requiredField(source, raw.hidden_size, "hidden_size");
  const numHeads = requiredField(source, raw.num_attention_heads, "num_attention_heads");
  const vocabSize = requiredField(source, raw.vocab_size, "vocab_size");
  const numLayers = requiredField(source, raw.num_hidden_layers, "num_hidden_layers");
  const intermediateSize = requiredField(source, raw.intermediate_size, "intermediate_size");
  if (raw.head_dim == null && hiddenSize % numHeads !== 0) {
    throw new ConfigError(
      `${source}: hidden_size ${hiddenSize} is not a multiple of num_attention_heads ${numHeads} and no head_dim is given`,
    );
  }
  if (raw.use_sliding_window === true) {
    throw new ConfigError(`${source}: use_sliding_window true is not supported`);
  }
  const rope = parseRope(source, raw);
  const attentionBias = raw.attention_bias ?? false;
  return {
    arch,
    vocabSize,
    hiddenSize,
    numLayers,
    numHeads,
    numKvHeads: raw.num_key_value_heads ?? numHeads,
    headDim: raw.head_dim ?? hiddenSize / numHeads,
    intermediateSize,
    normType: "rms",
    normEps: raw.rms_norm_eps ?? 1e-6,
    positionEmbedding: "rope",
    ropeTheta: rope.theta,
    ropeScaling: Object.freeze(rope.scaling),
    maxPositionEmbeddings: raw.max_position_embeddings ??
      (arch === "LlamaForCausalLM" ? 2048 : 32768),
    // Qwen2's sliding_window only applies with use_sliding_window (rejected above).
    slidingWindow: arch === "MistralForCausalLM" ? raw.sliding_window ?? null : null,
    tieWordEmbeddings: raw.tie_word_embeddings ?? false,
    qkvBias: arch === "Qwen2ForCausalLM" ? true : attentionBias,
    // transformers: Llama's and Qwen3's o_proj take attention_bias; Qwen2's and Mistral's never.
    oProjBias: arch === "LlamaForCausalLM" || arch === "Qwen3ForCausalLM" ? attentionBias : false,
    mlpBias: arch === "LlamaForCausalLM" ? (raw.mlp_bias ?? false) : false,
    qkNorm: arch === "Qwen3ForCausalLM",
    // The gated MLP kernel is SiLU's: any other activation would give a wrong answer.
    hiddenAct: only(source, "hidden_act", raw.hidden_act ?? "silu", "silu"),
    bosTokenId: raw.bos_token_id ?? null,
    eosTokenIds: eosList(raw.eos_token_id),
    torchDtype: raw.dtype ?? raw.torch_dtype ?? null,
  };
}

function gpt2Config(source: string, raw: RawConfig): ModelConfig {
  // GPT2Config maps hidden_size/num_hidden_layers/... onto its own names; accept either.
  const hiddenSize = requiredField(source, raw.n_embd ?? raw.hidden_size, "n_embd");
  const numHeads = requiredField(source, raw.n_head ?? raw.num_attention_heads, "n_head");
  const numLayers = requiredField(source, raw.n_layer ?? raw.num_hidden_layers, "n_layer");
  const vocabSize = requiredField(source, raw.vocab_size, "vocab_size");
  if (hiddenSize % numHeads !== 0) {
    throw new ConfigError(
      `${source}: n_embd ${hiddenSize} is not a multiple of n_head ${numHeads}`,
    );
  }
  return {
    arch: "GPT2LMHeadModel",
    vocabSize,
    hiddenSize,
    numLayers,
    numHeads,
    numKvHeads: numHeads,
    headDim: hiddenSize / numHeads,
    intermediateSize: raw.n_inner ?? 4 * hiddenSize,
    normType: "layer",
    normEps: raw.layer_norm_epsilon ?? 1e-5,
    positionEmbedding: "learned",
    ropeTheta: 0,
    ropeScaling: Object.freeze({ type: "none" }),
    maxPositionEmbeddings: raw.n_positions ?? raw.max_position_embeddings ?? 1024,
    slidingWindow: null,
    tieWordEmbeddings: raw.tie_word_embeddings ?? true,
    qkvBias: true,
    oProjBias: true,
    mlpBias: true,
    qkNorm: false,
    // GPT-2's MLP kernel is gelu_new (tanh); the exact erf GELU would differ slightly.
    hiddenAct: only(
      source,
      "activation_function",
      raw.activation_function ?? "gelu_new",
      "gelu_tanh",
    ),
    bosTokenId: raw.bos_token_id ?? null,
    eosTokenIds: eosList(raw.eos_token_id),
    torchDtype: raw.dtype ?? raw.torch_dtype ?? null,
  };
}

function checkConsistency(source: string, c: ModelConfig): void {
  if (c.numHeads % c.numKvHeads !== 0) {
    throw new ConfigError(
      `${source}: num_attention_heads ${c.numHeads} is not a multiple of num_key_value_heads ${c.numKvHeads}`,
    );
  }
  if (c.positionEmbedding === "rope" && c.headDim % 2 !== 0) {
    throw new ConfigError(`${source}: head_dim ${c.headDim} must be even for RoPE`);
  }
  for (const id of c.eosTokenIds) {
    if (id >= c.vocabSize) {
      throw new ConfigError(`${source}: eos_token_id ${id} is outside vocab_size ${c.vocabSize}`);
    }
  }
  if (c.bosTokenId !== null && c.bosTokenId >= c.vocabSize) {
    throw new ConfigError(
      `${source}: bos_token_id ${c.bosTokenId} is outside vocab_size ${c.vocabSize}`,
    );
  }
}

/**
 * The RoPE inverse frequency of each rotary pair `i` in `[0, headDim / 2)`, as float64:
 * `theta^(-2i / headDim)`, then scaled as transformers does for `config.ropeScaling`:
 * `linear` divides every frequency by `factor`; `llama3` divides the low frequencies (wavelength
 * above `original / low_freq_factor`) by `factor`, keeps the high ones (wavelength below
 * `original / high_freq_factor`) and interpolates smoothly in between.
 *
 * @throws {RangeError} for a model without RoPE (GPT-2).
 */
export function ropeInvFreq(config: ModelConfig): Float64Array {
  if (config.positionEmbedding !== "rope") {
    throw new RangeError(`Cannot compute RoPE frequencies: ${config.arch} has no RoPE`);
  }
  const dim = config.headDim;
  const out = new Float64Array(dim / 2);
  for (let i = 0; i < out.length; i++) out[i] = 1 / config.ropeTheta ** ((2 * i) / dim);
  const s = config.ropeScaling;
  if (s.type === "linear") {
    for (let i = 0; i < out.length; i++) out[i] = out[i]! / s.factor;
  } else if (s.type === "llama3") {
    const lowFreqWavelen = s.originalMaxPositionEmbeddings / s.lowFreqFactor;
    const highFreqWavelen = s.originalMaxPositionEmbeddings / s.highFreqFactor;
    for (let i = 0; i < out.length; i++) {
      const f = out[i]!;
      const wavelen = (2 * Math.PI) / f;
      if (wavelen > lowFreqWavelen) {
        out[i] = f / s.factor;
      } else if (wavelen >= highFreqWavelen) {
        const smooth = (s.originalMaxPositionEmbeddings / wavelen - s.lowFreqFactor) /
          (s.highFreqFactor - s.lowFreqFactor);
        out[i] = (1 - smooth) * (f / s.factor) + smooth * f;
      }
    }
  }
  return out;
}
