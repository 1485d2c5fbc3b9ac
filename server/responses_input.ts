/**
 * A validated `/v1/responses` request -> the chat completion request the server already serves
 * (server/prepare.ts `prepareChat`), as vLLM builds its chat messages from a Responses request:
 *
 * - `instructions` is a system message first; a string `input` is one user message;
 * - input items: messages keep their role (text parts joined); a `reasoning` item's text becomes
 *   the next assistant message's `reasoning_content`; `function_call` items become that
 *   assistant message's `tool_calls` (consecutive calls share one message);
 *   `function_call_output` items become `tool` messages (`tool_call_id` = the call's `call_id`);
 *   a last assistant message passed back `in_progress` or `incomplete` is continued (vLLM's
 *   `continue_final_message`);
 * - function tools (flat) become chat tools (nested `function`), `tool_choice` likewise;
 * - `max_output_tokens` -> `max_completion_tokens`, `text.format` -> `response_format`,
 *   `include: ["message.output_text.logprobs"]` with `top_logprobs` -> `logprobs` and
 *   `top_logprobs`, `reasoning.effort` -> the chat template's `reasoning_effort` (vLLM's).
 *
 * What cannot be honoured is a 400 naming it: `previous_response_id` (no response is stored),
 * `reasoning.effort` when the chat template has no `reasoning_effort`, a `reasoning.summary` of
 * `concise` or `detailed`, a `text.verbosity` other than `medium`. Errors of the chat path name
 * the chat fields; {@linkcode renamedError} renames them to the Responses fields.
 *
 * @module
 */

import { requireTokenizer, type ServerContext } from "./context.ts";
import { toApiError } from "./errors.ts";
import { ApiError, type ChatRequest } from "./protocol.ts";
import {
  type FunctionTool,
  type InputItem,
  invalidParam,
  parseFunctionTool,
  parseInputItem,
  parseTextFormat,
  parseToolChoice,
  passThroughFields,
  type ResponsesRequest,
  type TextFormat,
  type ToolChoice,
} from "./responses_protocol.ts";

/** What a Responses request asks, as the chat path serves it. */
export interface ResponsesPlan {
  /** The equivalent chat completion request. */
  readonly chat: ChatRequest;
  /** The function tools, validated (echoed in the response). */
  readonly tools: readonly FunctionTool[];
  /** `tool_choice` (echoed). */
  readonly toolChoice: ToolChoice;
  /** `text.format` (echoed). */
  readonly textFormat: TextFormat;
  /** `include` asks for the output text's logprobs. */
  readonly logprobs: boolean;
}

type Message = ChatRequest["messages"][number];

/** The chat messages of `instructions` and `input` (see the module documentation). */
function chatMessages(body: ResponsesRequest): { messages: Message[]; continued: boolean } {
  const messages: Message[] = [];
  if (body.instructions !== null && body.instructions !== undefined && body.instructions !== "") {
    messages.push({ role: "system", content: body.instructions });
  }
  if (typeof body.input === "string") {
    messages.push({ role: "user", content: body.input });
    return { messages, continued: false };
  }
  const items = body.input.map((raw, i) => parseInputItem(raw, i));
  for (const item of items) addItem(messages, item);
  const last = items[items.length - 1]!;
  const continued = last.type === "message" && last.role === "assistant" &&
    (last.status === "in_progress" || last.status === "incomplete");
  return { messages, continued };
}

/** Appends `item` to `messages`, merging an assistant turn's pieces into one message. */
function addItem(messages: Message[], item: InputItem): void {
  const last = messages[messages.length - 1];
  const assistant = last?.role === "assistant" ? last : undefined;
  switch (item.type) {
    case "message": {
      // The text of a turn that so far only reasoned.
      if (
        item.role === "assistant" && assistant !== undefined && assistant.content === "" &&
        assistant.tool_calls === undefined
      ) {
        assistant.content = item.text;
      } else {
        messages.push({ role: item.role, content: item.text });
      }
      return;
    }
    case "reasoning":
      messages.push({ role: "assistant", content: "", reasoning_content: item.text });
      return;
    case "function_call": {
      const call = {
        id: item.call_id,
        type: "function",
        function: { name: item.name, arguments: item.arguments },
      };
      if (assistant !== undefined && Array.isArray(assistant.tool_calls)) {
        assistant.tool_calls.push(call);
      } else if (assistant !== undefined) {
        assistant.tool_calls = [call];
      } else {
        messages.push({ role: "assistant", content: "", tool_calls: [call] });
      }
      return;
    }
    case "function_call_output":
      messages.push({ role: "tool", content: item.output, tool_call_id: item.call_id });
      return;
  }
}

/** The chat template's extra variables: the request's, with vLLM's `reasoning_effort`. */
function templateKwargs(
  ctx: ServerContext,
  body: ResponsesRequest,
): Record<string, unknown> | undefined {
  const kwargs = body.chat_template_kwargs ?? undefined;
  const effort = body.reasoning?.effort;
  if (effort === null || effort === undefined) return kwargs;
  const source = requireTokenizer(ctx.engine, "input").chatTemplateSource ?? "";
  if (!/\breasoning_effort\b/.test(source)) {
    throw invalidParam(
      "reasoning.effort",
      "reasoning.effort is not supported: the model's chat template takes no reasoning_effort",
      "unsupported_parameter",
    );
  }
  return { reasoning_effort: effort, ...kwargs };
}

/** 400s for what the chat path cannot honour (see the module documentation). */
function rejectUnsupported(body: ResponsesRequest): void {
  if (body.previous_response_id !== null && body.previous_response_id !== undefined) {
    throw invalidParam(
      "previous_response_id",
      `Previous response with id '${body.previous_response_id}' not found: this server stores ` +
        "no responses (send the conversation as input items)",
      "previous_response_not_found",
    );
  }
  for (const key of ["summary", "generate_summary"] as const) {
    const summary = body.reasoning?.[key];
    if (summary === "concise" || summary === "detailed") {
      throw invalidParam(
        `reasoning.${key}`,
        `reasoning.${key} '${summary}' is not supported: reasoning is returned whole ` +
          "(reasoning_text content), never summarized",
        "unsupported_parameter",
      );
    }
  }
  const verbosity = body.text?.verbosity;
  if (verbosity !== null && verbosity !== undefined && verbosity !== "medium") {
    throw invalidParam(
      "text.verbosity",
      `text.verbosity '${verbosity}' is not supported (only 'medium')`,
      "unsupported_parameter",
    );
  }
  const top = body.top_logprobs;
  if (top !== null && top !== undefined && (top < 0 || top > 20)) {
    throw invalidParam("top_logprobs", `top_logprobs must be 0 to 20, got ${top}`);
  }
}

/** The chat path's `response_format` of `text.format` (null for plain text). */
function responseFormat(format: TextFormat): ChatRequest["response_format"] {
  if (format.type !== "json_schema") return format.type === "text" ? null : format;
  return {
    type: "json_schema",
    json_schema: {
      name: format.name,
      schema: format.schema,
      description: format.description,
      strict: format.strict,
    },
  };
}

/** The chat request that serves `body` (see the module documentation). */
export function responsesPlan(ctx: ServerContext, body: ResponsesRequest): ResponsesPlan {
  rejectUnsupported(body);
  const { messages, continued } = chatMessages(body);
  const tools = (body.tools ?? []).map((t, i) => parseFunctionTool(t, i));
  const toolChoice = parseToolChoice(body.tool_choice);
  const textFormat = parseTextFormat(body.text?.format);
  const logprobs = body.include?.includes("message.output_text.logprobs") ?? false;
  // Without tools, `auto` and `none` are what the chat path does anyway (it refuses them).
  const chatToolChoice = tools.length === 0 && (toolChoice === "auto" || toolChoice === "none")
    ? undefined
    : typeof toolChoice === "string"
    ? toolChoice
    : { type: "function", function: { name: toolChoice.name } };
  const kwargs = templateKwargs(ctx, body);
  const chat: ChatRequest = {
    ...passThroughFields(body),
    model: body.model,
    messages,
    stream: body.stream,
    temperature: body.temperature,
    top_p: body.top_p,
    max_completion_tokens: body.max_output_tokens,
    user: body.user,
    tools: tools.length === 0
      ? undefined
      : tools.map(({ type, ...fn }) => ({ type, function: fn })),
    tool_choice: chatToolChoice,
    parallel_tool_calls: body.parallel_tool_calls,
    response_format: responseFormat(textFormat),
    logprobs,
    top_logprobs: logprobs ? body.top_logprobs ?? 0 : undefined,
    ...(kwargs === undefined ? {} : { chat_template_kwargs: kwargs }),
    ...(continued ? { add_generation_prompt: false, continue_final_message: true } : {}),
  };
  return { chat, tools, toolChoice, textFormat, logprobs };
}

/** Chat-path parameter names -> the Responses API's (first match wins). */
const RENAMES: readonly [RegExp, string][] = [
  [/^(max_completion_tokens|max_tokens)$/, "max_output_tokens"],
  [/^messages(?=\.|$)/, "input"],
  [/^response_format\.json_schema(?=\.|$)/, "text.format"],
  [/^response_format(?=\.|$)/, "text.format"],
  [/^tools\.(\d+)\.function(?=\.|$)/, "tools.$1"],
  [/^tool_choice\.function(?=\.|$)/, "tool_choice"],
];

/** A chat-path parameter name as a Responses request spells it. */
export function responsesParam(param: string): string {
  for (const [pattern, replacement] of RENAMES) {
    if (pattern.test(param)) return param.replace(pattern, replacement);
  }
  return param;
}

/**
 * `e` (thrown while preparing or admitting the chat request) with its parameter renamed to the
 * Responses field (in `param` and where the message quotes it); `e` itself when it is not an
 * API error.
 */
export function renamedError(e: unknown, retryAfter: number): unknown {
  const err = toApiError(e, retryAfter);
  if (err === null || err.param === null) return e;
  const param = responsesParam(err.param);
  if (param === err.param) return err;
  return new ApiError(err.status, err.message.replaceAll(`'${err.param}'`, `'${param}'`), {
    type: err.type,
    param,
    code: err.code,
    headers: { ...err.headers },
  });
}
