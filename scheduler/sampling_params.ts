/**
 * Per-request sampling parameters: a plain readonly record with vLLM's meanings and defaults.
 * Validation (ranges, types) happens at the API edge; the scheduler only reads `maxTokens`,
 * `minTokens`, `stopTokenIds` and `ignoreEos`, the sampler reads the rest.
 *
 * @module
 */

/** Sampling parameters of one request (vLLM names in camelCase). */
export interface SamplingParams {
  /** Softmax temperature; 0 means greedy (argmax). */
  readonly temperature: number;
  /** Nucleus sampling: keep the smallest set of tokens whose probability sums to >= topP (1 = off). */
  readonly topP: number;
  /** Keep only the topK most likely tokens (0 = off). */
  readonly topK: number;
  /** Drop tokens whose probability is below minP times the top probability (0 = off). */
  readonly minP: number;
  /**
   * Seed of the request's own random generator: any integer (see {@linkcode kernelSeed} for how
   * it becomes the kernel's 32-bit seed); null draws from the engine's generator.
   */
  readonly seed: number | null;
  /** Most tokens to generate; null means up to the model's context length (maxModelLen - prompt). */
  readonly maxTokens: number | null;
  /** EOS and stop token ids are ignored until this many tokens were generated. */
  readonly minTokens: number;
  /** Stop strings (checked by the detokenizer, which then calls `finishRequest`). */
  readonly stop: readonly string[];
  /**
   * Keep the stop string that ended the request at the end of the output text (vLLM's
   * `include_stop_str_in_output`); text is then never held back for a possible stop string.
   */
  readonly includeStopStrInOutput: boolean;
  /** Leave special tokens (chat markers, EOS) out of the output text (vLLM's default: true). */
  readonly skipSpecialTokens: boolean;
  /**
   * Token ids that end the request: the token is kept in the output's token ids, its text left
   * out unless `includeStopStrInOutput` (as vLLM does, and as for EOS).
   */
  readonly stopTokenIds: readonly number[];
  /** Keep generating past the model's EOS token. */
  readonly ignoreEos: boolean;
  /** Subtracted from the logit of every token already generated (OpenAI semantics). */
  readonly presencePenalty: number;
  /** Subtracted once per earlier occurrence of a token in the output (OpenAI semantics). */
  readonly frequencyPenalty: number;
  /** Divides positive / multiplies negative logits of tokens seen in prompt or output (1 = off). */
  readonly repetitionPenalty: number;
  /** Number of top log-probabilities to return per token; null = none. */
  readonly logprobs: number | null;
  /**
   * vLLM's `prompt_logprobs`: for every prompt token after the first, its log-probability given
   * the tokens before it, its rank, and this many most likely tokens at that position; null =
   * none. The scheduler computes a prompt with them in full (no prefix-cache reads) and hands
   * its positions to the sampler as rows, at most a step's rows at a time.
   */
  readonly promptLogprobs: number | null;
  /** Added to the logits of the given token ids before sampling. */
  readonly logitBias: ReadonlyMap<number, number> | null;
  /**
   * Only these token ids can be sampled (vLLM's `allowed_token_ids`; EOS too only when listed);
   * null = any. Applied as a fixed token mask on the GPU, as structured outputs' masks are.
   */
  readonly allowedTokenIds: readonly number[] | null;
  /**
   * Words the output must not contain (vLLM's `bad_words`; engine/bad_words.ts); null = none. A
   * request with them runs a step only once its previous token is known, like a constrained one.
   */
  readonly badWords: readonly string[] | null;
  /** Number of completions to return for the prompt (the edge expands n > 1 into requests). */
  readonly n: number;
  /**
   * Structured outputs: the grammar the output must follow (JSON, a JSON schema, a regex, a
   * choice of strings, an EBNF grammar); null = free text. A constrained request is scheduled
   * only when its previous token is known on the host (its next mask depends on it).
   */
  readonly structuredOutput: StructuredOutputSpec | null;
  /**
   * Text after which `structuredOutput` starts to apply (e.g. `</think>`: a reasoning model
   * thinks freely first); null = from the first token.
   */
  readonly structuredOutputAfter: string | null;
}

/**
 * What a request's output must follow (vLLM's `structured_outputs`; OpenAI's `response_format`
 * maps onto `json_object` and `json_schema`). Plain data, validated at the edge.
 */
export type StructuredOutputSpec =
  | { readonly kind: "json_object" }
  | { readonly kind: "json_schema"; readonly schema: unknown; readonly strict: boolean }
  | { readonly kind: "regex"; readonly pattern: string }
  | { readonly kind: "choice"; readonly choices: readonly string[] }
  | { readonly kind: "grammar"; readonly ebnf: string }
  | {
    /** One or more calls in the Hermes / Qwen format: `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`. */
    readonly kind: "tool_calls";
    /** The functions a call may name, each with its parameters' JSON schema. */
    readonly tools: readonly { readonly name: string; readonly parameters: unknown }[];
    /** Several calls (separated by a newline) allowed; false: exactly one. */
    readonly parallel: boolean;
  };

/** vLLM's defaults. */
export const DEFAULT_SAMPLING_PARAMS: SamplingParams = Object.freeze({
  temperature: 1,
  topP: 1,
  topK: 0,
  minP: 0,
  seed: null,
  maxTokens: 16,
  minTokens: 0,
  stop: Object.freeze([]),
  includeStopStrInOutput: false,
  skipSpecialTokens: true,
  stopTokenIds: Object.freeze([]),
  ignoreEos: false,
  presencePenalty: 0,
  frequencyPenalty: 0,
  repetitionPenalty: 1,
  logprobs: null,
  promptLogprobs: null,
  logitBias: null,
  allowedTokenIds: null,
  badWords: null,
  n: 1,
  structuredOutput: null,
  structuredOutputAfter: null,
});

/** `overrides` over {@linkcode DEFAULT_SAMPLING_PARAMS} (no validation). */
export function samplingParams(overrides: Partial<SamplingParams> = {}): SamplingParams {
  return { ...DEFAULT_SAMPLING_PARAMS, ...overrides };
}

const U32 = 0x1_0000_0000;

/**
 * The 32-bit seed the sampling kernel uses for request seed `seed` and choice `choice` (choice
 * `i` of a request with `n > 1` samples with seed `seed + i`, as vLLM does). The sum is exact
 * (BigInt): integers 0 to 2^32 - 1 are used as they are; any other integer is taken modulo 2^64
 * (two's complement for negatives) and mixed by splitmix64's finalizer, whose low 32 bits are
 * the kernel seed. Deterministic, never overflows, and the identity on 32-bit seeds, so
 * `kernelSeed(kernelSeed(s, i)) === kernelSeed(s, i)`.
 *
 * @throws {RangeError} when `seed` or `choice` is not an integer.
 */
export function kernelSeed(seed: number, choice = 0): number {
  if (!Number.isInteger(seed) || !Number.isInteger(choice)) {
    throw new RangeError(`Cannot derive a kernel seed from seed ${seed}, choice ${choice}`);
  }
  if (seed >= 0 && choice >= 0 && seed + choice < U32) return seed + choice;
  let z = BigInt.asUintN(64, BigInt(seed) + BigInt(choice));
  if (z < BigInt(U32)) return Number(z);
  z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
  z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
  z ^= z >> 31n;
  return Number(z & 0xffffffffn);
}
