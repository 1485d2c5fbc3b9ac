/**
 * A streamed `/v1/responses` answer: Server-Sent Events named by their type
 * (`event: <type>\ndata: {...}\n\n`, each with an increasing `sequence_number`, no `[DONE]`), in
 * OpenAI's order:
 *
 * `response.created`, `response.in_progress`, then per output item `response.output_item.added`,
 * its content (`response.content_part.added`, `response.output_text.delta`... /
 * `response.reasoning_text.delta`..., `.done`, `response.content_part.done`; a function call's
 * `response.function_call_arguments.delta` and `.done`), `response.output_item.done`; and last
 * `response.completed` with the whole response (`response.incomplete` when it ran out of
 * tokens, as OpenAI sends it; vLLM sends `response.completed` either way).
 *
 * The text comes from the chat path's stream parsers (server/sse.ts `chatDelta`: reasoning split
 * off, then tool calls), so an item starts when the answer turns from reasoning to content to a
 * call. Whitespace before any content is held until text follows, and dropped when a call
 * follows (as vLLM drops it). An error after the stream started is an `error` event
 * (`{type: "error", code, message, param}`); cancelling the stream (client disconnect) aborts
 * the engine request.
 *
 * @module
 */

import type { RequestOutput } from "../engine/engine_api.ts";
import type { ChoiceRun } from "./choice_run.ts";
import type { ServerContext } from "./context.ts";
import { internalError, toApiError } from "./errors.ts";
import { chatLogprobs } from "./logprobs.ts";
import type { Prepared } from "./prepare.ts";
import { ReasoningStream } from "./reasoning.ts";
import {
  functionCallItem,
  type ItemStatus,
  messageItem,
  type OutputLogprob,
  outputTextPart,
  reasoningItem,
  type ResponseHead,
  responseObject,
  responsesId,
  responseStatus,
  responseUsage,
} from "./responses_output.ts";
import { chatDelta, eventStream, EventWriter } from "./sse.ts";
import { type ToolCallDelta, ToolCallStream } from "./tools.ts";

const encoder = new TextEncoder();

/**
 * The streaming response of `prep` (its one primed `run`). `done` is called once the stream has
 * ended (finished, failed or cancelled) and the run is recorded in the metrics; `ac` is aborted
 * when the stream is cancelled or fails.
 */
export function streamResponse(
  ctx: ServerContext,
  prep: Prepared,
  head: ResponseHead,
  run: ChoiceRun,
  ac: AbortController,
  done: () => void,
): Response {
  const events = new ResponseEvents(ctx, prep, head, run);
  return eventStream(ctx, [run], ac, done, events, async () => {
    events.open();
    await events.pump();
    events.end(ac);
  });
}

/** The output item being streamed. */
type OpenItem =
  | { kind: "reasoning"; id: string; text: string }
  | { kind: "message"; id: string; text: string; logprobs: OutputLogprob[] }
  | { kind: "call"; id: string; callId: string; name: string; args: string };

/** The events of one streamed response, written to its stream's controller. */
class ResponseEvents extends EventWriter {
  readonly #ctx: ServerContext;
  readonly #prep: Prepared;
  readonly #head: ResponseHead;
  readonly #run: ChoiceRun;
  #sequence = 0;
  /** The finished output items, in order. */
  readonly #output: Record<string, unknown>[] = [];
  #open: OpenItem | null = null;
  /** Whitespace content not yet sent (no item is open for it yet). */
  #heldSpace = "";
  /** Logprobs of the tokens since the last text delta (when asked for). */
  #pendingLogprobs: OutputLogprob[] = [];
  /** The whole reasoning streamed (for `usage`); null: none. */
  #reasoning: string | null = null;

  constructor(ctx: ServerContext, prep: Prepared, head: ResponseHead, run: ChoiceRun) {
    super();
    this.#ctx = ctx;
    this.#prep = prep;
    this.#head = head;
    this.#run = run;
  }

  /** Sends one event of `type` (nothing once closed; a refused event closes the stream). */
  #send(type: string, fields: Record<string, unknown>): void {
    if (this.closed) return;
    const data = { type, sequence_number: this.#sequence++, ...fields };
    this.write(encoder.encode(`event: ${type}\ndata: ${JSON.stringify(data)}\n\n`));
  }

  /** `response.created` and `response.in_progress`. */
  open(): void {
    const response = responseObject(this.#head, { status: "in_progress", output: [], usage: null });
    this.#send("response.created", { response });
    this.#send("response.in_progress", { response });
  }

  /** Streams the run's increments as events until it ends or the stream closes. */
  async pump(): Promise<void> {
    const prep = this.#prep;
    const reasoning = prep.reasoning ? new ReasoningStream() : null;
    const tools = prep.toolCalls ? new ToolCallStream() : null;
    for (;;) {
      const out = await this.#run.next();
      if (out === null || this.closed) break;
      this.#collectLogprobs(out);
      const delta = chatDelta(reasoning, tools, out.text, out.finishReason !== null);
      if (delta.reasoning_content !== undefined) this.#reasoningDelta(delta.reasoning_content);
      if (delta.content !== undefined) this.#textDelta(delta.content);
      for (const call of delta.tool_calls ?? []) this.#callDelta(call);
    }
  }

  #collectLogprobs(out: RequestOutput): void {
    if (!this.#head.plan.logprobs || out.logprobs === null) return;
    const lps = chatLogprobs(this.#ctx.engine, out.logprobs, this.#prep.tokensAsIds).content;
    this.#pendingLogprobs.push(...lps);
  }

  #reasoningDelta(text: string): void {
    if (this.#open?.kind !== "reasoning") {
      this.#closeItem("completed");
      const id = responsesId("rs");
      this.#open = { kind: "reasoning", id, text: "" };
      this.#addItem({ type: "reasoning", id, summary: [], content: [], status: "in_progress" });
      this.#send("response.content_part.added", {
        ...this.#at(id),
        part: { type: "reasoning_text", text: "" },
      });
    }
    this.#open.text += text;
    this.#reasoning = (this.#reasoning ?? "") + text;
    this.#send("response.reasoning_text.delta", { ...this.#at(this.#open.id), delta: text });
  }

  #textDelta(text: string): void {
    if (this.#open?.kind !== "message") {
      if (text.trim() === "") {
        this.#heldSpace += text;
        return;
      }
      text = this.#heldSpace + text;
      this.#heldSpace = "";
    }
    this.#sendText(text);
  }

  /** Sends `text` as an `output_text` delta of the open message (opened first if need be). */
  #sendText(text: string): void {
    let open = this.#open;
    if (open?.kind !== "message") {
      this.#closeItem("completed");
      const id = responsesId("msg");
      open = this.#open = { kind: "message", id, text: "", logprobs: [] };
      this.#addItem({ type: "message", id, role: "assistant", status: "in_progress", content: [] });
      this.#send("response.content_part.added", { ...this.#at(id), part: outputTextPart("") });
    }
    const logprobs = this.#pendingLogprobs;
    this.#pendingLogprobs = [];
    open.text += text;
    open.logprobs.push(...logprobs);
    this.#send("response.output_text.delta", { ...this.#at(open.id), delta: text, logprobs });
  }

  #callDelta(delta: ToolCallDelta): void {
    if (delta.id !== undefined) {
      // A new call: whitespace before it is not content.
      this.#heldSpace = "";
      this.#closeItem("completed");
      const id = responsesId("fc");
      const name = delta.function.name ?? "";
      this.#open = { kind: "call", id, callId: delta.id, name, args: "" };
      const call = { id: delta.id, function: { name, arguments: "" } };
      this.#addItem(functionCallItem(id, call, "in_progress"));
    }
    const open = this.#open;
    if (open?.kind !== "call" || delta.function.arguments === "") return;
    open.args += delta.function.arguments;
    this.#send("response.function_call_arguments.delta", {
      item_id: open.id,
      output_index: this.#output.length,
      delta: delta.function.arguments,
    });
  }

  /** `item_id`, `output_index` and `content_index` of the open item's one content part. */
  #at(id: string): { item_id: string; output_index: number; content_index: number } {
    return { item_id: id, output_index: this.#output.length, content_index: 0 };
  }

  #addItem(item: Record<string, unknown>): void {
    this.#send("response.output_item.added", { output_index: this.#output.length, item });
  }

  /** Sends the open item's closing events and adds it to the output (nothing when none). */
  #closeItem(status: ItemStatus): void {
    const open = this.#open;
    if (open === null) return;
    this.#open = null;
    const at = this.#at(open.id);
    let item: Record<string, unknown>;
    if (open.kind === "reasoning") {
      const part = { type: "reasoning_text", text: open.text };
      this.#send("response.reasoning_text.done", { ...at, text: open.text });
      this.#send("response.content_part.done", { ...at, part });
      item = reasoningItem(open.id, open.text, status);
    } else if (open.kind === "message") {
      this.#send("response.output_text.done", { ...at, text: open.text, logprobs: open.logprobs });
      this.#send("response.content_part.done", {
        ...at,
        part: outputTextPart(open.text, open.logprobs),
      });
      item = messageItem(open.id, open.text, status, open.logprobs);
    } else {
      this.#send("response.function_call_arguments.done", {
        item_id: open.id,
        output_index: at.output_index,
        arguments: open.args,
      });
      const call = { id: open.callId, function: { name: open.name, arguments: open.args } };
      item = functionCallItem(open.id, call, status);
    }
    this.#send("response.output_item.done", { output_index: at.output_index, item });
    this.#output.push(item);
  }

  /**
   * After the run ended: an `error` event when it was aborted; else the last item closed
   * (whitespace-only content sent as a message of its own) and `response.completed` (or
   * `response.incomplete`) with the whole response.
   */
  end(ac: AbortController): void {
    const run = this.#run;
    if (run.finishReason === "abort" || run.finishReason === null) {
      this.#sendApiError(this.#ctx.lifecycle.aborted(ac));
      return;
    }
    if (this.#heldSpace !== "") {
      // An answer whose content is only whitespace: a message of its own, as unstreamed.
      this.#sendText(this.#heldSpace);
      this.#heldSpace = "";
    }
    const status = responseStatus(run);
    this.#closeItem(status === "incomplete" ? "incomplete" : "completed");
    const usage = responseUsage(this.#ctx.engine, this.#prep, run, this.#reasoning);
    const response = responseObject(this.#head, { status, output: this.#output, usage });
    this.#send(status === "incomplete" ? "response.incomplete" : "response.completed", {
      response,
    });
  }

  /** `e` as an `error` event. */
  override sendError(e: unknown): void {
    const ctx = this.#ctx;
    this.#sendApiError(toApiError(e, ctx.retryAfter) ?? internalError(e, ctx.onError));
  }

  #sendApiError(err: { message: string; param: string | null; code: string | null }): void {
    this.#send("error", { code: err.code, message: err.message, param: err.param });
  }
}
