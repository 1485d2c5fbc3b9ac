/**
 * The OpenAI-compatible HTTP server (vLLM's endpoints) over an {@linkcode EngineClient}.
 *
 * | endpoint | what |
 * | --- | --- |
 * | `POST /v1/completions` | text completion; `prompt` is a string, a list of strings, token ids or a list of token-id lists |
 * | `POST /v1/chat/completions` | chat completion through the model's chat template |
 * | `GET /v1/models` | the served model names, with `max_model_len` |
 * | `GET /health` | 200 (empty) when ready, 503 while loading, draining or after an engine error |
 * | `GET /metrics` | Prometheus text format, vLLM's metric names (server/metrics.ts) |
 * | `POST /tokenize`, `POST /detokenize` | vLLM's tokenizer endpoints |
 * | `POST /batch/test` | the mock batching experiment (server/batch_test.ts), when a factory is given |
 *
 * Streaming answers are Server-Sent Events (`data: {chunk}\n\n`, ending `data: [DONE]\n\n`); with
 * `stream_options.include_usage` one chunk with empty `choices` and `usage` precedes `[DONE]`.
 * `n` > 1 (and a list of prompts) fans out into one engine request per choice; choice
 * `p * n + i` is prompt `p`'s i-th sample, and with a `seed` choice i uses `seed + i`.
 *
 * Errors are OpenAI-style JSON bodies `{error: {message, type, param, code}}`: 400 invalid input
 * (and the engine's RangeError / TypeError), 404 unknown path or model, 405 wrong method (with
 * `Allow`), 413 body over `maxBodyBytes` (enforced while reading), 429 engine overloaded (with
 * `Retry-After`), 503 not ready / draining / engine dead, 500 anything else (message only, the
 * stack goes to `onError`).
 *
 * The engine is asked for the first output of every choice before the response starts, so
 * errors the engine raises at admission get their status code even for streaming requests.
 * A client disconnect (request signal, or the SSE stream cancelled) aborts every engine request
 * of the response at once.
 *
 * @module
 */

import {
  type EngineClient,
  EngineDeadError,
  EngineOverloadedError,
  type RequestOutput,
  type TokenLogprob,
} from "../engine/engine_api.ts";
import type { ChatMessage, Tokenizer } from "../engine/tokenizer.ts";
import { ChatTemplateError } from "../engine/chat_template.ts";
import { type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import { type BatchTestFactory, runBatchTest } from "./batch_test.ts";
import { PROMETHEUS_CONTENT_TYPE, ServerMetrics } from "./metrics.ts";
import {
  ApiError,
  batchTestRequestSchema,
  type ChatRequest,
  chatRequestSchema,
  type CompletionRequest,
  completionRequestSchema,
  detokenizeRequestSchema,
  errorResponse,
  messageText,
  parseBody,
  tokenizeRequestSchema,
} from "./protocol.ts";

export type { BatchTestConfig, BatchTestFactory, BatchTestResult } from "./batch_test.ts";
export { ApiError } from "./protocol.ts";
export { ServerMetrics } from "./metrics.ts";

/** Options of {@linkcode createHandler}. */
export interface ServerOptions {
  /** Names requests may use in `model`; the first is reported. Default `[engine.model.name]`. */
  servedModelNames?: readonly string[];
  /** Largest accepted request body in bytes (413 beyond). Default 1 MiB. */
  maxBodyBytes?: number;
  /** Builds the mock engine of `POST /batch/test`; without it that endpoint answers 501. */
  batchTest?: BatchTestFactory;
  /** Initial readiness (`/health` 503 and inference 503 until {@linkcode ServerHandler.setReady}). Default true. */
  ready?: boolean;
  /** `Retry-After` seconds sent with 429. Default 1. */
  retryAfterSeconds?: number;
  /** Called with unexpected errors (answered 500). Default: `console.error`. */
  onError?: (error: unknown) => void;
}

/** The request handler plus its state. */
export interface ServerHandler {
  /** Answers one HTTP request (never throws). */
  handler: (req: Request) => Promise<Response>;
  /** The metric set behind `GET /metrics`. */
  metrics: ServerMetrics;
  /** Whether `/health` says 200 (while the engine has no error and the server is not draining). */
  readonly ready: boolean;
  /** Marks the server ready or not (e.g. false while the model loads). */
  setReady(ready: boolean): void;
  /** Whether {@linkcode drain} was called: new inference requests get 503. */
  readonly draining: boolean;
  /** Inference (and /batch/test) requests whose response is not finished yet. */
  readonly inFlight: number;
  /**
   * Stops accepting inference requests (503), waits up to `graceMs` for in-flight ones to finish,
   * then aborts the rest and waits for their responses to close.
   */
  drain(graceMs: number): Promise<void>;
}

const DEFAULT_MAX_BODY = 1 << 20;

const ROUTES: Readonly<Record<string, readonly string[]>> = {
  "/v1/completions": ["POST"],
  "/v1/chat/completions": ["POST"],
  "/v1/models": ["GET"],
  "/health": ["GET"],
  "/metrics": ["GET"],
  "/tokenize": ["POST"],
  "/detokenize": ["POST"],
  "/batch/test": ["POST"],
};

/** Reads the body as JSON, refusing more than `max` bytes while reading (413). */
async function readJson(req: Request, max: number): Promise<unknown> {
  const tooLarge = () =>
    new ApiError(413, `Request body exceeds the limit of ${max} bytes`, {
      code: "request_too_large",
    });
  const declared = req.headers.get("content-length");
  if (declared !== null && Number(declared) > max) {
    await req.body?.cancel().catch(() => {});
    throw tooLarge();
  }
  if (req.body === null) throw new ApiError(400, "Missing request body", { code: "invalid_json" });
  const reader = req.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > max) {
      await reader.cancel().catch(() => {});
      throw tooLarge();
    }
    chunks.push(value);
  }
  const bytes = new Uint8Array(total);
  let off = 0;
  for (const c of chunks) {
    bytes.set(c, off);
    off += c.byteLength;
  }
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new ApiError(400, "Request body is not valid UTF-8", { code: "invalid_json" });
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ApiError(400, `Malformed JSON body: ${e instanceof Error ? e.message : String(e)}`, {
      code: "invalid_json",
    });
  }
}

/** The {@linkcode ApiError} for an error thrown by the engine (or by request preparation). */
function toApiError(e: unknown, retryAfter: number): ApiError | null {
  if (e instanceof ApiError) return e;
  if (e instanceof EngineOverloadedError) {
    return new ApiError(429, `The model is overloaded: ${e.message}`, {
      code: "model_overloaded",
      headers: { "retry-after": String(retryAfter) },
    });
  }
  if (e instanceof EngineDeadError) {
    return new ApiError(503, `The engine is not available: ${e.message}`, { code: "engine_dead" });
  }
  if (e instanceof ChatTemplateError) {
    return new ApiError(400, e.message, { code: "invalid_value" });
  }
  if (e instanceof RangeError || e instanceof TypeError) {
    return new ApiError(400, e.message, { code: "invalid_value" });
  }
  return null;
}

/** One engine request (one choice) of a response, with its timings and accumulated output. */
class ChoiceRun {
  readonly index: number;
  readonly requestId: string;
  readonly promptTokens: number;
  readonly logprobs: boolean;
  #iterator: AsyncIterator<RequestOutput> | null = null;
  #first: IteratorResult<RequestOutput> | null = null;
  readonly #arrival: number;
  #last = 0;
  #ttft: number | null = null;
  readonly #gaps: number[] = [];
  text = "";
  outputTokens = 0;
  readonly tokenLogprobs: TokenLogprob[] = [];
  finishReason: "stop" | "length" | "abort" | null = null;
  stopReason: number | string | null = null;
  #observed = false;
  #started = false;
  #ended = false;

  constructor(
    index: number,
    requestId: string,
    promptTokens: number,
    logprobs: boolean,
    arrival: number,
  ) {
    this.index = index;
    this.requestId = requestId;
    this.promptTokens = promptTokens;
    this.logprobs = logprobs;
    this.#arrival = arrival;
  }

  /** Starts the engine request (may throw the engine's admission errors). */
  start(
    engine: EngineClient,
    params: SamplingParams,
    ids: readonly number[],
    priority: number,
    signal: AbortSignal,
  ): void {
    const stream = engine.generate(
      { requestId: this.requestId, promptTokenIds: ids, params, priority },
      signal,
    );
    this.#iterator = stream[Symbol.asyncIterator]();
    this.#started = true;
  }

  /** Waits for the first result so admission errors surface before the response starts. */
  async prime(): Promise<void> {
    this.#first = await this.#pull();
  }

  async #pull(): Promise<IteratorResult<RequestOutput>> {
    if (this.#iterator === null) return { done: true, value: undefined };
    const r = await this.#iterator.next();
    if (!r.done) {
      const out = r.value;
      if (out.tokenIds.length > 0) {
        // Timings per increment that carries tokens (one gap per increment, not per token).
        const now = performance.now();
        if (this.#ttft === null) this.#ttft = (now - this.#arrival) / 1000;
        else this.#gaps.push((now - this.#last) / 1000);
        this.#last = now;
      }
      this.text += out.text;
      this.outputTokens = out.numOutputTokens;
      if (out.logprobs !== null) this.tokenLogprobs.push(...out.logprobs);
      if (out.finishReason !== null) {
        this.finishReason = out.finishReason;
        this.stopReason = out.stopReason;
      }
    }
    return r;
  }

  /** The next increment, or null when the request is over. */
  async next(): Promise<RequestOutput | null> {
    if (this.#ended) return null;
    let r: IteratorResult<RequestOutput>;
    if (this.#first !== null) {
      r = this.#first;
      this.#first = null;
    } else {
      r = await this.#pull();
    }
    if (r.done || r.value.finishReason !== null) this.#ended = true;
    return r.done ? null : r.value;
  }

  /** Ends the iteration early (aborts the engine request). */
  async cancel(engine: EngineClient): Promise<void> {
    this.#ended = true;
    if (this.#started) engine.abort(this.requestId);
    const it = this.#iterator;
    this.#iterator = null;
    if (it?.return !== undefined) await it.return().catch(() => {});
  }

  /** Records this request in the metrics once (an unfinished one counts as aborted). */
  observe(metrics: ServerMetrics): void {
    if (this.#observed || !this.#started) return;
    this.#observed = true;
    metrics.observeRequest({
      promptTokens: this.promptTokens,
      generationTokens: this.outputTokens,
      ttft: this.#ttft,
      interTokenLatencies: this.#gaps,
      e2e: ((this.#ttft === null ? performance.now() : this.#last) - this.#arrival) / 1000,
      finishReason: this.finishReason ?? "abort",
    });
  }
}

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/** A validated, tokenized request ready to be fanned out. */
interface Prepared {
  kind: "chat" | "completion";
  id: string;
  created: number;
  model: string;
  stream: boolean;
  includeUsage: boolean;
  continuousUsage: boolean;
  /** Prompt token ids per prompt. */
  prompts: number[][];
  n: number;
  /** Sampling parameters per prompt (maxTokens depends on the prompt length). */
  params: SamplingParams[];
  priority: number;
  logprobs: boolean;
}

function randomId(prefix: string): string {
  return `${prefix}-${crypto.randomUUID().replaceAll("-", "")}`;
}

const encoder = new TextEncoder();
const sse = (data: unknown): Uint8Array =>
  encoder.encode(`data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`);

/**
 * Builds the request handler for `engine` (see the module doc for the endpoints). Use
 * {@linkcode startServer} to serve it, or pass `handler` to `Deno.serve` yourself.
 */
export function createHandler(engine: EngineClient, options: ServerOptions = {}): ServerHandler {
  const names = options.servedModelNames ?? [engine.model.name];
  if (names.length === 0) throw new RangeError("Cannot serve: servedModelNames is empty");
  const modelName = names[0]!;
  const maxBody = options.maxBodyBytes ?? DEFAULT_MAX_BODY;
  const retryAfter = options.retryAfterSeconds ?? 1;
  const onError = options.onError ?? ((e: unknown) => console.error("[server] internal error:", e));
  const metrics = new ServerMetrics(modelName, engine.model.maxModelLen);
  const startedAt = Math.floor(Date.now() / 1000);
  let ready = options.ready ?? true;
  let draining = false;
  /** Abort controllers of unfinished responses. */
  const inFlight = new Set<AbortController>();
  let idle: (() => void) | null = null;

  const release = (ac: AbortController) => {
    inFlight.delete(ac);
    if (inFlight.size === 0 && idle !== null) idle();
  };

  /** Read per request: the engine behind the handler may finish loading after it was created. */
  const maxModelLen = () => engine.model.maxModelLen;

  function checkModel(model: string | null | undefined): string {
    if (model === null || model === undefined) return modelName;
    if (!names.includes(model)) {
      throw new ApiError(404, `The model \`${model}\` does not exist.`, {
        param: "model",
        code: "model_not_found",
      });
    }
    return model;
  }

  function tokenizer(param: string): Tokenizer {
    if (engine.tokenizer === null) {
      throw new ApiError(400, "The served model has no tokenizer: send prompt token ids instead", {
        param,
        code: "invalid_value",
      });
    }
    return engine.tokenizer;
  }

  function checkAvailable(): void {
    if (draining) {
      throw new ApiError(503, "The server is shutting down", { code: "server_shutting_down" });
    }
    if (!ready) throw new ApiError(503, "The model is still loading", { code: "model_not_ready" });
    if (engine.error !== null) {
      throw new ApiError(503, `The engine stopped after an error: ${engine.error.message}`, {
        code: "engine_dead",
      });
    }
  }

  function chatMessages(messages: ChatRequest["messages"]): ChatMessage[] {
    return messages.map((m) => {
      const out: ChatMessage = { ...m, role: m.role, content: messageText(m.content) };
      if (out.name === null || out.name === undefined) delete out.name;
      return out;
    });
  }

  /** Shared sampling fields -> SamplingParams for a prompt of `promptLen` tokens. */
  function sampling(
    body: CompletionRequest | ChatRequest,
    promptLen: number,
    requestedMax: number | null,
    defaultMax: number | null,
    logprobs: number | null,
    promptParam: string,
    maxParam: string,
  ): SamplingParams {
    if (promptLen === 0) {
      throw new ApiError(400, "The prompt is empty", { param: promptParam, code: "invalid_value" });
    }
    if (promptLen >= maxModelLen()) {
      throw new ApiError(
        400,
        `This model's maximum context length is ${maxModelLen()} tokens. However, your prompt has ${promptLen} tokens, leaving no room for output.`,
        { param: promptParam, code: "context_length_exceeded" },
      );
    }
    const room = maxModelLen() - promptLen;
    let maxTokens: number;
    if (requestedMax !== null) {
      if (requestedMax > room) {
        throw new ApiError(
          400,
          `This model's maximum context length is ${maxModelLen()} tokens. However, you requested ${
            promptLen + requestedMax
          } tokens (${promptLen} in the prompt, ${requestedMax} for the completion).`,
          { param: maxParam, code: "context_length_exceeded" },
        );
      }
      maxTokens = requestedMax;
    } else {
      maxTokens = Math.min(defaultMax ?? room, room);
    }
    let logitBias: Map<number, number> | null = null;
    if (body.logit_bias !== null && body.logit_bias !== undefined) {
      logitBias = new Map();
      for (const [key, bias] of Object.entries(body.logit_bias)) {
        const id = Number(key);
        if (!/^\d+$/.test(key) || id >= engine.model.vocabSize) {
          throw new ApiError(400, `logit_bias key "${key}" is not a token id of this model`, {
            param: "logit_bias",
            code: "invalid_value",
          });
        }
        logitBias.set(id, bias);
      }
    }
    const stop = body.stop === null || body.stop === undefined
      ? []
      : typeof body.stop === "string"
      ? [body.stop]
      : body.stop;
    // generation_config.json's defaults apply to the fields the request leaves out.
    const d = engine.generationDefaults ?? {};
    return samplingParams({
      temperature: body.temperature ?? d.temperature ?? 1,
      topP: body.top_p ?? d.topP ?? 1,
      topK: body.top_k === -1 ? 0 : body.top_k ?? d.topK ?? 0,
      minP: body.min_p ?? d.minP ?? 0,
      seed: body.seed ?? null,
      maxTokens,
      minTokens: Math.min(body.min_tokens ?? 0, maxTokens),
      stop: stop.filter((s) => s.length > 0),
      stopTokenIds: body.stop_token_ids ?? [],
      ignoreEos: body.ignore_eos ?? false,
      presencePenalty: body.presence_penalty ?? 0,
      frequencyPenalty: body.frequency_penalty ?? 0,
      repetitionPenalty: body.repetition_penalty ?? d.repetitionPenalty ?? 1,
      logprobs,
      logitBias,
      n: body.n ?? 1,
    });
  }

  function prepareCompletion(body: CompletionRequest): Prepared {
    const model = checkModel(body.model);
    if (body.echo === true) {
      throw new ApiError(400, "echo is not supported", { param: "echo", code: "invalid_value" });
    }
    if (body.suffix !== null && body.suffix !== undefined) {
      throw new ApiError(400, "suffix is not supported", {
        param: "suffix",
        code: "invalid_value",
      });
    }
    const p = body.prompt;
    let prompts: number[][];
    if (typeof p === "string") {
      prompts = [tokenizer("prompt").encode(p)];
    } else if (p.every((x) => typeof x === "string")) {
      const tok = tokenizer("prompt");
      prompts = p.map((s) => tok.encode(s));
    } else if (p.every((x) => typeof x === "number")) {
      prompts = [p];
    } else {
      prompts = p.filter((x) => Array.isArray(x));
    }
    for (const ids of prompts) {
      for (const id of ids) {
        if (id >= engine.model.vocabSize) {
          throw new ApiError(
            400,
            `Token id ${id} is out of the vocabulary (size ${engine.model.vocabSize})`,
            { param: "prompt", code: "invalid_value" },
          );
        }
      }
    }
    const logprobs = body.logprobs ?? null;
    const params = prompts.map((ids) =>
      sampling(body, ids.length, body.max_tokens ?? null, 16, logprobs, "prompt", "max_tokens")
    );
    return {
      kind: "completion",
      id: randomId("cmpl"),
      created: Math.floor(Date.now() / 1000),
      model,
      stream: body.stream ?? false,
      includeUsage: body.stream_options?.include_usage ?? false,
      continuousUsage: body.stream_options?.continuous_usage_stats ?? false,
      prompts,
      n: body.n ?? 1,
      params,
      priority: body.priority ?? 0,
      logprobs: logprobs !== null,
    };
  }

  function prepareChat(body: ChatRequest): Prepared {
    const model = checkModel(body.model);
    const tok = tokenizer("messages");
    const text = tok.applyChatTemplate(chatMessages(body.messages), {
      addGenerationPrompt: body.add_generation_prompt ?? true,
      extra: body.chat_template_kwargs ?? {},
    });
    const ids = tok.encode(text, { addSpecialTokens: false });
    if ((body.top_logprobs ?? 0) > 0 && body.logprobs !== true) {
      throw new ApiError(400, "top_logprobs requires logprobs to be true", {
        param: "top_logprobs",
        code: "invalid_value",
      });
    }
    const logprobs = body.logprobs === true ? body.top_logprobs ?? 0 : null;
    const requested = body.max_completion_tokens ?? body.max_tokens ?? null;
    const maxParam = body.max_completion_tokens !== null && body.max_completion_tokens !== undefined
      ? "max_completion_tokens"
      : "max_tokens";
    const params = [sampling(body, ids.length, requested, null, logprobs, "messages", maxParam)];
    return {
      kind: "chat",
      id: randomId("chatcmpl"),
      created: Math.floor(Date.now() / 1000),
      model,
      stream: body.stream ?? false,
      includeUsage: body.stream_options?.include_usage ?? false,
      continuousUsage: body.stream_options?.continuous_usage_stats ?? false,
      prompts: [ids],
      n: body.n ?? 1,
      params,
      priority: body.priority ?? 0,
      logprobs: logprobs !== null,
    };
  }

  /** Token text for logprobs (a lone piece of a multi-byte character decodes to U+FFFD). */
  function tokenText(id: number): string {
    return engine.tokenizer === null ? `token_id:${id}` : engine.tokenizer.decode([id]);
  }

  function completionLogprobs(lps: readonly TokenLogprob[], offset: number) {
    const tokens: string[] = [];
    const tokenLogprobs: number[] = [];
    const top: Record<string, number>[] = [];
    const textOffset: number[] = [];
    let pos = offset;
    for (const lp of lps) {
      const t = tokenText(lp.tokenId);
      tokens.push(t);
      tokenLogprobs.push(lp.logprob);
      const entry: Record<string, number> = {};
      for (const alt of lp.top ?? []) entry[tokenText(alt.tokenId)] = alt.logprob;
      entry[t] = lp.logprob;
      top.push(entry);
      textOffset.push(pos);
      pos += t.length;
    }
    return { tokens, token_logprobs: tokenLogprobs, top_logprobs: top, text_offset: textOffset };
  }

  function chatLogprobs(lps: readonly TokenLogprob[]) {
    const item = (id: number, logprob: number) => {
      const token = tokenText(id);
      return { token, logprob, bytes: [...encoder.encode(token)] };
    };
    return {
      content: lps.map((lp) => ({
        ...item(lp.tokenId, lp.logprob),
        top_logprobs: (lp.top ?? []).map((alt) => item(alt.tokenId, alt.logprob)),
      })),
    };
  }

  function usageOf(prep: Prepared, runs: readonly ChoiceRun[]): Usage {
    const prompt = prep.prompts.reduce((a, p) => a + p.length, 0);
    const completion = runs.reduce((a, r) => a + r.outputTokens, 0);
    return {
      prompt_tokens: prompt,
      completion_tokens: completion,
      total_tokens: prompt + completion,
    };
  }

  /** Starts every choice's engine request and waits for their first outputs. */
  async function launch(prep: Prepared, ac: AbortController): Promise<ChoiceRun[]> {
    const arrival = performance.now();
    const runs: ChoiceRun[] = [];
    try {
      prep.prompts.forEach((ids, p) => {
        const base = prep.params[p]!;
        for (let i = 0; i < prep.n; i++) {
          const index = p * prep.n + i;
          const params = base.seed !== null && index > 0
            ? { ...base, seed: base.seed + index }
            : base;
          const run = new ChoiceRun(
            index,
            `${prep.id}-${index}`,
            ids.length,
            prep.logprobs,
            arrival,
          );
          run.start(engine, params, ids, prep.priority, ac.signal);
          runs.push(run);
        }
      });
      await Promise.all(runs.map((r) => r.prime()));
      return runs;
    } catch (e) {
      ac.abort();
      await Promise.all(runs.map((r) => r.cancel(engine)));
      throw e;
    }
  }

  async function completeNonStreaming(prep: Prepared, runs: ChoiceRun[]): Promise<Response> {
    await Promise.all(runs.map(async (r) => {
      while ((await r.next()) !== null) { /* accumulate */ }
      r.observe(metrics);
    }));
    if (runs.some((r) => r.finishReason === "abort" || r.finishReason === null)) throw aborted();
    const choices = runs.map((r) => {
      const finish = r.finishReason === "abort" ? null : r.finishReason;
      if (prep.kind === "chat") {
        return {
          index: r.index,
          message: { role: "assistant", content: r.text },
          logprobs: r.logprobs ? chatLogprobs(r.tokenLogprobs) : null,
          finish_reason: finish,
          stop_reason: r.stopReason,
        };
      }
      return {
        index: r.index,
        text: r.text,
        logprobs: r.logprobs ? completionLogprobs(r.tokenLogprobs, 0) : null,
        finish_reason: finish,
        stop_reason: r.stopReason,
      };
    });
    return Response.json({
      id: prep.id,
      object: prep.kind === "chat" ? "chat.completion" : "text_completion",
      created: prep.created,
      model: prep.model,
      choices,
      usage: usageOf(prep, runs),
    });
  }

  function completeStreaming(
    prep: Prepared,
    runs: ChoiceRun[],
    ac: AbortController,
    done: () => void,
  ): Response {
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
            controller.enqueue(sse(data));
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
          for (;;) {
            const out = await r.next();
            if (out === null || closed) break;
            const reason = out.finishReason === "abort" ? null : out.finishReason;
            const hasLogprobs = r.logprobs && out.logprobs !== null && out.logprobs.length > 0;
            if (out.text === "" && reason === null && !hasLogprobs) continue;
            const lps = out.logprobs ?? [];
            const choice = prep.kind === "chat"
              ? {
                index: r.index,
                delta: out.text === "" ? {} : { content: out.text },
                logprobs: r.logprobs ? chatLogprobs(lps) : null,
                finish_reason: reason,
                stop_reason: out.finishReason === null ? undefined : out.stopReason,
              }
              : {
                index: r.index,
                text: out.text,
                logprobs: r.logprobs ? completionLogprobs(lps, offset) : null,
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
              send(aborted().body());
            } else if (prep.includeUsage) {
              send({ ...head, choices: [], usage: usageOf(prep, runs) });
            }
            send("[DONE]");
          },
          (e: unknown) => {
            const err = toApiError(e, retryAfter) ?? internal(e);
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

  function aborted(): ApiError {
    return new ApiError(
      503,
      draining
        ? "The request was aborted: the server is shutting down"
        : "The request was aborted before it finished",
      { code: "request_aborted" },
    );
  }

  function internal(e: unknown): ApiError {
    onError(e);
    const what = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
    return new ApiError(500, `Internal server error (${what})`, { code: "internal_error" });
  }

  /** Tracks a response as in flight; the request's signal aborts it on disconnect. */
  function track(req: Request): { ac: AbortController; done: () => void } {
    const ac = new AbortController();
    inFlight.add(ac);
    const onAbort = () => ac.abort();
    req.signal.addEventListener("abort", onAbort, { once: true });
    let released = false;
    return {
      ac,
      done: () => {
        if (released) return;
        released = true;
        req.signal.removeEventListener("abort", onAbort);
        release(ac);
      },
    };
  }

  async function generateEndpoint(req: Request, kind: "chat" | "completion"): Promise<Response> {
    checkAvailable();
    const json = await readJson(req, maxBody);
    const prep = kind === "chat"
      ? prepareChat(parseBody(chatRequestSchema, json))
      : prepareCompletion(parseBody(completionRequestSchema, json));
    const { ac, done } = track(req);
    let streaming = false;
    try {
      const runs = await launch(prep, ac);
      if (prep.stream) {
        streaming = true;
        return completeStreaming(prep, runs, ac, done);
      }
      try {
        return await completeNonStreaming(prep, runs);
      } catch (e) {
        ac.abort();
        await Promise.all(runs.map((r) => r.cancel(engine)));
        for (const r of runs) r.observe(metrics);
        throw e;
      }
    } finally {
      if (!streaming) done();
    }
  }

  async function tokenizeEndpoint(req: Request): Promise<Response> {
    const body = parseBody(tokenizeRequestSchema, await readJson(req, maxBody));
    checkModel(body.model);
    let tokens: number[];
    if ((body.prompt === undefined) === (body.messages === undefined)) {
      throw new ApiError(400, "Give exactly one of 'prompt' and 'messages'", {
        param: body.prompt === undefined ? "prompt" : "messages",
        code: body.prompt === undefined ? "missing_required_parameter" : "invalid_value",
      });
    }
    if (body.prompt !== undefined) {
      tokens = tokenizer("prompt").encode(body.prompt, {
        addSpecialTokens: body.add_special_tokens ?? true,
      });
    } else {
      const tok = tokenizer("messages");
      const text = tok.applyChatTemplate(chatMessages(body.messages ?? []), {
        addGenerationPrompt: body.add_generation_prompt ?? true,
        extra: body.chat_template_kwargs ?? {},
      });
      tokens = tok.encode(text, { addSpecialTokens: body.add_special_tokens ?? false });
    }
    return Response.json({ count: tokens.length, max_model_len: maxModelLen(), tokens });
  }

  async function detokenizeEndpoint(req: Request): Promise<Response> {
    const body = parseBody(detokenizeRequestSchema, await readJson(req, maxBody));
    checkModel(body.model);
    return Response.json({ prompt: tokenizer("tokens").decode(body.tokens) });
  }

  async function batchTestEndpoint(req: Request): Promise<Response> {
    if (options.batchTest === undefined) {
      throw new ApiError(501, "/batch/test is not enabled on this server", {
        code: "not_implemented",
      });
    }
    if (draining) {
      throw new ApiError(503, "The server is shutting down", { code: "server_shutting_down" });
    }
    const body = parseBody(batchTestRequestSchema, await readJson(req, maxBody));
    const { ac, done } = track(req);
    try {
      return Response.json(await runBatchTest(options.batchTest, body, ac.signal));
    } finally {
      done();
    }
  }

  function modelsEndpoint(): Response {
    return Response.json({
      object: "list",
      data: names.map((id) => ({
        id,
        object: "model",
        created: startedAt,
        owned_by: "webgpu-llm",
        root: engine.model.name,
        parent: null,
        max_model_len: maxModelLen(),
        permission: [],
      })),
    });
  }

  function healthy(): boolean {
    return ready && !draining && engine.error === null;
  }

  function metricsEndpoint(): Response {
    let text: string;
    try {
      text = metrics.render(engine.stats());
    } catch {
      text = metrics.registry.format();
    }
    return new Response(text, { headers: { "content-type": PROMETHEUS_CONTENT_TYPE } });
  }

  async function route(req: Request): Promise<Response> {
    const path = new URL(req.url).pathname;
    const methods = ROUTES[path];
    if (methods === undefined) {
      throw new ApiError(404, `Not found: ${req.method} ${path}`, { code: "not_found" });
    }
    if (!methods.includes(req.method)) {
      throw new ApiError(405, `Method ${req.method} is not allowed on ${path}`, {
        code: "method_not_allowed",
        headers: { allow: methods.join(", ") },
      });
    }
    switch (path) {
      case "/v1/completions":
        return await generateEndpoint(req, "completion");
      case "/v1/chat/completions":
        return await generateEndpoint(req, "chat");
      case "/v1/models":
        return modelsEndpoint();
      case "/health":
        return new Response(null, { status: healthy() ? 200 : 503 });
      case "/metrics":
        return metricsEndpoint();
      case "/tokenize":
        return await tokenizeEndpoint(req);
      case "/detokenize":
        return await detokenizeEndpoint(req);
      default:
        return await batchTestEndpoint(req);
    }
  }

  async function handler(req: Request): Promise<Response> {
    try {
      return await route(req);
    } catch (e) {
      return errorResponse(toApiError(e, retryAfter) ?? internal(e));
    }
  }

  return {
    handler,
    metrics,
    get ready() {
      return healthy();
    },
    setReady(value: boolean) {
      ready = value;
    },
    get draining() {
      return draining;
    },
    get inFlight() {
      return inFlight.size;
    },
    async drain(graceMs: number) {
      draining = true;
      if (inFlight.size > 0) {
        let timer: ReturnType<typeof setTimeout> | undefined;
        await new Promise<void>((resolve) => {
          idle = resolve;
          timer = setTimeout(resolve, Math.max(0, graceMs));
        });
        clearTimeout(timer);
      }
      if (inFlight.size > 0) {
        await new Promise<void>((resolve) => {
          idle = resolve;
          for (const ac of inFlight) ac.abort();
        });
      }
      idle = null;
    },
  };
}

/** Options of {@linkcode startServer}. */
export interface StartServerOptions extends ServerOptions {
  /** Interface to listen on. Default "127.0.0.1". */
  host?: string;
  /** Port; 0 picks a free one. Default 8000. */
  port?: number;
  /** Called once listening, with the base URL. */
  onListen?: (url: string) => void;
}

/** A listening server. */
export interface RunningServer {
  /** Base URL, e.g. `http://127.0.0.1:8000`. */
  readonly url: string;
  readonly port: number;
  /** The handler and its state (metrics, readiness). */
  readonly handle: ServerHandler;
  /** Resolves when the listener has closed. */
  readonly finished: Promise<void>;
  /**
   * Graceful shutdown: new inference requests get 503, in-flight ones may finish for up to
   * `graceMs` (default 5000), the rest are aborted, then the listener closes. The engine is not
   * shut down (call `engine.shutdown()` afterwards).
   */
  shutdown(graceMs?: number): Promise<void>;
}

/** Serves {@linkcode createHandler}'s handler with `Deno.serve`. */
export function startServer(engine: EngineClient, options: StartServerOptions = {}): RunningServer {
  const handle = createHandler(engine, options);
  const hostname = options.host ?? "127.0.0.1";
  const server = Deno.serve({
    hostname,
    port: options.port ?? 8000,
    onListen: () => {},
  }, handle.handler);
  const port = server.addr.port;
  const host = hostname.includes(":") ? `[${hostname}]` : hostname;
  const url = `http://${host}:${port}`;
  options.onListen?.(url);
  let stopping: Promise<void> | null = null;
  return {
    url,
    port,
    handle,
    finished: server.finished,
    shutdown(graceMs = 5000) {
      stopping ??= (async () => {
        await handle.drain(graceMs);
        await server.shutdown();
      })();
      return stopping;
    },
  };
}
