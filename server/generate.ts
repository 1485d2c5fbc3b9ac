/**
 * `POST /v1/completions` and `POST /v1/chat/completions`: validation and preparation of the
 * request, the fan-out into one engine request per choice, and the non-streaming response
 * (streaming responses are built by server/sse.ts).
 *
 * The engine is asked for the first output of every choice before the response starts, so errors
 * the engine raises at admission get their status code even for streaming requests. A client
 * disconnect aborts every engine request of the response at once.
 *
 * @module
 */

import { chatAnswer } from "./chat_answer.ts";
import { type ChoiceRun, launch, usageOf } from "./choice_run.ts";
import { noteIgnoredFields, type ServerContext } from "./context.ts";
import { chatLogprobs, completionChoiceLogprobs, promptLogprobsOf } from "./logprobs.ts";
import { echoText, prepareChat, prepareCompletion, type Prepared } from "./prepare.ts";
import {
  chatRequestSchema,
  completionRequestSchema,
  parseBody,
  unlistedFields,
} from "./protocol.ts";
import { readJson } from "./read_json.ts";
import { completeStreaming } from "./sse.ts";

/**
 * Answers a completion (`kind` "completion") or chat completion request: 503 unless the server
 * is available, 400 for an invalid body, then the JSON response or the SSE stream. The response
 * is tracked as in flight until its last byte (or its abort).
 */
export async function generateEndpoint(
  ctx: ServerContext,
  req: Request,
  kind: "chat" | "completion",
): Promise<Response> {
  const { engine, lifecycle } = ctx;
  lifecycle.checkAvailable(engine);
  const json = await readJson(req, ctx.maxBody, ctx.readTimeoutMs);
  noteIgnoredFields(
    ctx,
    unlistedFields(kind === "chat" ? chatRequestSchema : completionRequestSchema, json),
  );
  const prep = kind === "chat"
    ? prepareChat(ctx, parseBody(chatRequestSchema, json))
    : prepareCompletion(ctx, parseBody(completionRequestSchema, json));
  const { ac, done } = lifecycle.track(req);
  let streaming = false;
  try {
    const runs = await launch(engine, prep, ac);
    if (prep.stream) {
      streaming = true;
      return completeStreaming(ctx, prep, runs, ac, done);
    }
    try {
      return await completeNonStreaming(ctx, prep, runs, ac);
    } catch (e) {
      ac.abort();
      await Promise.all(runs.map((r) => r.cancel(engine)));
      for (const r of runs) r.observe(ctx.metrics);
      throw e;
    }
  } finally {
    if (!streaming) done();
  }
}

/**
 * Waits for every choice to finish and answers the whole response as one JSON body
 * (`chat.completion` or `text_completion`); a choice that was aborted makes it a 503.
 */
async function completeNonStreaming(
  ctx: ServerContext,
  prep: Prepared,
  runs: ChoiceRun[],
  ac: AbortController,
): Promise<Response> {
  const { engine } = ctx;
  await Promise.all(runs.map(async (r) => {
    while ((await r.next()) !== null) { /* accumulate */ }
    r.observe(ctx.metrics);
  }));
  if (runs.some((r) => r.finishReason === "abort" || r.finishReason === null)) {
    throw ctx.lifecycle.aborted(ac);
  }
  const choices = runs.map((r) => {
    const finish = r.finishReason === "abort" ? null : r.finishReason;
    if (prep.kind === "chat") {
      const answer = chatAnswer(prep, r.text);
      const called = answer.toolCalls.length > 0;
      const echo = echoText(prep, r.index);
      return {
        index: r.index,
        message: {
          role: "assistant",
          content: echo === "" ? answer.content : echo + (answer.content ?? ""),
          ...(answer.reasoning === undefined ? {} : { reasoning_content: answer.reasoning }),
          ...(called ? { tool_calls: answer.toolCalls } : {}),
        },
        logprobs: r.logprobs ? chatLogprobs(engine, r.tokenLogprobs, prep.tokensAsIds) : null,
        finish_reason: called && finish === "stop" ? "tool_calls" : finish,
        stop_reason: r.stopReason,
        ...(prep.returnTokenIds ? { token_ids: r.tokenIds } : {}),
      };
    }
    const echo = echoText(prep, r.index);
    return {
      index: r.index,
      text: echo + r.text,
      logprobs: r.logprobs
        ? completionChoiceLogprobs(engine, prep, r, r.tokenLogprobs, echo.length, true)
        : null,
      finish_reason: finish,
      stop_reason: r.stopReason,
      ...promptLogprobsOf(engine, prep, r),
      ...(prep.returnTokenIds ? tokenIdsOf(prep, r) : {}),
    };
  });
  return Response.json({
    id: prep.id,
    object: prep.kind === "chat" ? "chat.completion" : "text_completion",
    created: prep.created,
    model: prep.model,
    choices,
    usage: usageOf(prep, runs),
    // vLLM's: a chat response's prompt_logprobs and prompt_token_ids are top level (its choices
    // share the prompt).
    ...(prep.kind === "chat" ? promptLogprobsOf(engine, prep, runs[0]) : {}),
    ...(prep.kind === "chat" && prep.returnTokenIds ? { prompt_token_ids: prep.prompts[0] } : {}),
  });
}

/**
 * A completion choice's `return_token_ids` fields, as vLLM answers them: its prompt's ids and the
 * ids it generated (none for `echo` without generation: ChoiceRun leaves its token out).
 */
function tokenIdsOf(
  prep: Prepared,
  r: ChoiceRun,
): { prompt_token_ids: number[]; token_ids: number[] } {
  return {
    prompt_token_ids: prep.prompts[Math.floor(r.index / prep.n)]!,
    token_ids: r.tokenIds,
  };
}
