/**
 * The request body of OpenAI's Responses API, `POST /v1/responses` (validated with zod), as
 * vLLM serves it: the top-level fields ({@linkcode responsesRequestSchema}) and, parsed one by one
 * so that a 400 names the exact entry (`input.2.content.0.type`, `tools.1.type`), the input items,
 * function tools, `tool_choice` and `text.format` ({@linkcode parseInputItem}, ...).
 *
 * Fields outside the schema follow the chat endpoint's policy (server/protocol.ts
 * `unlistedFields`): those of {@linkcode RESPONSES_UNIMPLEMENTED_FIELDS} (stored-state features
 * such as `background` and `conversation`, prompt templates, `truncation: "auto"`, and chat-API
 * spellings that would change the answer here, such as `max_tokens`) are a 400 unless they hold
 * their default; any other field (`service_tier`, `prompt_cache_key`, ...) is ignored and
 * logged once.
 *
 * @module
 */

import { z } from "zod";
import {
  ApiError,
  chatRequestSchema,
  UNIMPLEMENTED_FIELDS,
  type UnimplementedFields,
  unset,
  unsetOrFalse,
} from "./protocol.ts";

/** Chat-path fields a Responses request may carry as they are (vLLM's extra parameters). */
const passThrough = chatRequestSchema.pick({
  seed: true,
  top_k: true,
  min_p: true,
  presence_penalty: true,
  frequency_penalty: true,
  repetition_penalty: true,
  stop: true,
  ignore_eos: true,
  min_tokens: true,
  logit_bias: true,
  stop_token_ids: true,
  include_stop_str_in_output: true,
  skip_special_tokens: true,
  bad_words: true,
  allowed_token_ids: true,
  priority: true,
  cache_salt: true,
  structured_outputs: true,
  chat_template_kwargs: true,
});

/** The pass-through fields `body` sets, as the chat request spells them (the same names). */
export function passThroughFields(body: ResponsesRequest): z.infer<typeof passThrough> {
  return passThrough.parse(body);
}

/** The `include` values of OpenAI's API (see the README for what each does here). */
export const INCLUDE_VALUES = [
  "message.output_text.logprobs",
  "reasoning.encrypted_content",
  "code_interpreter_call.outputs",
  "computer_call_output.output.image_url",
  "file_search_call.results",
  "message.input_image.image_url",
  "web_search_call.action.sources",
  "web_search_call.results",
] as const;

/** `POST /v1/responses`. */
export const responsesRequestSchema = z.object({
  ...passThrough.shape,
  model: z.string().nullish(),
  /** A user message, or a list of input items (checked one by one: {@linkcode parseInputItem}). */
  input: z.union([z.string(), z.array(z.unknown()).min(1)]),
  /** A system message before the input. */
  instructions: z.string().nullish(),
  max_output_tokens: z.number().int().nullish(),
  temperature: z.number().nullish(),
  top_p: z.number().nullish(),
  /** Function tools (checked one by one: {@linkcode parseFunctionTool}). */
  tools: z.array(z.unknown()).nullish(),
  tool_choice: z.unknown().optional(),
  parallel_tool_calls: z.boolean().nullish(),
  /** Only for built-in tools, which this server has none of: echoed, changes nothing. */
  max_tool_calls: z.number().int().nullish(),
  stream: z.boolean().nullish(),
  /** Accepted; as vLLM (without its store), nothing is stored either way. */
  store: z.boolean().nullish(),
  /** This server keeps no responses: anything but null is a 400. */
  previous_response_id: z.string().nullish(),
  reasoning: z.object({
    effort: z.string().nullish(),
    summary: z.enum(["auto", "concise", "detailed"]).nullish(),
    generate_summary: z.enum(["auto", "concise", "detailed"]).nullish(),
  }).nullish(),
  text: z.object({
    format: z.unknown().optional(),
    verbosity: z.enum(["low", "medium", "high"]).nullish(),
  }).nullish(),
  include: z.array(z.enum(INCLUDE_VALUES)).nullish(),
  top_logprobs: z.number().int().nullish(),
  metadata: z.record(z.string(), z.string()).nullish(),
  user: z.string().nullish(),
});

/** A validated Responses request. */
export type ResponsesRequest = z.infer<typeof responsesRequestSchema>;

/**
 * Fields outside {@linkcode responsesRequestSchema} that would change the answer (a 400 naming
 * them unless they hold their default): the chat endpoint's ({@linkcode UNIMPLEMENTED_FIELDS})
 * and the Responses API's own.
 */
export const RESPONSES_UNIMPLEMENTED_FIELDS: UnimplementedFields = {
  ...UNIMPLEMENTED_FIELDS,
  background: { what: "background responses (it stores no responses)", harmless: unsetOrFalse },
  conversation: { what: "conversations (it keeps no conversation state)", harmless: unset },
  prompt: { what: "prompt templates", harmless: unset },
  truncation: {
    what: "truncation 'auto' (a prompt longer than the context is a 400)",
    harmless: (v) => unset(v) || v === "disabled",
  },
  n: { what: "several answers per response", harmless: (v) => unset(v) || v === 1 },
  max_tokens: { what: "max_tokens here (use max_output_tokens)", harmless: unset },
  max_completion_tokens: {
    what: "max_completion_tokens here (use max_output_tokens)",
    harmless: unset,
  },
  response_format: { what: "response_format here (use text.format)", harmless: unset },
  logprobs: {
    what: "logprobs here (use include: ['message.output_text.logprobs'])",
    harmless: unsetOrFalse,
  },
  messages: { what: "messages here (use input)", harmless: unset },
};

/** One text part of a message's content. */
const textPart = z.object({
  type: z.enum(["input_text", "output_text"]),
  text: z.string(),
});

/** A message item: `type` "message" or left out; content a string or text parts. */
const messageItem = z.object({
  type: z.literal("message").optional(),
  role: z.enum(["user", "assistant", "system", "developer"]),
  content: z.union([z.string(), z.array(z.unknown())]),
  /** An assistant message passed back `in_progress` or `incomplete` is continued (vLLM's). */
  status: z.enum(["in_progress", "completed", "incomplete"]).nullish(),
});

/** An earlier function call of the model. */
const functionCallItem = z.object({
  type: z.literal("function_call"),
  call_id: z.string().min(1),
  name: z.string().min(1),
  arguments: z.string(),
});

/** The result of an earlier function call. */
const functionCallOutputItem = z.object({
  type: z.literal("function_call_output"),
  call_id: z.string().min(1),
  output: z.union([z.string(), z.array(z.unknown())]),
});

/** An earlier reasoning item: its text is in `content` (or, else, `summary`). */
const reasoningItem = z.object({
  type: z.literal("reasoning"),
  summary: z.array(z.object({ type: z.literal("summary_text"), text: z.string() })).nullish(),
  content: z.array(z.object({ type: z.literal("reasoning_text"), text: z.string() })).nullish(),
  encrypted_content: z.string().nullish(),
});

/** One input item, parsed. */
export type InputItem =
  | (Omit<z.infer<typeof messageItem>, "content"> & { type: "message"; text: string })
  | z.infer<typeof functionCallItem>
  | (Omit<z.infer<typeof functionCallOutputItem>, "output"> & { output: string })
  | (z.infer<typeof reasoningItem> & { text: string });

/** A 400 naming `param`. */
export function invalidParam(param: string, message: string, code = "invalid_value"): ApiError {
  return new ApiError(400, message, { param, code });
}

/** `value` parsed with `schema`, or a 400 naming the first bad field under `param`. */
export function parsedAt<T>(schema: z.ZodType<T>, value: unknown, param: string): T {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const path = [param, ...issue.path.map(String)].join(".");
  throw invalidParam(path, `Invalid value for '${path}': ${issue.message}`);
}

function typeOf(value: unknown): unknown {
  return typeof value === "object" && value !== null ? Reflect.get(value, "type") : undefined;
}

function unsupported(param: string, what: string): ApiError {
  return invalidParam(param, `${what} is not supported by this server`, "unsupported_parameter");
}

/** The text of text parts (`input_text` / `output_text`), each checked, joined. */
function partsText(parts: readonly unknown[], param: string): string {
  return parts.map((part, j) => {
    const type = typeOf(part);
    if (type !== "input_text" && type !== "output_text") {
      throw unsupported(`${param}.${j}.type`, `Content of type ${JSON.stringify(type)}`);
    }
    return parsedAt(textPart, part, `${param}.${j}`).text;
  }).join("");
}

/**
 * Input item `i`: a message (`type` "message" or none), a `function_call`, a
 * `function_call_output` or a `reasoning` item; any other type (images, files, built-in tool
 * calls, item references) is a 400 naming `input.i.type`.
 */
export function parseInputItem(item: unknown, i: number): InputItem {
  const param = `input.${i}`;
  const type = typeOf(item);
  switch (type) {
    case undefined:
    case "message": {
      const m = parsedAt(messageItem, item, param);
      const text = typeof m.content === "string"
        ? m.content
        : partsText(m.content, `${param}.content`);
      return { role: m.role, status: m.status, type: "message", text };
    }
    case "function_call":
      return parsedAt(functionCallItem, item, param);
    case "function_call_output": {
      const o = parsedAt(functionCallOutputItem, item, param);
      const output = typeof o.output === "string"
        ? o.output
        : partsText(o.output, `${param}.output`);
      return { ...o, output };
    }
    case "reasoning": {
      const r = parsedAt(reasoningItem, item, param);
      if (r.encrypted_content !== null && r.encrypted_content !== undefined) {
        throw unsupported(`${param}.encrypted_content`, "Encrypted reasoning content");
      }
      const parts = r.content !== null && r.content !== undefined && r.content.length > 0
        ? r.content
        : r.summary ?? [];
      return { ...r, text: parts.map((p) => p.text).join("") };
    }
    default:
      throw unsupported(`${param}.type`, `Input items of type ${JSON.stringify(type)}`);
  }
}

/** A function tool, the Responses API's flat shape. */
const functionTool = z.object({
  type: z.literal("function"),
  name: z.string().min(1).max(64),
  description: z.string().nullish(),
  parameters: z.record(z.string(), z.unknown()).nullish(),
  strict: z.boolean().nullish(),
});

/** A validated function tool. */
export type FunctionTool = z.infer<typeof functionTool>;

/** `tools` entry `i`: a function tool; built-in tools (web search, MCP, ...) are a 400. */
export function parseFunctionTool(tool: unknown, i: number): FunctionTool {
  const type = typeOf(tool);
  if (type !== "function") {
    throw unsupported(`tools.${i}.type`, `Tools of type ${JSON.stringify(type)}`);
  }
  return parsedAt(functionTool, tool, `tools.${i}`);
}

/** `tool_choice`: `none`, `auto`, `required` or one function by name. */
const toolChoiceSchema = z.union([
  z.enum(["none", "auto", "required"]),
  z.object({ type: z.literal("function"), name: z.string() }),
]);

/** A validated `tool_choice`. */
export type ToolChoice = z.infer<typeof toolChoiceSchema>;

/** `tool_choice` (default `auto`); other kinds (allowed tools, built-in tools) are a 400. */
export function parseToolChoice(value: unknown): ToolChoice {
  if (value === undefined || value === null) return "auto";
  if (typeof value === "object" && typeOf(value) !== "function") {
    throw unsupported("tool_choice.type", `tool_choice of type ${JSON.stringify(typeOf(value))}`);
  }
  return parsedAt(toolChoiceSchema, value, "tool_choice");
}

/** `text.format` of each type: plain text, any JSON object, JSON following a schema (flat). */
const textFormats = {
  text: z.object({ type: z.literal("text") }),
  json_object: z.object({ type: z.literal("json_object") }),
  json_schema: z.object({
    type: z.literal("json_schema"),
    name: z.string(),
    schema: z.record(z.string(), z.unknown()),
    description: z.string().nullish(),
    strict: z.boolean().nullish(),
  }),
};

/** A validated `text.format`. */
export type TextFormat = z.infer<(typeof textFormats)[keyof typeof textFormats]>;

/** `text.format` (default `{type: "text"}`). */
export function parseTextFormat(value: unknown): TextFormat {
  if (value === undefined || value === null) return { type: "text" };
  const type = typeOf(value);
  if (type !== "text" && type !== "json_object" && type !== "json_schema") {
    throw invalidParam(
      "text.format.type",
      `Invalid value for 'text.format.type': expected "text", "json_object" or "json_schema"`,
    );
  }
  return parsedAt<TextFormat>(textFormats[type], value, "text.format");
}
