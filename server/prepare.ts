/**
 * Validated `/v1/completions` and `/v1/chat/completions` bodies -> a {@linkcode Prepared}
 * request: the reported model, the tokenized prompts (chat messages through the model's chat
 * template), the sampling parameters per prompt, and the response options (streaming, usage,
 * logprobs).
 *
 * @module
 */

import { templateMessage, toolPlanFor } from "./tools.ts";
import { checkTokenIds } from "../engine/input_processor.ts";
import type { ChatMessage } from "../engine/tokenizer.ts";
import type { SamplingParams } from "../scheduler/sampling_params.ts";
import { checkModel, requireTokenizer, type ServerContext } from "./context.ts";
import {
  ApiError,
  type ChatRequest,
  type CompletionRequest,
  generationPromptOptions,
  messageText,
} from "./protocol.ts";
import { samplingFor } from "./sampling.ts";

/** A validated, tokenized request ready to be fanned out. */
export interface Prepared {
  kind: "chat" | "completion";
  /** Response id (`cmpl-...` or `chatcmpl-...`); choice i's engine request is `${id}-${i}`. */
  id: string;
  /** Unix seconds. */
  created: number;
  /** The reported model name. */
  model: string;
  stream: boolean;
  /** `stream_options.include_usage`: a final usage chunk before `[DONE]`. */
  includeUsage: boolean;
  /** `stream_options.continuous_usage_stats`: usage in every chunk. */
  continuousUsage: boolean;
  /** Prompt token ids per prompt. */
  prompts: number[][];
  /** Choices per prompt. */
  n: number;
  /** Sampling parameters per prompt (maxTokens depends on the prompt length). */
  params: SamplingParams[];
  priority: number;
  logprobs: boolean;
  /**
   * `prompt_logprobs`: the top entries each prompt token's `prompt_logprobs` dict shows; null:
   * the response has no `prompt_logprobs` (the engine may still compute them for `echo` with
   * `logprobs`, see {@linkcode Prepared.echoLogprobs}).
   */
  promptLogprobs: number | null;
  /**
   * A completion's `echo` with `logprobs`: the top entries of each echoed prompt token's
   * `top_logprobs` (its `logprobs` start with the prompt's tokens); null otherwise.
   */
  echoLogprobs: number | null;
  /**
   * A completion's `echo` with `max_tokens` 0 (OpenAI's echo without generation, as vLLM serves
   * it): the engine generates one token, which the response leaves out (text and logprobs).
   */
  echoOnly: boolean;
  /** Chat with a reasoning parser: answers are split into `reasoning_content` and `content`. */
  reasoning: boolean;
  /** Chat with tools: answers are parsed for tool calls (server/tools.ts). */
  toolCalls: boolean;
  /**
   * `echo`: per prompt, the text each of its choices starts with (a completion's prompt; a chat's
   * last message when it is the assistant's, as vLLM echoes); null: none.
   */
  echo: readonly string[] | null;
  /**
   * vLLM's `return_tokens_as_token_ids`: every token string of the logprobs is `token_id:<id>`
   * (`text_offset` still counts the tokens' decoded texts, so it stays an offset into the text).
   */
  tokensAsIds: boolean;
  /**
   * vLLM's `return_token_ids`: the answer carries the prompt's token ids (`prompt_token_ids`) and
   * each choice's generated ids (`token_ids`).
   */
  returnTokenIds: boolean;
  /** vLLM's `cache_salt`, the same for every choice; null: the shared prefix cache. */
  cacheSalt: string | null;
}

/** The text choice `index` of `prep` starts with (`echo`; "" without). */
export function echoText(prep: Prepared, index: number): string {
  return prep.echo?.[Math.floor(index / prep.n)] ?? "";
}

/**
 * The fields of {@linkcode Prepared} both endpoints take as they are (vLLM's output options;
 * `return_tokens_as_token_ids` defaults to the server's `--return-tokens-as-token-ids`).
 */
function outputOptions(
  ctx: ServerContext,
  body: CompletionRequest | ChatRequest,
): Pick<Prepared, "tokensAsIds" | "returnTokenIds" | "cacheSalt"> {
  return {
    tokensAsIds: body.return_tokens_as_token_ids ?? ctx.tokensAsIds,
    returnTokenIds: body.return_token_ids ?? false,
    cacheSalt: body.cache_salt ?? null,
  };
}

function randomId(prefix: string): string {
  return `${prefix}-${crypto.randomUUID().replaceAll("-", "")}`;
}

function notSupported(param: string, what: string): ApiError {
  return new ApiError(400, `${what} is not supported yet`, { param, code: "not_supported" });
}

/**
 * Throws a 400 for a field this server accepts but cannot honour yet (never a silent plain-text
 * answer): `best_of` other than `n`, the legacy `functions` / `function_call`; and for
 * `stream_options` without `stream` (meaningless there; OpenAI and vLLM answer 400 too).
 */
function rejectUnsupported(body: CompletionRequest | ChatRequest): void {
  const has = (v: unknown) => v !== undefined && v !== null;
  if (has(body.stream_options) && body.stream !== true) {
    throw new ApiError(400, "stream_options is only allowed when stream is true", {
      param: "stream_options",
      code: "invalid_value",
    });
  }
  if (has(body.best_of) && body.best_of !== (body.n ?? 1)) {
    throw notSupported("best_of", `best_of ${body.best_of} (other than n = ${body.n ?? 1})`);
  }
  if ("messages" in body) {
    if (has(body.functions) && body.functions!.length > 0) {
      throw notSupported("functions", "Function calling (the legacy functions; use tools)");
    }
    if (has(body.function_call) && body.function_call !== "none") {
      throw notSupported("function_call", "Function calling");
    }
  }
}

/**
 * vLLM's `truncate_prompt_tokens`: the last `k` tokens of `ids` (`-1`: the last `max_model_len`);
 * `ids` itself when the field is absent. 400 for 0, values below -1 and values above
 * `max_model_len` (vLLM's rules).
 */
function truncatePrompt(
  ctx: ServerContext,
  ids: number[],
  k: number | null | undefined,
): number[] {
  if (k === null || k === undefined) return ids;
  const maxModelLen = ctx.engine.model.maxModelLen;
  if (k === 0 || k < -1 || k > maxModelLen) {
    throw new ApiError(
      400,
      `truncate_prompt_tokens must be -1 (the model's max_model_len) or 1 to ${maxModelLen}, got ${k}`,
      { param: "truncate_prompt_tokens", code: "invalid_value" },
    );
  }
  const keep = k === -1 ? maxModelLen : k;
  return ids.length > keep ? ids.slice(ids.length - keep) : ids;
}

/** Request messages -> the chat template's messages (content parts joined, null names dropped). */
export function chatMessages(messages: ChatRequest["messages"]): ChatMessage[] {
  return messages.map((m) => {
    const out: ChatMessage = { ...m, role: m.role, content: messageText(m.content) };
    if (out.name === null || out.name === undefined) delete out.name;
    return out;
  });
}

/**
 * The engine's `promptLogprobs` for a request's `prompt_logprobs` (`requested`) and, with a
 * completion's `echo` and `logprobs`, the echoed tokens' `logprobs` (`echoed`): the larger of
 * the two. An out-of-range `requested` is passed as it is, so the engine's 400 names
 * `prompt_logprobs` (an out-of-range `logprobs` is reported first, as `logprobs`).
 */
export function enginePromptLogprobs(
  requested: number | null,
  echoed: number | null,
): number | null {
  if (echoed === null) return requested;
  if (requested === null) return echoed;
  return requested >= 0 && requested < echoed ? echoed : requested;
}

/**
 * Prepares a `/v1/completions` request: `prompt` is a string, a list of strings, token ids or a
 * list of token-id lists (strings are encoded with the tokenizer's special tokens unless
 * `add_special_tokens` is false); `max_tokens` defaults to 16. With `echo`, each choice's text
 * starts with its prompt (the string sent, or the prompt's tokens decoded with their special
 * tokens when ids were sent or the prompt was truncated); with `echo` and `logprobs` k its
 * `logprobs` start with the prompt's tokens (the engine scores the prompt with
 * `promptLogprobs` = max(k, `prompt_logprobs`), as vLLM does); with `echo` and `max_tokens` 0
 * the choices are their prompts alone (one token is generated and left out, as vLLM does).
 * `suffix` is not implemented (400).
 */
export function prepareCompletion(ctx: ServerContext, body: CompletionRequest): Prepared {
  const { engine } = ctx;
  const model = checkModel(ctx, body.model);
  rejectUnsupported(body);
  const echo = body.echo === true;
  if (body.suffix !== null && body.suffix !== undefined) {
    throw new ApiError(400, "suffix is not supported", {
      param: "suffix",
      code: "invalid_value",
    });
  }
  const p = body.prompt;
  let prompts: number[][];
  const encoding = { addSpecialTokens: body.add_special_tokens ?? true };
  if (typeof p === "string") {
    prompts = [requireTokenizer(engine, "prompt").encode(p, encoding)];
  } else if (p.every((x) => typeof x === "string")) {
    const tok = requireTokenizer(engine, "prompt");
    prompts = p.map((s) => tok.encode(s, encoding));
  } else if (p.every((x) => typeof x === "number")) {
    prompts = [p];
  } else {
    prompts = p.filter((x) => Array.isArray(x));
  }
  const sent = prompts;
  // truncatePrompt returns the very array it was given when it keeps the whole prompt.
  prompts = prompts.map((ids) => truncatePrompt(ctx, ids, body.truncate_prompt_tokens));
  const texts = typeof p === "string" ? [p] : p.every((x) => typeof x === "string") ? p : null;
  const echoed = echo
    ? prompts.map((ids, i) =>
      texts !== null && ids === sent[i]
        ? texts[i]!
        : requireTokenizer(engine, "echo").decode(ids, { skipSpecialTokens: false })
    )
    : null;
  const nested = prompts.length > 1 || (Array.isArray(p) && Array.isArray(p[0]));
  prompts.forEach((ids, i) => checkTokenIds(ids, engine.model, nested ? `prompt.${i}` : "prompt"));
  const logprobs = body.logprobs ?? null;
  const promptLogprobs = body.prompt_logprobs ?? null;
  const echoLogprobs = echo ? logprobs : null;
  const echoOnly = echo && body.max_tokens === 0;
  const params = prompts.map((ids) =>
    samplingFor(engine, body, {
      promptLen: ids.length,
      requestedMax: echoOnly ? 1 : body.max_tokens ?? null,
      defaultMax: 16,
      logprobs,
      promptLogprobs: enginePromptLogprobs(promptLogprobs, echoLogprobs),
      promptParam: "prompt",
      maxParam: "max_tokens",
    })
  );
  return {
    reasoning: false,
    toolCalls: false,
    kind: "completion",
    id: randomId("cmpl"),
    created: Math.floor(Date.now() / 1000),
    model,
    stream: body.stream ?? false,
    includeUsage: body.stream_options?.include_usage ?? false,
    continuousUsage: body.stream_options?.continuous_usage_stats ?? false,
    prompts,
    n: body.n ?? 1,
    params,
    priority: body.priority ?? 0,
    logprobs: logprobs !== null,
    promptLogprobs,
    echoLogprobs,
    echoOnly,
    echo: echoed,
    ...outputOptions(ctx, body),
  };
}

/**
 * Prepares a `/v1/chat/completions` request: the messages go through the model's chat template
 * (with the generation prompt unless `add_generation_prompt` is false); `max_completion_tokens`
 * wins over `max_tokens`, and without either the output may use the whole context. With vLLM's
 * `echo`, when the last message is the assistant's, the answer's content starts with its text.
 */
export function prepareChat(ctx: ServerContext, body: ChatRequest): Prepared {
  const model = checkModel(ctx, body.model);
  rejectUnsupported(body);
  const tok = requireTokenizer(ctx.engine, "messages");
  const last = body.messages[body.messages.length - 1]!;
  const tools = toolPlanFor(body);
  const text = tok.applyChatTemplate(chatMessages(body.messages).map(templateMessage), {
    ...generationPromptOptions(body),
    extra: {
      ...(body.chat_template_kwargs ?? {}),
      ...(tools.templateTools === null ? {} : { tools: tools.templateTools }),
    },
  });
  const ids = truncatePrompt(
    ctx,
    tok.encode(text, { addSpecialTokens: body.add_special_tokens ?? false }),
    body.truncate_prompt_tokens,
  );
  if ((body.top_logprobs ?? 0) > 0 && body.logprobs !== true) {
    throw new ApiError(400, "top_logprobs requires logprobs to be true", {
      param: "top_logprobs",
      code: "invalid_value",
    });
  }
  const logprobs = body.logprobs === true ? body.top_logprobs ?? 0 : null;
  const requested = body.max_completion_tokens ?? body.max_tokens ?? null;
  const maxParam = body.max_completion_tokens !== null && body.max_completion_tokens !== undefined
    ? "max_completion_tokens"
    : "max_tokens";
  const params = [samplingFor(ctx.engine, body, {
    promptLen: ids.length,
    requestedMax: requested,
    defaultMax: null,
    logprobs,
    promptParam: "messages",
    maxParam,
    logprobsParam: "top_logprobs",
    toolSpec: tools.spec,
  })];
  const reasoning = ctx.reasoningParser !== null;
  if (
    reasoning && params[0]!.structuredOutput !== null &&
    body.chat_template_kwargs?.enable_thinking !== false
  ) {
    // The model thinks freely first: the grammar applies from the end of its reasoning on.
    params[0] = Object.freeze({ ...params[0]!, structuredOutputAfter: "</think>" });
  }
  return {
    kind: "chat",
    reasoning,
    toolCalls: tools.parse,
    id: randomId("chatcmpl"),
    created: Math.floor(Date.now() / 1000),
    model,
    stream: body.stream ?? false,
    includeUsage: body.stream_options?.include_usage ?? false,
    continuousUsage: body.stream_options?.continuous_usage_stats ?? false,
    prompts: [ids],
    n: body.n ?? 1,
    params,
    priority: body.priority ?? 0,
    logprobs: logprobs !== null,
    promptLogprobs: body.prompt_logprobs ?? null,
    echoLogprobs: null,
    echoOnly: false,
    echo: body.echo === true && last.role === "assistant" ? [messageText(last.content)] : null,
    ...outputOptions(ctx, body),
  };
}
