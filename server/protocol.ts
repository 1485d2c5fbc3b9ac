/**
 * The OpenAI-compatible request bodies (validated with zod) and the error responses of the HTTP
 * server.
 *
 * Fields outside the schemas: the ones of OpenAI's or vLLM's API that this server does not
 * implement and that would change the answer ({@linkcode UNIMPLEMENTED_FIELDS}: `use_beam_search`,
 * `chat_template`, ...) are a 400 naming them unless they hold their default value; any
 * other field is ignored, as vLLM ignores it, so clients that send OpenAI-only fields (`store`,
 * `metadata`, ...) work, and the server logs each such name once ({@linkcode unlistedFields}).
 * Every range or type error becomes a 400 naming the offending parameter (`param`, dotted path
 * such as `messages.0.content`).
 *
 * @module
 */

import { z } from "zod";

/** An HTTP error with an OpenAI-style JSON body `{error: {message, type, param, code}}`. */
export class ApiError extends Error {
  override name = "ApiError";
  readonly status: number;
  readonly type: string;
  readonly param: string | null;
  readonly code: string | null;
  readonly headers: Readonly<Record<string, string>>;

  constructor(
    status: number,
    message: string,
    options: {
      type?: string;
      param?: string | null;
      code?: string | null;
      headers?: Record<string, string>;
    } = {},
  ) {
    super(message);
    this.status = status;
    this.type = options.type ?? defaultType(status);
    this.param = options.param ?? null;
    this.code = options.code ?? null;
    this.headers = options.headers ?? {};
  }

  /** The JSON error body. */
  body(): { error: { message: string; type: string; param: string | null; code: string | null } } {
    return {
      error: { message: this.message, type: this.type, param: this.param, code: this.code },
    };
  }
}

function defaultType(status: number): string {
  if (status === 404) return "not_found_error";
  if (status === 429) return "rate_limit_error";
  if (status === 503) return "service_unavailable_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

/** The JSON response for `err` (with its extra headers). */
export function errorResponse(err: ApiError): Response {
  return Response.json(err.body(), { status: err.status, headers: err.headers });
}

function pathOf(path: readonly PropertyKey[]): string {
  return path.map((p) => String(p)).join(".");
}

function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let v = root;
  for (const p of path) {
    if (typeof v !== "object" || v === null) return undefined;
    v = Reflect.get(v, p);
  }
  return v;
}

/** Parses `body` with `schema` or throws a 400 {@linkcode ApiError} naming the first bad field. */
export function parseBody<S extends z.ZodType>(schema: S, body: unknown): z.infer<S> {
  const result = schema.safeParse(body);
  if (result.success) return result.data;
  const issue = result.error.issues[0];
  if (issue === undefined) {
    throw new ApiError(400, "Invalid request body", { code: "invalid_value" });
  }
  const param = pathOf(issue.path);
  if (param === "") {
    throw new ApiError(400, `Invalid request body: ${issue.message}`, { code: "invalid_type" });
  }
  const missing = valueAt(body, issue.path) === undefined;
  if (missing) {
    throw new ApiError(400, `Missing required parameter: '${param}'`, {
      param,
      code: "missing_required_parameter",
    });
  }
  throw new ApiError(400, `Invalid value for '${param}': ${issue.message}`, {
    param,
    code: issue.code === "invalid_type" ? "invalid_type" : "invalid_value",
  });
}

const int = () => z.number().int();
const tokenIdList = z.array(int().nonnegative());

/** `stop`: one string or a list of strings. */
const stopSchema = z.union([z.string(), z.array(z.string())]).nullish();

/**
 * Sampling and output fields common to both endpoints (OpenAI names, plus vLLM's extras). Only
 * their types are checked here; their ranges and the model-dependent rules (vocabulary, caps) are
 * the engine's, in one place: engine/input_processor.ts.
 */
const samplingFields = {
  model: z.string().nullish(),
  n: int().nullish(),
  /** Accepted when equal to `n` (vLLM v1 has no best-of either); other values are a 400. */
  best_of: int().nullish(),
  temperature: z.number().nullish(),
  top_p: z.number().nullish(),
  top_k: int().nullish(),
  min_p: z.number().nullish(),
  /** Any JSON integer, as vLLM accepts (mapped into the kernel's 32 bits by `kernelSeed`). */
  seed: z.number().refine(Number.isInteger, "expected an integer").nullish(),
  stop: stopSchema,
  include_stop_str_in_output: z.boolean().nullish(),
  skip_special_tokens: z.boolean().nullish(),
  /** vLLM's: keep the last k prompt tokens (-1: the last max_model_len). */
  truncate_prompt_tokens: int().nullish(),
  stop_token_ids: z.array(int()).nullish(),
  min_tokens: int().nullish(),
  ignore_eos: z.boolean().nullish(),
  presence_penalty: z.number().nullish(),
  frequency_penalty: z.number().nullish(),
  repetition_penalty: z.number().nullish(),
  logit_bias: z.record(z.string(), z.number()).nullish(),
  /**
   * vLLM's: each prompt token's log-probability and rank, with this many most likely tokens at
   * its position (0..20; the range is the engine's rule), null = none.
   */
  prompt_logprobs: int().nullish(),
  /** vLLM's: only these token ids can be sampled. */
  allowed_token_ids: z.array(int()).nullish(),
  /** vLLM's: words the output must not contain. */
  bad_words: z.array(z.string()).nullish(),
  priority: int().nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({
    include_usage: z.boolean().nullish(),
    continuous_usage_stats: z.boolean().nullish(),
  }).nullish(),
  max_tokens: int().nullish(),
  user: z.string().nullish(),
  /** OpenAI's: `text`, `json_object`, or `json_schema` with `{name, schema, strict}`. */
  response_format: z.union([
    z.object({ type: z.literal("text") }),
    z.object({ type: z.literal("json_object") }),
    z.object({
      type: z.literal("json_schema"),
      json_schema: z.object({
        name: z.string().nullish(),
        description: z.string().nullish(),
        schema: z.union([z.record(z.string(), z.unknown()), z.boolean()]).nullish(),
        strict: z.boolean().nullish(),
      }),
    }),
  ]).nullish(),
  /** vLLM's structured outputs: one of `json`, `regex`, `choice`, `grammar`, `json_object`. */
  structured_outputs: z.object({
    json: z.union([z.record(z.string(), z.unknown()), z.boolean(), z.string()]).nullish(),
    regex: z.string().nullish(),
    choice: z.array(z.string()).nullish(),
    grammar: z.string().nullish(),
    json_object: z.boolean().nullish(),
    structural_tag: z.unknown().optional(),
    disable_any_whitespace: z.boolean().nullish(),
  }).nullish(),
  /** vLLM's older spellings of `structured_outputs`. */
  guided_json: z.union([z.record(z.string(), z.unknown()), z.boolean(), z.string()]).nullish(),
  guided_regex: z.string().nullish(),
  guided_choice: z.array(z.string()).nullish(),
  guided_grammar: z.string().nullish(),
  /**
   * vLLM's: every token string of the logprobs is written `token_id:<id>` (distinct tokens stay
   * distinct even when they decode to the same text).
   */
  return_tokens_as_token_ids: z.boolean().nullish(),
  /** vLLM's: the answer carries the prompt's token ids and each choice's generated ids. */
  return_token_ids: z.boolean().nullish(),
  /**
   * vLLM's: the request reads and shares prefix-cache blocks only with requests of the same salt
   * (a non-empty string; null = the shared cache).
   */
  cache_salt: z.string().min(1, "expected a non-empty string").nullish(),
};

/** Whether a field holds what leaving it out means: absent or null. */
export const unset = (v: unknown) => v === undefined || v === null;
/** ... or false. */
export const unsetOrFalse = (v: unknown) => unset(v) || v === false;
/** ... or an empty list. */
const unsetOrEmpty = (v: unknown) => unset(v) || (Array.isArray(v) && v.length === 0);

/** A table of unimplemented request fields (see {@linkcode UNIMPLEMENTED_FIELDS}). */
export type UnimplementedFields = Readonly<
  Record<string, { readonly what: string; readonly harmless: (v: unknown) => boolean }>
>;

/**
 * Request fields of OpenAI's or vLLM's API that this server does not implement, each with what
 * it would change and the values that change nothing (a 400 otherwise, see
 * {@linkcode unlistedFields}).
 */
export const UNIMPLEMENTED_FIELDS: UnimplementedFields = {
  use_beam_search: { what: "beam search", harmless: unsetOrFalse },
  logits_processors: { what: "custom logits processors", harmless: unsetOrEmpty },
  chat_template: { what: "a chat template sent with the request", harmless: unset },
  documents: { what: "documents passed to the chat template", harmless: unsetOrEmpty },
  guided_whitespace_pattern: { what: "a whitespace pattern for JSON output", harmless: unset },
  audio: { what: "audio output", harmless: unset },
  modalities: {
    what: "output modalities other than text",
    harmless: (v) => unset(v) || (Array.isArray(v) && v.every((m) => m === "text")),
  },
  web_search_options: { what: "web search", harmless: unset },
};

/**
 * The top-level fields of `body` that `schema` does not list: throws a 400 (code
 * `unsupported_parameter`, naming the field) for the first one in `unimplemented` (default
 * {@linkcode UNIMPLEMENTED_FIELDS}) that holds more than its default, and returns the names of
 * the others, which the request ignores. Not an object: nothing (the schema reports it).
 */
export function unlistedFields(
  schema: z.ZodObject,
  body: unknown,
  unimplemented: UnimplementedFields = UNIMPLEMENTED_FIELDS,
): string[] {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return [];
  const ignored: string[] = [];
  for (const [name, value] of Object.entries(body)) {
    if (name in schema.shape) continue;
    const field = Object.hasOwn(unimplemented, name) ? unimplemented[name] : undefined;
    if (field === undefined) {
      ignored.push(name);
    } else if (!field.harmless(value)) {
      throw new ApiError(
        400,
        `Unsupported parameter: '${name}': this server does not implement ${field.what}`,
        { param: name, code: "unsupported_parameter" },
      );
    }
  }
  return ignored;
}

/** `POST /v1/completions`. */
export const completionRequestSchema = z.object({
  ...samplingFields,
  prompt: z.union([
    z.string(),
    z.array(z.string()).min(1),
    tokenIdList.min(1),
    z.array(tokenIdList.min(1)).min(1),
  ]),
  /** Number of top log-probabilities per token (0..20), null = none. */
  logprobs: int().nullish(),
  echo: z.boolean().nullish(),
  suffix: z.string().nullish(),
  /** vLLM's: a string prompt is encoded with the tokenizer's special tokens (BOS); default true. */
  add_special_tokens: z.boolean().nullish(),
});

/** A validated completion request. */
export type CompletionRequest = z.infer<typeof completionRequestSchema>;

const contentPart = z.object({ type: z.literal("text"), text: z.string() });

/** The chat roles of OpenAI's API. */
export const CHAT_ROLES = ["system", "developer", "user", "assistant", "tool", "function"] as const;

/** One chat message; content is text or a list of text parts. */
export const chatMessageSchema = z.looseObject({
  role: z.enum(CHAT_ROLES),
  content: z.union([z.string(), z.array(contentPart)]).nullish(),
  name: z.string().nullish(),
});

/** `POST /v1/chat/completions`. */
export const chatRequestSchema = z.object({
  ...samplingFields,
  messages: z.array(chatMessageSchema).min(1),
  max_completion_tokens: int().nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: int().nullish(),
  /** Tool calling (server/tools.ts validates the entries). */
  tools: z.array(z.unknown()).nullish(),
  tool_choice: z.unknown().optional(),
  parallel_tool_calls: z.boolean().nullish(),
  functions: z.array(z.unknown()).nullish(),
  function_call: z.unknown().optional(),
  add_generation_prompt: z.boolean().nullish(),
  continue_final_message: z.boolean().nullish(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
  /** vLLM's: the answer starts with the last message's text when that is the assistant's. */
  echo: z.boolean().nullish(),
  /** vLLM's: the rendered template is encoded with the tokenizer's special tokens; default false. */
  add_special_tokens: z.boolean().nullish(),
});

/** A validated chat request. */
export type ChatRequest = z.infer<typeof chatRequestSchema>;

/** `POST /tokenize`: a prompt, or chat messages rendered with the chat template (one of them). */
export const tokenizeRequestSchema = z.object({
  model: z.string().nullish(),
  prompt: z.string().optional(),
  messages: z.array(chatMessageSchema).min(1).optional(),
  add_generation_prompt: z.boolean().nullish(),
  continue_final_message: z.boolean().nullish(),
  add_special_tokens: z.boolean().nullish(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
  /** vLLM's: also answer each token's vocabulary string (`token_strs`); default false. */
  return_token_strs: z.boolean().nullish(),
});

/**
 * The chat template's generation-prompt options of a chat or `/tokenize` request: vLLM's
 * `add_generation_prompt` (default true) and `continue_final_message` (default false), which
 * cannot both be true (a 400, as vLLM answers).
 */
export function generationPromptOptions(body: {
  add_generation_prompt?: boolean | null;
  continue_final_message?: boolean | null;
}): { addGenerationPrompt: boolean; continueFinalMessage: boolean } {
  const addGenerationPrompt = body.add_generation_prompt ?? true;
  const continueFinalMessage = body.continue_final_message ?? false;
  if (addGenerationPrompt && continueFinalMessage) {
    throw new ApiError(
      400,
      "Cannot set both continue_final_message and add_generation_prompt to true " +
        "(add_generation_prompt defaults to true: send it as false)",
      { param: "continue_final_message", code: "invalid_value" },
    );
  }
  return { addGenerationPrompt, continueFinalMessage };
}

/** `POST /detokenize`. */
export const detokenizeRequestSchema = z.object({
  model: z.string().nullish(),
  tokens: tokenIdList,
});

/** `POST /batch/test` (the user's mock-model batching experiment, seed 000). */
export const batchTestRequestSchema = z.object({
  batch_size: int().min(1).max(4096),
  num_requests: int().min(1).max(10_000),
  latency_ms: z.number().min(0).max(60_000),
  scheduler: z.enum(["static", "dynamic", "continuous"]).default("dynamic"),
  /** Prompt length of each mock request in tokens. */
  prompt_len: int().min(1).max(65_536).default(16),
  /** Tokens generated per mock request. */
  output_len: int().min(1).max(65_536).default(1),
});

/** A validated `/batch/test` request. */
export type BatchTestRequest = z.infer<typeof batchTestRequestSchema>;

/** Text of a chat message's content (text parts concatenated). */
export function messageText(content: z.infer<typeof chatMessageSchema>["content"]): string {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  return content.map((p) => p.text).join("");
}
