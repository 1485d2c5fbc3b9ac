/**
 * A finished chat answer split into what the response reports: the reasoning (with a reasoning
 * parser, server/reasoning.ts), the tool calls (with tools, server/tools.ts) and the content
 * left over. `/v1/chat/completions` (server/generate.ts) writes it as a chat message and
 * `/v1/responses` (server/responses_output.ts) as output items, so both parse an answer alike.
 *
 * @module
 */

import type { Prepared } from "./prepare.ts";
import { splitReasoning } from "./reasoning.ts";
import { parseToolCalls, type ToolCall } from "./tools.ts";

/** What a chat answer says, parsed. */
export interface ChatAnswer {
  /**
   * The reasoning (`reasoning_content`): null when the answer has none; undefined without a
   * reasoning parser (the message has no such field).
   */
  readonly reasoning: string | null | undefined;
  /** The content: the text that is neither reasoning nor a tool call (null: none). */
  readonly content: string | null;
  /** The tool calls the answer makes (empty: none, or the request has no tools). */
  readonly toolCalls: readonly ToolCall[];
}

/**
 * Parses the whole `text` of one of `prep`'s choices: its reasoning split off first (with a
 * reasoning parser), then its tool calls out of the rest (with tools).
 */
export function chatAnswer(prep: Prepared, text: string): ChatAnswer {
  const split = prep.reasoning ? splitReasoning(text) : null;
  const content = split === null ? text : split.content;
  const tools = prep.toolCalls && content !== null ? parseToolCalls(content) : null;
  const called = tools !== null && tools.calls.length > 0;
  return {
    reasoning: split === null ? undefined : split.reasoning,
    content: called ? tools.content : content,
    toolCalls: called ? tools.calls : [],
  };
}
