/**
 * Tool calling, in the Hermes / Qwen format the Qwen chat templates teach their models:
 * `tools` reach the chat template (its `tools` variable), and an answer's
 * `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks become OpenAI
 * `tool_calls` (arguments as a JSON string) with `finish_reason: "tool_calls"`, the text before
 * the first block being the content (null when empty).
 *
 * `tool_choice`: `none` (tools are not shown to the model, nothing is parsed), `auto` (the
 * default with tools: free text, calls parsed if the model writes them), `required` (a grammar
 * forces one call, or several separated by newlines unless `parallel_tool_calls` is false) and
 * a named function (a grammar forces exactly one call of it, with arguments following its
 * parameters schema). Assistant messages' `tool_calls` in the history have their arguments
 * parsed back into objects for the template, as vLLM does. Streamed, each call is sent as
 * OpenAI's deltas ({@linkcode ToolCallStream}).
 *
 * @module
 */

import { z } from "zod";
import type { StructuredOutputSpec } from "../scheduler/sampling_params.ts";
import { ApiError, type ChatRequest } from "./protocol.ts";

/** One `tools` entry. */
const toolSchema = z.object({
  type: z.literal("function"),
  function: z.object({
    name: z.string().min(1).max(64),
    description: z.string().nullish(),
    parameters: z.union([z.record(z.string(), z.unknown()), z.boolean()]).nullish(),
    strict: z.boolean().nullish(),
  }),
});

/** `tool_choice`. */
const toolChoiceSchema = z.union([
  z.enum(["none", "auto", "required"]),
  z.object({ type: z.literal("function"), function: z.object({ name: z.string() }) }),
]);

/** One parsed call, OpenAI's shape. */
export interface ToolCall {
  readonly id: string;
  readonly type: "function";
  readonly function: { readonly name: string; readonly arguments: string };
}

/** What a chat request does with tools. */
export interface ToolPlan {
  /** The tools for the chat template (OpenAI's shape), or null: none shown. */
  readonly templateTools: unknown[] | null;
  /** The grammar of `required` / a named function, or null. */
  readonly spec: StructuredOutputSpec | null;
  /** Whether answers are parsed for calls. */
  readonly parse: boolean;
}

function invalid(param: string, message: string): ApiError {
  return new ApiError(400, message, { param, code: "invalid_value" });
}

function parsed<T>(schema: z.ZodType<T>, value: unknown, param: string): T {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const path = [param, ...issue.path.map(String)].join(".");
  throw invalid(path, `Invalid value for '${path}': ${issue.message}`);
}

/** The tool plan of a chat request (see the module documentation). */
export function toolPlanFor(body: ChatRequest): ToolPlan {
  const tools = body.tools === null || body.tools === undefined
    ? []
    : parsed(z.array(toolSchema), body.tools, "tools");
  const choice = body.tool_choice === undefined || body.tool_choice === null
    ? (tools.length > 0 ? "auto" : "none")
    : parsed(toolChoiceSchema, body.tool_choice, "tool_choice");
  if (choice === "none") return { templateTools: null, spec: null, parse: false };
  if (tools.length === 0) {
    throw invalid("tool_choice", `tool_choice ${JSON.stringify(choice)} needs tools`);
  }
  const all = tools.map((t) => ({
    name: t.function.name,
    parameters: t.function.parameters ?? {},
  }));
  let spec: StructuredOutputSpec | null = null;
  if (choice === "required") {
    spec = { kind: "tool_calls", tools: all, parallel: body.parallel_tool_calls ?? true };
  } else if (typeof choice === "object") {
    const named = all.filter((t) => t.name === choice.function.name);
    if (named.length === 0) {
      throw invalid(
        "tool_choice.function.name",
        `tool_choice names ${JSON.stringify(choice.function.name)}, which is not in tools`,
      );
    }
    spec = { kind: "tool_calls", tools: named, parallel: false };
  }
  return { templateTools: tools, spec, parse: true };
}

/** Assistant `tool_calls` arguments (JSON strings) parsed into objects for the chat template. */
export function templateMessage<M extends Record<string, unknown>>(message: M): M {
  const calls = message.tool_calls;
  if (!Array.isArray(calls)) return message;
  return {
    ...message,
    tool_calls: calls.map((c) => {
      const fn = (c as { function?: { arguments?: unknown } }).function;
      if (typeof fn?.arguments !== "string") return c;
      try {
        return { ...c, function: { ...fn, arguments: JSON.parse(fn.arguments) } };
      } catch {
        return c;
      }
    }),
  };
}

const CALL = /<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g;

/**
 * The tool calls an answer writes, and its content: the text before the first call (null
 * when empty). An answer whose blocks do not all hold `{"name": string, "arguments": ...}` is
 * all content and has no calls.
 */
export function parseToolCalls(text: string): { content: string | null; calls: ToolCall[] } {
  const calls: ToolCall[] = [];
  const first = text.indexOf("<tool_call>");
  if (first < 0) return { content: text, calls };
  for (const m of text.matchAll(CALL)) {
    try {
      const call = JSON.parse(m[1]!);
      if (typeof call?.name !== "string") return { content: text, calls: [] };
      const args = call.arguments ?? call.parameters ?? {};
      calls.push({
        id: `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`,
        type: "function",
        function: {
          name: call.name,
          arguments: typeof args === "string" ? args : JSON.stringify(args),
        },
      });
    } catch {
      return { content: text, calls: [] };
    }
  }
  if (calls.length === 0) return { content: text, calls };
  const before = text.slice(0, first).trim();
  return { content: before === "" ? null : before, calls };
}

/** One streamed tool-call delta entry (OpenAI's shape). */
export interface ToolCallDelta {
  readonly index: number;
  readonly id?: string;
  readonly type?: "function";
  readonly function: { readonly name?: string; readonly arguments: string };
}

const OPEN_CALL = "<tool_call>";
const CLOSE_CALL = "</tool_call>";

/** The longest suffix of `text` that is a proper prefix of `tag`. */
function heldTag(text: string, tag: string): number {
  for (let n = Math.min(tag.length - 1, text.length); n > 0; n--) {
    if (text.endsWith(tag.slice(0, n))) return n;
  }
  return 0;
}

/**
 * The streaming side of {@linkcode parseToolCalls}: content passes through as it comes (a
 * possible start of `<tool_call>` held back); each complete call becomes two deltas, the first
 * with `index`, `id`, `type` and `function.name` (arguments ""), the second with the whole
 * arguments string. A block that does not parse, or is cut short, is sent as content.
 */
export class ToolCallStream {
  #buffer = "";
  #inCall = false;
  /** Calls sent so far. */
  calls = 0;

  /** The content and tool-call deltas `text` (the next piece of content) makes certain. */
  push(text: string): { content: string; toolCalls: ToolCallDelta[] } {
    let content = "";
    const toolCalls: ToolCallDelta[] = [];
    let rest = this.#buffer + text;
    this.#buffer = "";
    for (;;) {
      if (!this.#inCall) {
        const at = rest.indexOf(OPEN_CALL);
        if (at < 0) {
          const keep = heldTag(rest, OPEN_CALL);
          const body = rest.slice(0, rest.length - keep);
          // After a call, whitespace is held until it is known not to separate two calls.
          if (this.calls > 0 && body.trim() === "") {
            this.#buffer = rest;
            break;
          }
          content += body;
          this.#buffer = rest.slice(rest.length - keep);
          break;
        }
        // Whitespace between calls is not content.
        const before = rest.slice(0, at);
        content += this.calls > 0 && before.trim() === "" ? "" : before;
        this.#inCall = true;
        rest = rest.slice(at);
        continue;
      }
      const end = rest.indexOf(CLOSE_CALL);
      if (end < 0) {
        this.#buffer = rest;
        break;
      }
      const block = rest.slice(0, end + CLOSE_CALL.length);
      rest = rest.slice(end + CLOSE_CALL.length);
      this.#inCall = false;
      const parsed = parseToolCalls(block);
      if (parsed.calls.length !== 1) {
        content += block;
        continue;
      }
      const call = parsed.calls[0]!;
      const index = this.calls++;
      toolCalls.push(
        {
          index,
          id: call.id,
          type: "function",
          function: { name: call.function.name, arguments: "" },
        },
        { index, function: { arguments: call.function.arguments } },
      );
    }
    return { content, toolCalls };
  }

  /** What is still held back once the answer is complete (as content). */
  finish(): string {
    const held = this.#buffer;
    this.#buffer = "";
    const inCall = this.#inCall;
    this.#inCall = false;
    return !inCall && this.calls > 0 && held.trim() === "" ? "" : held;
  }
}
