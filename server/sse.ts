/**
 * Streaming responses as Server-Sent Events: `data: {chunk}\n\n` per increment, ending
 * `data: [DONE]\n\n`. Chat streams open with one role chunk per choice; with
 * `stream_options.include_usage` one chunk with empty `choices` and `usage` precedes `[DONE]`
 * (with `continuous_usage_stats`, every chunk carries usage). An error after the response
 * started is sent as an error event before `[DONE]`; cancelling the stream (client disconnect)
 * aborts every engine request of the response.
 *
 * @module
 */

import { ReasoningStream } from "./reasoning.ts";
import { type ToolCallDelta, ToolCallStream } from "./tools.ts";
import { type ChoiceRun, type Usage, usageOf } from "./choice_run.ts";
import type { ServerContext } from "./context.ts";
import { internalError, toApiError } from "./errors.ts";
import { chatLogprobs, completionLogprobs } from "./logprobs.ts";
import type { Prepared } from "./prepare.ts";

const encoder = new TextEncoder();

/** One SSE event: `data: <data>\n\n`, `data` JSON-encoded unless it is a string. */
export function sseEvent(data: unknown): Uint8Array {
  return encoder.encode(`data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`);
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
  const { engine, metrics } = ctx;
  const object = prep.kind === "chat" ? "chat.completion.chunk" : "text_completion";
  const head = { id: prep.id, object, created: prep.created, model: prep.model };
  let closed = false;
  let finished = false;
  const finish = () => {
    if (finished) return;
    finished = true;
    for (const r of runs) r.observe(metrics);
    done();
  };
  const stopAll = () => {
    if (!ac.signal.aborted) ac.abort();
    void Promise.all(runs.map((r) => r.cancel(engine))).finally(finish);
  };
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      const send = (data: unknown) => {
        if (closed) return;
        try {
          controller.enqueue(sseEvent(data));
        } catch {
          closed = true;
        }
      };
      const usageField = (): { usage?: Usage | null } =>
        prep.continuousUsage
          ? { usage: usageOf(prep, runs) }
          : prep.includeUsage
          ? { usage: null }
          : {};
      if (prep.kind === "chat") {
        for (const r of runs) {
          send({
            ...head,
            choices: [{
              index: r.index,
              delta: { role: "assistant", content: "" },
              logprobs: null,
              finish_reason: null,
            }],
            ...usageField(),
          });
        }
      }
      const pump = async (r: ChoiceRun) => {
        let offset = 0;
        const reasoning = prep.reasoning ? new ReasoningStream() : null;
        const tools = prep.toolCalls ? new ToolCallStream() : null;
        for (;;) {
          const out = await r.next();
          if (out === null || closed) break;
          const reason = out.finishReason === "abort" ? null : out.finishReason;
          const hasLogprobs = r.logprobs && out.logprobs !== null && out.logprobs.length > 0;
          // As vLLM: an increment with new tokens is streamed even when its text is empty
          // (held back, a partial character, special tokens, ids past a padded vocabulary).
          if (out.tokenIds.length === 0 && out.text === "" && reason === null && !hasLogprobs) {
            continue;
          }
          const lps = out.logprobs ?? [];
          const delta = chatDelta(reasoning, tools, out.text, out.finishReason !== null);
          const choice = prep.kind === "chat"
            ? {
              index: r.index,
              delta,
              logprobs: r.logprobs ? chatLogprobs(engine, lps) : null,
              finish_reason: tools !== null && tools.calls > 0 && reason === "stop"
                ? "tool_calls"
                : reason,
              stop_reason: out.finishReason === null ? undefined : out.stopReason,
            }
            : {
              index: r.index,
              text: out.text,
              logprobs: r.logprobs ? completionLogprobs(engine, lps, offset) : null,
              finish_reason: reason,
              stop_reason: out.finishReason === null ? undefined : out.stopReason,
            };
          offset += out.text.length;
          send({ ...head, choices: [choice], ...usageField() });
        }
      };
      Promise.all(runs.map(pump)).then(
        () => {
          if (runs.some((r) => r.finishReason === "abort" || r.finishReason === null)) {
            send(ctx.lifecycle.aborted(ac).body());
          } else if (prep.includeUsage) {
            send({ ...head, choices: [], usage: usageOf(prep, runs) });
          }
          send("[DONE]");
        },
        (e: unknown) => {
          const err = toApiError(e, ctx.retryAfter) ?? internalError(e, ctx.onError);
          send(err.body());
          send("[DONE]");
          stopAll();
        },
      ).finally(() => {
        if (!closed) {
          closed = true;
          try {
            controller.close();
          } catch { /* already closed */ }
        }
        finish();
      });
    },
    cancel() {
      closed = true;
      stopAll();
    },
  });
  return new Response(body, {
    headers: {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      "x-accel-buffering": "no",
    },
  });
}

/**
 * A chat delta of `text`: split by the reasoning parser into `reasoning_content` and content,
 * then the content by the tool-call parser into `content` and `tool_calls` (what the parsers
 * hold back, a possible tag, comes with a later delta, or the last one).
 */
function chatDelta(
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
