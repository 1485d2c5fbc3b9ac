/**
 * The Responses API's objects, built from what the chat path produced: the `response` object
 * ({@linkcode responseObject}, OpenAI's fields, echoing the request's settings), its output
 * items (`reasoning`, `message` with one `output_text` part, `function_call`; the shapes vLLM
 * and OpenAI answer) and its `usage`. A finished answer becomes items through the chat path's own
 * parsers ({@linkcode outputItems}, server/chat_answer.ts); a streamed one is assembled by
 * server/responses_stream.ts with the same item builders.
 *
 * @module
 */

import type { EngineClient } from "../engine/engine_api.ts";
import { type ChatAnswer, chatAnswer } from "./chat_answer.ts";
import type { ChoiceRun } from "./choice_run.ts";
import { chatLogprobs, type ChatTokenLogprob } from "./logprobs.ts";
import type { Prepared } from "./prepare.ts";
import type { ResponsesPlan } from "./responses_input.ts";
import type { ResponsesRequest } from "./responses_protocol.ts";
import type { ToolCall } from "./tools.ts";

/** An id with OpenAI's prefix (`resp`, `msg`, `rs`, `fc`) and 32 random hex digits. */
export function responsesId(prefix: "resp" | "msg" | "rs" | "fc"): string {
  return `${prefix}_${crypto.randomUUID().replaceAll("-", "")}`;
}

/** One token's logprob on an `output_text` part (the chat shape: token, logprob, bytes, top). */
export type OutputLogprob = ChatTokenLogprob & { top_logprobs: ChatTokenLogprob[] };

/** An output item's status. */
export type ItemStatus = "in_progress" | "completed" | "incomplete";

/** A `message` output item with its one `output_text` part. */
export function messageItem(
  id: string,
  text: string,
  status: ItemStatus,
  logprobs: readonly OutputLogprob[] = [],
): Record<string, unknown> {
  return {
    type: "message",
    id,
    role: "assistant",
    status,
    content: [outputTextPart(text, logprobs)],
  };
}

/** An `output_text` content part. */
export function outputTextPart(
  text: string,
  logprobs: readonly OutputLogprob[] = [],
): Record<string, unknown> {
  return { type: "output_text", text, annotations: [], logprobs };
}

/** A `reasoning` output item: the whole reasoning as `reasoning_text` content, no summary. */
export function reasoningItem(
  id: string,
  text: string,
  status: ItemStatus,
): Record<string, unknown> {
  return {
    type: "reasoning",
    id,
    summary: [],
    content: [{ type: "reasoning_text", text }],
    status,
  };
}

/** A `function_call` output item (`call_id` is the chat path's tool call id). */
export function functionCallItem(
  id: string,
  call: Pick<ToolCall, "id"> & { readonly function: { name: string; arguments: string } },
  status: ItemStatus,
): Record<string, unknown> {
  return {
    type: "function_call",
    id,
    call_id: call.id,
    name: call.function.name,
    arguments: call.function.arguments,
    status,
  };
}

/** `completed`, or `incomplete` when the answer ran out of tokens. */
export function responseStatus(run: ChoiceRun): "completed" | "incomplete" {
  return run.finishReason === "length" ? "incomplete" : "completed";
}

/** The output text's logprobs of `run` (all its tokens, as vLLM reports them), if asked. */
export function runLogprobs(
  engine: EngineClient,
  prep: Prepared,
  plan: ResponsesPlan,
  run: ChoiceRun,
): OutputLogprob[] {
  return plan.logprobs ? chatLogprobs(engine, run.tokenLogprobs, prep.tokensAsIds).content : [];
}

/**
 * The output items of a finished `run` (`answer`: its text parsed): its reasoning (when the reasoning parser found some),
 * its content (when not empty) and its tool calls, in that order; the last one `incomplete`
 * when the answer ran out of tokens.
 */
export function outputItems(
  engine: EngineClient,
  prep: Prepared,
  plan: ResponsesPlan,
  run: ChoiceRun,
  answer: ChatAnswer = chatAnswer(prep, run.text),
): Record<string, unknown>[] {
  const pieces: ((status: ItemStatus) => Record<string, unknown>)[] = [];
  const reasoning = answer.reasoning;
  if (reasoning !== null && reasoning !== undefined && reasoning !== "") {
    pieces.push((s) => reasoningItem(responsesId("rs"), reasoning, s));
  }
  const content = answer.content;
  if (content !== null && content !== "") {
    const logprobs = runLogprobs(engine, prep, plan, run);
    pieces.push((s) => messageItem(responsesId("msg"), content, s, logprobs));
  }
  for (const call of answer.toolCalls) {
    pieces.push((s) => functionCallItem(responsesId("fc"), call, s));
  }
  const last = responseStatus(run) === "incomplete" ? pieces.length - 1 : -1;
  return pieces.map((piece, i) => piece(i === last ? "incomplete" : "completed"));
}

/** The `usage` of a response. */
export interface ResponseUsage {
  input_tokens: number;
  input_tokens_details: { cached_tokens: number };
  output_tokens: number;
  output_tokens_details: { reasoning_tokens: number };
  total_tokens: number;
}

/**
 * How many of `run`'s tokens are reasoning: those between the `<think>` and `</think>` tokens
 * (to the end without the closing one), as vLLM counts them, when each tag is one token; else
 * the tokens of the reasoning text re-encoded. 0 without a reasoning parser.
 */
function reasoningTokens(
  engine: EngineClient,
  prep: Prepared,
  run: ChoiceRun,
  reasoning: string | null | undefined,
): number {
  const tok = engine.tokenizer;
  if (!prep.reasoning || tok === null || reasoning === null || reasoning === undefined) return 0;
  const open = tok.encode("<think>", { addSpecialTokens: false });
  const close = tok.encode("</think>", { addSpecialTokens: false });
  if (open.length !== 1 || close.length !== 1) {
    return reasoning === "" ? 0 : tok.encode(reasoning, { addSpecialTokens: false }).length;
  }
  const start = run.tokenIds.indexOf(open[0]!);
  if (start < 0) return 0;
  const end = run.tokenIds.indexOf(close[0]!, start + 1);
  return (end < 0 ? run.tokenIds.length : end) - start - 1;
}

/** The `usage` of `run`'s response; `reasoning` is the reasoning text reported (if any). */
export function responseUsage(
  engine: EngineClient,
  prep: Prepared,
  run: ChoiceRun,
  reasoning: string | null | undefined,
): ResponseUsage {
  const input = prep.prompts[0]!.length;
  return {
    input_tokens: input,
    input_tokens_details: { cached_tokens: run.cachedTokens },
    output_tokens: run.outputTokens,
    output_tokens_details: { reasoning_tokens: reasoningTokens(engine, prep, run, reasoning) },
    total_tokens: input + run.outputTokens,
  };
}

/** What every `response` object of one request repeats. */
export interface ResponseHead {
  readonly id: string;
  /** Unix seconds. */
  readonly createdAt: number;
  readonly model: string;
  readonly body: ResponsesRequest;
  readonly plan: ResponsesPlan;
  /** The sampling temperature and top_p used (the request's, else the model's defaults). */
  readonly temperature: number;
  readonly topP: number;
}

/** The {@linkcode ResponseHead} of `prep` (the prepared chat request) for `body`. */
export function responseHead(
  prep: Prepared,
  body: ResponsesRequest,
  plan: ResponsesPlan,
): ResponseHead {
  const params = prep.params[0]!;
  return {
    id: prep.id,
    createdAt: prep.created,
    model: prep.model,
    body,
    plan,
    temperature: params.temperature,
    topP: params.topP,
  };
}

/** The state a `response` object reports. */
export interface ResponseState {
  readonly status: "in_progress" | "completed" | "incomplete";
  readonly output: readonly Record<string, unknown>[];
  readonly usage: ResponseUsage | null;
}

/**
 * A `response` object: OpenAI's fields, the request's settings echoed (`instructions`,
 * `max_output_tokens`, `tools`, `tool_choice`, `text`, ...), `store: false` (nothing is
 * stored), and `incomplete_details.reason` `max_output_tokens` when incomplete.
 */
export function responseObject(head: ResponseHead, state: ResponseState): Record<string, unknown> {
  const { body, plan } = head;
  return {
    id: head.id,
    object: "response",
    created_at: head.createdAt,
    status: state.status,
    background: false,
    error: null,
    incomplete_details: state.status === "incomplete" ? { reason: "max_output_tokens" } : null,
    instructions: body.instructions ?? null,
    max_output_tokens: body.max_output_tokens ?? null,
    max_tool_calls: body.max_tool_calls ?? null,
    metadata: body.metadata ?? {},
    model: head.model,
    output: state.output,
    parallel_tool_calls: body.parallel_tool_calls ?? true,
    previous_response_id: null,
    reasoning: {
      effort: body.reasoning?.effort ?? null,
      summary: body.reasoning?.summary ?? body.reasoning?.generate_summary ?? null,
    },
    store: false,
    temperature: head.temperature,
    text: { format: plan.textFormat, verbosity: body.text?.verbosity ?? "medium" },
    tool_choice: plan.toolChoice,
    tools: plan.tools.map((t) => ({
      type: "function",
      name: t.name,
      description: t.description ?? null,
      parameters: t.parameters ?? null,
      strict: t.strict ?? null,
    })),
    top_logprobs: body.top_logprobs ?? 0,
    top_p: head.topP,
    truncation: "disabled",
    usage: state.usage,
    user: body.user ?? null,
  };
}
