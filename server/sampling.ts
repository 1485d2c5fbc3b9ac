/**
 * OpenAI request fields -> the engine's {@linkcode SamplingParams}: the context-length checks
 * and `max_tokens` default, `logit_bias` parsing, `stop` normalisation, and the model's
 * `generation_config.json` defaults for the fields a request leaves out.
 *
 * @module
 */

import type { EngineClient } from "../engine/engine_api.ts";
import { type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import { ApiError, type ChatRequest, type CompletionRequest } from "./protocol.ts";

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
  /** The parameter errors about the prompt name (`prompt` or `messages`). */
  promptParam: string;
  /** The parameter errors about the budget name. */
  maxParam: string;
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
  const logitBias = parseLogitBias(body.logit_bias, engine.model.vocabSize);
  const stop = body.stop === null || body.stop === undefined
    ? []
    : typeof body.stop === "string"
    ? [body.stop]
    : body.stop;
  // generation_config.json's defaults apply to the fields the request leaves out.
  const d = engine.generationDefaults ?? {};
  return samplingParams({
    temperature: body.temperature ?? d.temperature ?? 1,
    topP: body.top_p ?? d.topP ?? 1,
    topK: body.top_k === -1 ? 0 : body.top_k ?? d.topK ?? 0,
    minP: body.min_p ?? d.minP ?? 0,
    seed: body.seed ?? null,
    maxTokens,
    minTokens: Math.min(body.min_tokens ?? 0, maxTokens),
    stop: stop.filter((s) => s.length > 0),
    stopTokenIds: body.stop_token_ids ?? [],
    ignoreEos: body.ignore_eos ?? false,
    presencePenalty: body.presence_penalty ?? 0,
    frequencyPenalty: body.frequency_penalty ?? 0,
    repetitionPenalty: body.repetition_penalty ?? d.repetitionPenalty ?? 1,
    logprobs,
    logitBias,
    n: body.n ?? 1,
  });
}

/**
 * `logit_bias` (token id as a decimal string -> bias) as a map, or null when absent. A key that
 * is not a token id below `vocabSize` is a 400.
 */
export function parseLogitBias(
  bias: CompletionRequest["logit_bias"],
  vocabSize: number,
): Map<number, number> | null {
  if (bias === null || bias === undefined) return null;
  const logitBias = new Map<number, number>();
  for (const [key, value] of Object.entries(bias)) {
    const id = Number(key);
    if (!/^\d+$/.test(key) || id >= vocabSize) {
      throw new ApiError(400, `logit_bias key "${key}" is not a token id of this model`, {
        param: "logit_bias",
        code: "invalid_value",
      });
    }
    logitBias.set(id, value);
  }
  return logitBias;
}
