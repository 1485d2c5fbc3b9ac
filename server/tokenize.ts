/**
 * vLLM's tokenizer endpoints: `POST /tokenize` (a prompt, or chat messages through the chat
 * template, -> token ids with `count` and `max_model_len`, and with `return_token_strs` each
 * token's vocabulary string) and `POST /detokenize` (token ids ->
 * text).
 *
 * @module
 */

import { checkTokenIds } from "../engine/input_processor.ts";
import { checkModel, requireTokenizer, type ServerContext } from "./context.ts";
import { chatMessages } from "./prepare.ts";
import {
  ApiError,
  detokenizeRequestSchema,
  generationPromptOptions,
  parseBody,
  tokenizeRequestSchema,
} from "./protocol.ts";
import { readJson } from "./read_json.ts";

/**
 * `POST /tokenize`: exactly one of `prompt` (special tokens added unless `add_special_tokens` is
 * false) and `messages` (rendered with the chat template; special tokens not added by default).
 */
export async function tokenizeEndpoint(ctx: ServerContext, req: Request): Promise<Response> {
  const { engine } = ctx;
  const body = parseBody(
    tokenizeRequestSchema,
    await readJson(req, ctx.maxBody, ctx.readTimeoutMs),
  );
  checkModel(ctx, body.model);
  let tokens: number[];
  if ((body.prompt === undefined) === (body.messages === undefined)) {
    throw new ApiError(400, "Give exactly one of 'prompt' and 'messages'", {
      param: body.prompt === undefined ? "prompt" : "messages",
      code: body.prompt === undefined ? "missing_required_parameter" : "invalid_value",
    });
  }
  if (body.prompt !== undefined) {
    tokens = requireTokenizer(engine, "prompt").encode(body.prompt, {
      addSpecialTokens: body.add_special_tokens ?? true,
    });
  } else {
    const tok = requireTokenizer(engine, "messages");
    const text = tok.applyChatTemplate(chatMessages(body.messages ?? []), {
      ...generationPromptOptions(body),
      extra: body.chat_template_kwargs ?? {},
    });
    tokens = tok.encode(text, { addSpecialTokens: body.add_special_tokens ?? false });
  }
  const tok = requireTokenizer(engine, body.prompt !== undefined ? "prompt" : "messages");
  return Response.json({
    count: tokens.length,
    max_model_len: engine.model.maxModelLen,
    tokens,
    // vLLM's: the vocabulary strings (`convert_ids_to_tokens`: byte-level pieces, not text).
    ...(body.return_token_strs === true
      ? { token_strs: tokens.map((id) => tok.idToToken(id) ?? null) }
      : {}),
  });
}

/** `POST /detokenize`: token ids -> `{prompt: text}`; an id outside the vocabulary is a 400. */
export async function detokenizeEndpoint(ctx: ServerContext, req: Request): Promise<Response> {
  const body = parseBody(
    detokenizeRequestSchema,
    await readJson(req, ctx.maxBody, ctx.readTimeoutMs),
  );
  checkModel(ctx, body.model);
  checkTokenIds(body.tokens, ctx.engine.model, "tokens");
  return Response.json({ prompt: requireTokenizer(ctx.engine, "tokens").decode(body.tokens) });
}
