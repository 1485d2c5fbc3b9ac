/**
 * `POST /v1/responses`, OpenAI's Responses API as vLLM serves it, built on the chat completions
 * path: the request is translated into the chat request it amounts to
 * (server/responses_input.ts), prepared and launched as a chat completion (server/prepare.ts,
 * server/choice_run.ts), and its answer parsed by the chat path's reasoning and tool-call parsers
 * and written as a `response` object (server/responses_output.ts) or as Responses stream events
 * (server/responses_stream.ts).
 *
 * Nothing is stored (`store` is accepted and reported false, as vLLM without its store does), so
 * `previous_response_id` is a 400 and there is no `GET /v1/responses/{id}`. As for the chat
 * endpoint, the engine is asked for the first output before the response starts (admission
 * errors get their status code, streamed or not), and a client disconnect aborts the engine
 * request.
 *
 * @module
 */

import { chatAnswer } from "./chat_answer.ts";
import { launch } from "./choice_run.ts";
import { noteIgnoredFields, type ServerContext } from "./context.ts";
import { prepareChat, type Prepared } from "./prepare.ts";
import { parseBody, unlistedFields } from "./protocol.ts";
import { readJson } from "./read_json.ts";
import { renamedError, responsesPlan } from "./responses_input.ts";
import {
  outputItems,
  responseHead,
  responseObject,
  responsesId,
  responseStatus,
  responseUsage,
} from "./responses_output.ts";
import { RESPONSES_UNIMPLEMENTED_FIELDS, responsesRequestSchema } from "./responses_protocol.ts";
import { streamResponse } from "./responses_stream.ts";

/**
 * Answers `POST /v1/responses`: 503 unless the server is available, 400 for an invalid or
 * unsupported request (naming the Responses field), then the `response` object or its event
 * stream. The response is tracked as in flight until its last byte (or its abort).
 */
export async function responsesEndpoint(ctx: ServerContext, req: Request): Promise<Response> {
  const { engine, lifecycle } = ctx;
  lifecycle.checkAvailable(engine);
  const json = await readJson(req, ctx.maxBody, ctx.readTimeoutMs);
  noteIgnoredFields(
    ctx,
    unlistedFields(responsesRequestSchema, json, RESPONSES_UNIMPLEMENTED_FIELDS),
  );
  const body = parseBody(responsesRequestSchema, json);
  const plan = responsesPlan(ctx, body);
  let prep: Prepared;
  try {
    prep = { ...prepareChat(ctx, plan.chat), id: responsesId("resp") };
  } catch (e) {
    throw renamedError(e, ctx.retryAfter);
  }
  const head = responseHead(prep, body, plan);
  const { ac, done } = lifecycle.track(req);
  let streaming = false;
  try {
    const runs = await launch(engine, prep, ac).catch((e: unknown) => {
      throw renamedError(e, ctx.retryAfter);
    });
    const run = runs[0]!;
    if (prep.stream) {
      streaming = true;
      return streamResponse(ctx, prep, head, run, ac, done);
    }
    try {
      while ((await run.next()) !== null) { /* accumulate */ }
      run.observe(ctx.metrics);
      if (run.finishReason === "abort" || run.finishReason === null) {
        throw lifecycle.aborted(ac);
      }
      const answer = chatAnswer(prep, run.text);
      return Response.json(responseObject(head, {
        status: responseStatus(run),
        output: outputItems(engine, prep, plan, run, answer),
        usage: responseUsage(engine, prep, run, answer.reasoning),
      }));
    } catch (e) {
      ac.abort();
      await run.cancel(engine);
      run.observe(ctx.metrics);
      throw e;
    }
  } finally {
    if (!streaming) done();
  }
}
