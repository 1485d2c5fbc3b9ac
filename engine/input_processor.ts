/**
 * The engine's input processing: the one place that owns the rules a request's sampling
 * parameters and token ids must follow, so that nothing a client sends can fail inside a step.
 * The HTTP server (after parsing types with zod), the `generate` CLI and
 * {@linkcode LLMEngine.generate} all call {@linkcode validateSamplingParams}; the rules are the
 * ranges the GPU kernels accept (kernels/sample.ts, kernels/logits_process.ts) plus the
 * documented caps below.
 *
 * | parameter | rule |
 * | --- | --- |
 * | `n` | integer 1 to {@linkcode SAMPLING_LIMITS}.maxN |
 * | `temperature` | finite, 0 (greedy) to `maxTemperature` |
 * | `top_p` | in (0, 1] |
 * | `top_k` | integer >= -1; -1 and 0 are off; a value >= the vocabulary is off |
 * | `min_p` | in [0, 1] |
 * | `seed` | any integer, or null (see {@linkcode kernelSeed} for the mapping to 32 bits) |
 * | `max_tokens` | integer >= 1, or null |
 * | `min_tokens` | integer >= 0, at most `max_tokens` |
 * | `stop` | at most `maxStopStrings` strings, each 1 to `maxStopStringChars` characters |
 * | `stop_token_ids` | at most `maxStopTokenIds` ids, each a token id of the model |
 * | `presence_penalty`, `frequency_penalty` | in [-2, 2] |
 * | `repetition_penalty` | in (0, `maxRepetitionPenalty`] |
 * | `logprobs` | integer 0 to `maxLogprobs`, or null |
 * | `prompt_logprobs` | integer 0 to `maxLogprobs`, or null |
 * | `logit_bias` | at most `maxLogitBias` entries; keys token ids of the model, values in [-100, 100] |
 * | `allowed_token_ids` | a non-empty list of token ids of the model, not with a structured output |
 * | `bad_words` | at most `maxStopStrings` words of 1 to `maxStopStringChars` characters (not blank), not with a structured output |
 *
 * A violation throws {@linkcode InvalidParameterError} naming the parameter by its OpenAI name
 * (`param`, e.g. `stop_token_ids.2`), which the server answers with a 400.
 *
 * @module
 */

import { TOP_LOGPROBS_MAX } from "../kernels/top_logprobs.ts";
import {
  kernelSeed,
  type SamplingParams,
  type StructuredOutputSpec,
} from "../scheduler/sampling_params.ts";

export { kernelSeed };

/** The caps of {@linkcode validateSamplingParams} (documented in the README). */
export const SAMPLING_LIMITS = Object.freeze({
  /** Choices per prompt. */
  maxN: 128,
  maxTemperature: 100,
  maxRepetitionPenalty: 100,
  /** Top log-probabilities per token (the top_logprobs kernel's maximum). */
  maxLogprobs: TOP_LOGPROBS_MAX,
  /** Stop strings per request (each is checked against every new token's text). */
  maxStopStrings: 64,
  /** Characters per stop string. */
  maxStopStringChars: 1000,
  /** Stop token ids per request. */
  maxStopTokenIds: 1024,
  /** `logit_bias` entries per request. */
  maxLogitBias: 1024,
});

/**
 * A request parameter outside what the engine accepts. `param` is the parameter's OpenAI name
 * (dotted path for an element, e.g. `stop.3`); the server answers 400 with it.
 */
export class InvalidParameterError extends RangeError {
  override name = "InvalidParameterError";
  /** The parameter's OpenAI (snake_case) name or dotted path. */
  readonly param: string;

  constructor(param: string, message: string) {
    super(message);
    this.param = param;
  }
}

/** What the rules need to know of the model. */
export interface ModelLimits {
  /** Logits width (token ids must be below it); 0 when unknown (no id checks). */
  readonly vocabSize: number;
}

function fail(param: string, message: string): never {
  throw new InvalidParameterError(param, `Invalid value for '${param}': ${message}`);
}

function checkRange(param: string, v: number, lo: number, hi: number, loOpen = false): void {
  if (!Number.isFinite(v) || (loOpen ? v <= lo : v < lo) || v > hi) {
    fail(param, `${v} is outside ${loOpen ? "(" : "["}${lo}, ${hi}]`);
  }
}

function checkInt(param: string, v: number, lo: number, hi = Number.MAX_SAFE_INTEGER): void {
  if (!Number.isInteger(v) || v < lo || v > hi) {
    fail(param, `expected an integer from ${lo} to ${hi}, got ${v}`);
  }
}

/**
 * Throws {@linkcode InvalidParameterError} unless every id of `ids` is a token id of the model
 * (an integer in [0, vocabSize)); `param` names the list (elements as `param.i`).
 */
export function checkTokenIds(ids: readonly number[], model: ModelLimits, param: string): void {
  const vocab = model.vocabSize;
  ids.forEach((id, i) => {
    if (!Number.isInteger(id) || id < 0 || (vocab > 0 && id >= vocab)) {
      throw new InvalidParameterError(
        `${param}.${i}`,
        `Token id ${id} is out of the vocabulary (size ${vocab})`,
      );
    }
  });
}

/**
 * Checks `params` against the rules of the module doc and returns them normalised and frozen
 * (`top_k` -1, or at least the vocabulary, becomes 0). Idempotent.
 *
 * @throws {InvalidParameterError} naming the first parameter that breaks a rule.
 */
export function validateSamplingParams(params: SamplingParams, model: ModelLimits): SamplingParams {
  const L = SAMPLING_LIMITS;
  const vocab = model.vocabSize;
  checkInt("n", params.n, 1, L.maxN);
  checkRange("temperature", params.temperature, 0, L.maxTemperature);
  checkRange("top_p", params.topP, 0, 1, true);
  checkInt("top_k", params.topK, -1);
  checkRange("min_p", params.minP, 0, 1);
  if (params.seed !== null && !Number.isInteger(params.seed)) {
    fail("seed", `expected an integer, got ${params.seed}`);
  }
  if (params.maxTokens !== null) checkInt("max_tokens", params.maxTokens, 1);
  checkInt("min_tokens", params.minTokens, 0);
  if (params.maxTokens !== null && params.minTokens > params.maxTokens) {
    fail("min_tokens", `min_tokens (${params.minTokens}) exceeds max_tokens (${params.maxTokens})`);
  }
  if (params.stop.length > L.maxStopStrings) {
    fail("stop", `${params.stop.length} stop strings; at most ${L.maxStopStrings} are allowed`);
  }
  params.stop.forEach((s, i) => {
    if (typeof s !== "string" || s.length === 0) fail(`stop.${i}`, "a stop string is empty");
    if (s.length > L.maxStopStringChars) {
      fail(
        `stop.${i}`,
        `a stop string has ${s.length} characters; at most ${L.maxStopStringChars}`,
      );
    }
  });
  if (params.stopTokenIds.length > L.maxStopTokenIds) {
    fail(
      "stop_token_ids",
      `${params.stopTokenIds.length} ids; at most ${L.maxStopTokenIds} are allowed`,
    );
  }
  checkTokenIds(params.stopTokenIds, model, "stop_token_ids");
  if (typeof params.ignoreEos !== "boolean") fail("ignore_eos", "expected a boolean");
  if (typeof params.includeStopStrInOutput !== "boolean") {
    fail("include_stop_str_in_output", "expected a boolean");
  }
  if (typeof params.skipSpecialTokens !== "boolean") {
    fail("skip_special_tokens", "expected a boolean");
  }
  checkRange("presence_penalty", params.presencePenalty, -2, 2);
  checkRange("frequency_penalty", params.frequencyPenalty, -2, 2);
  checkRange("repetition_penalty", params.repetitionPenalty, 0, L.maxRepetitionPenalty, true);
  if (params.logprobs !== null) checkInt("logprobs", params.logprobs, 0, L.maxLogprobs);
  const promptLogprobs = params.promptLogprobs ?? null;
  if (promptLogprobs !== null) checkInt("prompt_logprobs", promptLogprobs, 0, L.maxLogprobs);
  const bias = params.logitBias;
  if (bias !== null) {
    if (bias.size > L.maxLogitBias) {
      fail("logit_bias", `${bias.size} entries; at most ${L.maxLogitBias} are allowed`);
    }
    for (const [token, value] of bias) {
      if (!Number.isInteger(token) || token < 0 || (vocab > 0 && token >= vocab)) {
        fail("logit_bias", `key ${token} is not a token id of this model`);
      }
      checkRange(`logit_bias.${token}`, value, -100, 100);
    }
  }
  checkStructuredOutput(params.structuredOutput ?? null);
  const allowed = params.allowedTokenIds ?? null;
  if (allowed !== null) {
    if (!Array.isArray(allowed) || allowed.length === 0) {
      fail("allowed_token_ids", "expected a non-empty list of token ids");
    }
    checkTokenIds(allowed, model, "allowed_token_ids");
    if ((params.structuredOutput ?? null) !== null) {
      fail(
        "allowed_token_ids",
        "cannot be combined with a structured output (response_format, tools, guided_*)",
      );
    }
  }
  const bad = params.badWords ?? null;
  if (bad !== null) {
    if (!Array.isArray(bad) || bad.length > L.maxStopStrings) {
      fail("bad_words", `expected a list of at most ${L.maxStopStrings} words`);
    }
    bad.forEach((w, i) => {
      if (typeof w !== "string" || w.trim() === "" || w.length > L.maxStopStringChars) {
        fail(`bad_words.${i}`, `expected 1 to ${L.maxStopStringChars} characters, not blank`);
      }
    });
    if (bad.length > 0 && (params.structuredOutput ?? null) !== null) {
      fail(
        "bad_words",
        "cannot be combined with a structured output (response_format, tools, guided_*)",
      );
    }
  }
  const topK = params.topK < 0 || (vocab > 0 && params.topK >= vocab) ? 0 : params.topK;
  const after = params.structuredOutputAfter ?? null;
  if (after !== null && (typeof after !== "string" || after.length === 0 || after.length > 64)) {
    fail("structured_output_after", "expected a string of 1 to 64 characters");
  }
  return Object.freeze({
    ...params,
    topK,
    structuredOutput: params.structuredOutput ?? null,
    structuredOutputAfter: after,
    allowedTokenIds: allowed === null ? null : Object.freeze([...new Set(allowed)]),
    badWords: bad === null || bad.length === 0 ? null : Object.freeze([...bad]),
  });
}

/** Choices of a `choice` structured output: at most this many. */
export const MAX_STRUCTURED_CHOICES = 1024;
/** Characters of a regex or EBNF grammar, and of a serialised JSON schema: at most this many. */
export const MAX_GRAMMAR_CHARS = 100_000;

/** The shape checks of a structured-output spec (what it means is checked when compiled). */
function checkStructuredOutput(spec: StructuredOutputSpec | null): void {
  if (spec === null) return;
  const text = (param: string, value: unknown) => {
    if (typeof value !== "string" || value.length === 0) fail(param, "expected a non-empty string");
    if (value.length > MAX_GRAMMAR_CHARS) {
      fail(param, `${value.length} characters; at most ${MAX_GRAMMAR_CHARS}`);
    }
  };
  switch (spec.kind) {
    case "json_object":
      return;
    case "json_schema": {
      const size = JSON.stringify(spec.schema ?? null).length;
      if (
        typeof spec.schema !== "boolean" &&
        (typeof spec.schema !== "object" || spec.schema === null)
      ) {
        fail("response_format.json_schema.schema", "expected a JSON schema object");
      }
      if (size > MAX_GRAMMAR_CHARS) {
        fail(
          "response_format.json_schema.schema",
          `${size} characters; at most ${MAX_GRAMMAR_CHARS}`,
        );
      }
      if (typeof spec.strict !== "boolean") {
        fail("response_format.json_schema.strict", "expected a boolean");
      }
      return;
    }
    case "regex":
      return text("structured_outputs.regex", spec.pattern);
    case "grammar":
      return text("structured_outputs.grammar", spec.ebnf);
    case "tool_calls":
      if (!Array.isArray(spec.tools) || spec.tools.length === 0) {
        fail("tools", "expected a non-empty list of functions");
      }
      spec.tools.forEach((t, i) => text(`tools.${i}.function.name`, t.name));
      return;
    case "choice":
      if (!Array.isArray(spec.choices) || spec.choices.length === 0) {
        fail("structured_outputs.choice", "expected a non-empty list of strings");
      }
      if (spec.choices.length > MAX_STRUCTURED_CHOICES) {
        fail(
          "structured_outputs.choice",
          `${spec.choices.length} choices; at most ${MAX_STRUCTURED_CHOICES}`,
        );
      }
      spec.choices.forEach((c, i) => text(`structured_outputs.choice.${i}`, c));
      return;
    default:
      fail(
        "structured_outputs",
        `unknown kind ${JSON.stringify((spec as { kind: unknown }).kind)}`,
      );
  }
}

/** The OpenAI / vLLM parameter a structured-output error names, by kind. */
export const STRUCTURED_PARAM: Readonly<Record<StructuredOutputSpec["kind"], string>> = {
  json_object: "response_format",
  json_schema: "response_format",
  regex: "structured_outputs.regex",
  choice: "structured_outputs.choice",
  grammar: "structured_outputs.grammar",
  tool_calls: "tools",
};

/**
 * The rules that depend on what serves the request (after {@linkcode validateSamplingParams}):
 * structured outputs, token masks (`allowed_token_ids`, `bad_words`) and `prompt_logprobs` need
 * the webgpu executor (the mock runs no model), and `bad_words` the model's tokenizer.
 *
 * @throws {InvalidParameterError} naming the first parameter the engine cannot serve.
 */
export function checkServable(
  params: SamplingParams,
  engine: { readonly executor: "webgpu" | "mock"; readonly hasTokenizer: boolean },
): void {
  const mock = engine.executor !== "webgpu";
  const spec = params.structuredOutput ?? null;
  if (spec !== null && mock) {
    throw new InvalidParameterError(
      STRUCTURED_PARAM[spec.kind],
      "Structured outputs need the webgpu executor: the mock executor runs no model to constrain",
    );
  }
  if ((params.promptLogprobs ?? null) !== null && mock) {
    throw new InvalidParameterError(
      "prompt_logprobs",
      "prompt_logprobs needs the webgpu executor: the mock executor computes no logits",
    );
  }
  const masked = (params.allowedTokenIds ?? null) !== null
    ? "allowed_token_ids"
    : (params.badWords ?? null) !== null
    ? "bad_words"
    : null;
  if (masked !== null && mock) {
    throw new InvalidParameterError(
      masked,
      `${masked} needs the webgpu executor: the mock executor samples no logits to mask`,
    );
  }
  if ((params.badWords ?? null) !== null && !engine.hasTokenizer) {
    throw new InvalidParameterError("bad_words", "bad_words needs the model's tokenizer");
  }
}
