/**
 * Streaming responses as Server-Sent Events: `data: {chunk}\n\n` per increment, ending
 * `data: [DONE]\n\n`. Chat streams open with one role chunk per choice; with
 * `stream_options.include_usage` one chunk with empty `choices` and `usage` precedes `[DONE]`
 * (with `continuous_usage_stats`, every chunk carries usage). With `prompt_logprobs`, a chat
 * stream's first chunk carries them (top level), a completion's first chunk of each choice in
 * that choice; with a completion's `echo` and `logprobs`, a choice's first chunk's `logprobs`
 * start with the echoed prompt's tokens. With `return_token_ids` (vLLM's placement), every
 * chunk's choice carries the `token_ids` it adds; a completion choice's first chunk also carries
 * `prompt_token_ids`, and each chat role chunk carries them at the top level. An error after the
 * response started is sent as an error event before `[DONE]`; cancelling the stream (client
 * disconnect) aborts every engine request of the response.
 *
 * @module
 */

import type { RequestOutput } from "../engine/engine_api.ts";
import { ReasoningStream } from "./reasoning.ts";
import { type ToolCallDelta, ToolCallStream } from "./tools.ts";
import { type ChoiceRun, type Usage, usageOf } from "./choice_run.ts";
import type { ServerContext } from "./context.ts";
import { internalError, toApiError } from "./errors.ts";
import { chatLogprobs, completionChoiceLogprobs, promptLogprobsOf } from "./logprobs.ts";
import { echoText, type Prepared } from "./prepare.ts";

const encoder = new TextEncoder();

/** One SSE event: `data: <data>\n\n`, `data` JSON-encoded unless it is a string. */
export function sseEvent(data: unknown): Uint8Array {
  return encoder.encode(`data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`);
}

/** The headers of every Server-Sent Events response. */
export const SSE_HEADERS = {
  "content-type": "text/event-stream; charset=utf-8",
  "cache-control": "no-cache",
  "x-accel-buffering": "no",
};

/**
 * Writes a streamed response's events to its stream's controller, until the stream closes
 * (ended, cancelled, or the controller refused an event); {@linkcode eventStream} drives it.
 */
export abstract class EventWriter {
  #controller: ReadableStreamDefaultController<Uint8Array> | null = null;
  /** Whether the stream is closed: nothing more is sent. */
  closed = false;

  /** Sets the controller events are written to (before anything is sent). */
  attach(controller: ReadableStreamDefaultController<Uint8Array>): void {
    this.#controller = controller;
  }

  /** Enqueues one encoded event (nothing once closed; a refused event closes the stream). */
  protected write(bytes: Uint8Array): void {
    if (this.closed) return;
    try {
      this.#controller!.enqueue(bytes);
    } catch {
      this.closed = true;
    }
  }

  /** Closes the stream (once). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    try {
      this.#controller!.close();
    } catch { /* already closed */ }
  }

  /** Sends `e` as the stream's error event (and whatever ends the stream after one). */
  abstract sendError(e: unknown): void;
}

/**
 * A streamed response over the primed `runs`: `produce` sends every event but an error; when it
 * throws, the error is sent and every run's engine request cancelled; a cancelled stream (client
 * disconnect) cancels them too. `done` is called once the stream has ended (finished, failed or
 * cancelled) and every run is recorded in the metrics; `ac` is aborted when the stream is
 * cancelled or fails.
 */
export function eventStream(
  ctx: ServerContext,
  runs: readonly ChoiceRun[],
  ac: AbortController,
  done: () => void,
  events: EventWriter,
  produce: () => Promise<void>,
): Response {
  let finished = false;
  const finish = () => {
    if (finished) return;
    finished = true;
    for (const r of runs) r.observe(ctx.metrics);
    done();
  };
  const stopAll = () => {
    if (!ac.signal.aborted) ac.abort();
    void Promise.all(runs.map((r) => r.cancel(ctx.engine))).finally(finish);
  };
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      events.attach(controller);
      produce().catch((e: unknown) => {
        events.sendError(e);
        stopAll();
      }).finally(() => {
        events.close();
        finish();
      });
    },
    cancel() {
      events.closed = true;
      stopAll();
    },
  });
  return new Response(body, { headers: SSE_HEADERS });
}

/**
 * The streaming response of `prep` over its primed `runs`. `done` is called once the stream has
 * ended (finished, failed or cancelled) and every run is recorded in the metrics; `ac` is
 * aborted when the stream is cancelled or fails.
 */
export function completeStreaming(
  ctx: ServerContext,
  prep: Prepared,
  runs: ChoiceRun[],
  ac: AbortController,
  done: () => void,
): Response {
  const events = new ChunkEvents(ctx, prep, runs);
  return eventStream(ctx, runs, ac, done, events, async () => {
    events.sendRoles();
    await Promise.all(runs.map((r) => events.pump(r)));
    events.sendEnd(ac);
  });
}

/**
 * The events of one streaming response, written to its stream's controller: the chat role
 * chunks, each choice's increments, the usage chunk and `[DONE]` (or an error event). Nothing
 * is sent once the stream is closed.
 */
class ChunkEvents extends EventWriter {
  readonly #ctx: ServerContext;
  readonly #prep: Prepared;
  readonly #runs: readonly ChoiceRun[];
  /** The fields every chunk starts with. */
  readonly #head: { id: string; object: string; created: number; model: string };

  constructor(ctx: ServerContext, prep: Prepared, runs: readonly ChoiceRun[]) {
    super();
    this.#ctx = ctx;
    this.#prep = prep;
    this.#runs = runs;
    const object = prep.kind === "chat" ? "chat.completion.chunk" : "text_completion";
    this.#head = { id: prep.id, object, created: prep.created, model: prep.model };
  }

  /** Sends `data` as one event (nothing once closed). */
  send(data: unknown): void {
    this.write(sseEvent(data));
  }

  /**
   * A chat stream's opening chunk per choice: `delta: {role: "assistant", content: ""}` (with
   * `echo`, the content echoed); the first one carries `prompt_logprobs` when requested, each
   * one `prompt_token_ids` with `return_token_ids` (as vLLM's role chunks do).
   */
  sendRoles(): void {
    const prep = this.#prep;
    if (prep.kind !== "chat") return;
    this.#runs.forEach((r, i) => {
      this.send({
        ...this.#head,
        choices: [{
          index: r.index,
          delta: { role: "assistant", content: echoText(prep, r.index) },
          logprobs: null,
          finish_reason: null,
        }],
        ...(i === 0 ? promptLogprobsOf(this.#ctx.engine, prep, r) : {}),
        ...(prep.returnTokenIds ? { prompt_token_ids: prep.prompts[0] } : {}),
        ...this.#usageField(),
      });
    });
  }

  /** Sends `r`'s increments, one chunk each, until it ends or the stream closes. */
  async pump(r: ChoiceRun): Promise<void> {
    const prep = this.#prep;
    const state: ChoiceState = {
      offset: 0,
      first: true,
      echo: prep.kind === "completion" ? echoText(prep, r.index) : "",
      reasoning: prep.reasoning ? new ReasoningStream() : null,
      tools: prep.toolCalls ? new ToolCallStream() : null,
    };
    for (;;) {
      const out = await r.next();
      if (out === null || this.closed) break;
      const choice = streamedChoice(this.#ctx, prep, r, out, state);
      if (choice === null) continue;
      this.send({ ...this.#head, choices: [choice], ...this.#usageField() });
    }
  }

  /** After every choice ended: an abort error event, or the usage chunk; then `[DONE]`. */
  sendEnd(ac: AbortController): void {
    const runs = this.#runs;
    if (runs.some((r) => r.finishReason === "abort" || r.finishReason === null)) {
      this.send(this.#ctx.lifecycle.aborted(ac).body());
    } else if (this.#prep.includeUsage) {
      this.send({ ...this.#head, choices: [], usage: usageOf(this.#prep, runs) });
    }
    this.send("[DONE]");
  }

  /** `e` as an error event, then `[DONE]`. */
  override sendError(e: unknown): void {
    const ctx = this.#ctx;
    const err = toApiError(e, ctx.retryAfter) ?? internalError(e, ctx.onError);
    this.send(err.body());
    this.send("[DONE]");
  }

  /** The `usage` field of a chunk: the usage so far, null, or none (`stream_options`). */
  #usageField(): { usage?: Usage | null } {
    const prep = this.#prep;
    return prep.continuousUsage
      ? { usage: usageOf(prep, this.#runs) }
      : prep.includeUsage
      ? { usage: null }
      : {};
  }
}

/** What one streamed choice carries from one increment to the next. */
interface ChoiceState {
  /** Characters of text streamed so far (completion logprobs' `text_offset`). */
  offset: number;
  /** Whether the choice's first chunk is still to be sent. */
  first: boolean;
  /** A completion's `echo` text, sent with its first chunk ("" once sent, or without echo). */
  echo: string;
  readonly reasoning: ReasoningStream | null;
  readonly tools: ToolCallStream | null;
}

/**
 * The `choices` entry of one increment `out` of `r`, or null when it carries nothing to send.
 * As vLLM, an increment with new tokens is streamed even when its text is empty (held back, a
 * partial character, special tokens, ids past a padded vocabulary).
 */
function streamedChoice(
  ctx: ServerContext,
  prep: Prepared,
  r: ChoiceRun,
  out: RequestOutput,
  state: ChoiceState,
): Record<string, unknown> | null {
  const { engine } = ctx;
  const reason = out.finishReason === "abort" ? null : out.finishReason;
  const lps = out.logprobs ?? [];
  const hasLogprobs = r.logprobs && lps.length > 0;
  const text = state.echo + out.text;
  // A completion's first chunk carries the prompt's logprobs (prompt_logprobs, echoed ones).
  const prompt = state.first && prep.kind === "completion" &&
    (prep.promptLogprobs !== null || prep.echoLogprobs !== null);
  if (out.tokenIds.length === 0 && text === "" && reason === null && !hasLogprobs && !prompt) {
    return null;
  }
  // The generated text starts after the echoed one.
  const offset = state.offset + state.echo.length;
  const first = state.first;
  state.echo = "";
  state.first = false;
  const { reasoning, tools } = state;
  const delta = chatDelta(reasoning, tools, out.text, out.finishReason !== null);
  // vLLM's `return_token_ids`: the ids this chunk adds; a completion's first chunk also carries
  // its prompt's.
  const ids = !prep.returnTokenIds ? {} : {
    ...(first && prep.kind === "completion"
      ? { prompt_token_ids: prep.prompts[Math.floor(r.index / prep.n)]! }
      : {}),
    token_ids: out.tokenIds,
  };
  const choice = prep.kind === "chat"
    ? {
      index: r.index,
      delta,
      logprobs: r.logprobs ? chatLogprobs(engine, lps, prep.tokensAsIds) : null,
      finish_reason: tools !== null && tools.calls > 0 && reason === "stop" ? "tool_calls" : reason,
      stop_reason: out.finishReason === null ? undefined : out.stopReason,
      ...ids,
    }
    : {
      index: r.index,
      text,
      logprobs: r.logprobs ? completionChoiceLogprobs(engine, prep, r, lps, offset, prompt) : null,
      finish_reason: reason,
      stop_reason: out.finishReason === null ? undefined : out.stopReason,
      ...(prompt ? promptLogprobsOf(engine, prep, r) : {}),
      ...ids,
    };
  state.offset += text.length;
  return choice;
}

/**
 * A chat delta of `text`: split by the reasoning parser into `reasoning_content` and content,
 * then the content by the tool-call parser into `content` and `tool_calls` (what the parsers
 * hold back, a possible tag, comes with a later delta, or the last one, `last`). Also what
 * `/v1/responses` streams its events from (server/responses_stream.ts).
 */
export function chatDelta(
  reasoning: ReasoningStream | null,
  tools: ToolCallStream | null,
  text: string,
  last: boolean,
): { reasoning_content?: string; content?: string; tool_calls?: ToolCallDelta[] } {
  let thought = "";
  let content = text;
  if (reasoning !== null) {
    const a = reasoning.push(text);
    const b = last ? reasoning.finish() : { reasoning: "", content: "" };
    thought = a.reasoning + b.reasoning;
    content = a.content + b.content;
  }
  let calls: ToolCallDelta[] = [];
  if (tools !== null) {
    const t = tools.push(content);
    content = t.content + (last ? tools.finish() : "");
    calls = t.toolCalls;
  }
  return {
    ...(thought === "" ? {} : { reasoning_content: thought }),
    ...(content === "" ? {} : { content }),
    ...(calls.length === 0 ? {} : { tool_calls: calls }),
  };
}
