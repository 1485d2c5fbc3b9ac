/**
 * OpenAI request fields -> the engine's {@linkcode SamplingParams}: the context-length checks
 * and `max_tokens` default, `logit_bias` parsing, `stop` normalisation, and the model's
 * `generation_config.json` defaults for the fields a request leaves out. The parameter rules
 * themselves are the engine's ({@linkcode validateSamplingParams}); a violation is a 400 naming
 * the parameter as the request spelled it.
 *
 * @module
 */

import type { EngineClient } from "../engine/engine_api.ts";
import { InvalidParameterError, validateSamplingParams } from "../engine/input_processor.ts";
import {
  type SamplingParams,
  samplingParams,
  type StructuredOutputSpec,
} from "../scheduler/sampling_params.ts";
import { ApiError, type ChatRequest, type CompletionRequest } from "./protocol.ts";
import { structuredOutputFor } from "./structured_output.ts";

/** Where a request's prompt and output budget come from (for limits and error messages). */
export interface SamplingRequestShape {
  /** Prompt length in tokens. */
  promptLen: number;
  /** The requested output budget (`max_tokens` / `max_completion_tokens`), or null. */
  requestedMax: number | null;
  /** The budget when none is requested (capped by the room left); null means all the room. */
  defaultMax: number | null;
  /** Top log-probabilities per token (0: only the sampled token's), or null for none. */
  logprobs: number | null;
  /**
   * Top log-probabilities per prompt token (`params.promptLogprobs`), or null for none; default
   * the request's `prompt_logprobs`.
   */
  promptLogprobs?: number | null;
  /** The parameter errors about the prompt name (`prompt` or `messages`). */
  promptParam: string;
  /** The parameter errors about the budget name. */
  maxParam: string;
  /** The parameter errors about `logprobs` name (chat: `top_logprobs`); default `logprobs`. */
  logprobsParam?: string;
  /** The grammar of `tool_choice` required / a named function (server/tools.ts), if any. */
  toolSpec?: StructuredOutputSpec | null;
}

/**
 * The shared sampling fields of a completion or chat request -> {@linkcode SamplingParams} for
 * one prompt. Throws a 400 {@linkcode ApiError} for an empty prompt, a prompt or budget beyond
 * the model's context length, or a `logit_bias` key that is not a token id.
 */
export function samplingFor(
  engine: EngineClient,
  body: CompletionRequest | ChatRequest,
  shape: SamplingRequestShape,
): SamplingParams {
  const { promptLen, requestedMax, defaultMax, logprobs, promptParam, maxParam } = shape;
  const logprobsParam = shape.logprobsParam ?? "logprobs";
  const maxModelLen = engine.model.maxModelLen;
  if (promptLen === 0) {
    throw new ApiError(400, "The prompt is empty", { param: promptParam, code: "invalid_value" });
  }
  if (promptLen >= maxModelLen) {
    throw new ApiError(
      400,
      `This model's maximum context length is ${maxModelLen} tokens. However, your prompt has ${promptLen} tokens, leaving no room for output.`,
      { param: promptParam, code: "context_length_exceeded" },
    );
  }
  const room = maxModelLen - promptLen;
  let maxTokens: number;
  if (requestedMax !== null) {
    if (requestedMax > room) {
      throw new ApiError(
        400,
        `This model's maximum context length is ${maxModelLen} tokens. However, you requested ${
          promptLen + requestedMax
        } tokens (${promptLen} in the prompt, ${requestedMax} for the completion).`,
        { param: maxParam, code: "context_length_exceeded" },
      );
    }
    maxTokens = requestedMax;
  } else {
    maxTokens = Math.min(defaultMax ?? room, room);
  }
  // generation_config.json's max_new_tokens limits every request, as vLLM's does.
  const limit = engine.generationDefaults?.maxTokens;
  if (limit !== undefined && limit !== null) maxTokens = Math.min(maxTokens, limit);
  const logitBias = parseLogitBias(body.logit_bias);
  const stop = body.stop === null || body.stop === undefined
    ? []
    : typeof body.stop === "string"
    ? [body.stop]
    : body.stop;
  // generation_config.json's defaults apply to the fields the request leaves out.
  const d = engine.generationDefaults ?? {};
  const params = samplingParams({
    temperature: body.temperature ?? d.temperature ?? 1,
    topP: body.top_p ?? d.topP ?? 1,
    topK: body.top_k ?? d.topK ?? 0,
    minP: body.min_p ?? d.minP ?? 0,
    seed: body.seed ?? null,
    maxTokens,
    minTokens: body.min_tokens ?? 0,
    stop,
    includeStopStrInOutput: body.include_stop_str_in_output ?? false,
    skipSpecialTokens: body.skip_special_tokens ?? true,
    stopTokenIds: body.stop_token_ids ?? [],
    ignoreEos: body.ignore_eos ?? false,
    presencePenalty: body.presence_penalty ?? 0,
    frequencyPenalty: body.frequency_penalty ?? 0,
    repetitionPenalty: body.repetition_penalty ?? d.repetitionPenalty ?? 1,
    logprobs,
    promptLogprobs: shape.promptLogprobs !== undefined
      ? shape.promptLogprobs
      : body.prompt_logprobs ?? null,
    logitBias,
    allowedTokenIds: body.allowed_token_ids ?? null,
    badWords: body.bad_words ?? null,
    n: body.n ?? 1,
    structuredOutput: structuredOutputOf(body, shape.toolSpec ?? null),
  });
  try {
    return validateSamplingParams(params, engine.model);
  } catch (e) {
    if (!(e instanceof InvalidParameterError)) throw e;
    // The rules use the completion names; a chat request may have spelled these differently.
    const renamed = e.param === "max_tokens"
      ? maxParam
      : e.param === "logprobs"
      ? logprobsParam
      : null;
    if (renamed === null || renamed === e.param) throw e;
    throw new InvalidParameterError(renamed, e.message.replaceAll(`'${e.param}'`, `'${renamed}'`));
  }
}

/** The request's one grammar: its tool calls' or its structured output's (both: a 400). */
function structuredOutputOf(
  body: CompletionRequest | ChatRequest,
  toolSpec: StructuredOutputSpec | null,
): StructuredOutputSpec | null {
  const fromBody = structuredOutputFor(body);
  if (toolSpec !== null && fromBody !== null) {
    throw new ApiError(
      400,
      "tool_choice required or a named function cannot be combined with a structured output",
      { param: "tool_choice", code: "invalid_value" },
    );
  }
  return toolSpec ?? fromBody;
}

/**
 * `logit_bias` (token id as a decimal string -> bias) as a map, or null when absent. A key that
 * is not a decimal integer is a 400 (which ids and values are allowed is the engine's rule).
 */
export function parseLogitBias(bias: CompletionRequest["logit_bias"]): Map<number, number> | null {
  if (bias === null || bias === undefined) return null;
  const logitBias = new Map<number, number>();
  for (const [key, value] of Object.entries(bias)) {
    if (!/^\d+$/.test(key)) {
      throw new ApiError(400, `logit_bias key "${key}" is not a token id of this model`, {
        param: "logit_bias",
        code: "invalid_value",
      });
    }
    logitBias.set(Number(key), value);
  }
  return logitBias;
}
