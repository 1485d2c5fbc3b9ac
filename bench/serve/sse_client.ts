/**
 * A streaming client for OpenAI-compatible `POST /v1/completions` that timestamps every
 * Server-Sent-Events chunk as it arrives (TTFT, inter-token gaps, end-to-end latency).
 *
 * Protocol expected from the server: status 200, `data: {json}` events separated by blank lines,
 * each chunk `{"choices": [{"text": "..."}], ...}`, with `stream_options.include_usage` one chunk
 * carrying `usage` (and empty `choices`) before the final `data: [DONE]`. A chunk
 * `{"error": {"message": ...}}` or a non-200 status fails the request with that message.
 *
 * @module
 */

import type { RequestResult } from "./metrics.ts";

/**
 * Incremental Server-Sent-Events parser: feed decoded text in arbitrary pieces, get back the
 * `data` payload of every complete event (multi-line data joined with "\n"). Lines may end with
 * LF, CRLF or CR; comment lines (":...") and other fields are ignored.
 */
export class SseParser {
  #buffer = "";
  #data: string[] = [];

  /** Adds text; returns the payloads of the events it completed. */
  push(text: string): string[] {
    this.#buffer += text;
    const events: string[] = [];
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.#buffer);
      if (m === null) break;
      // A lone CR at the very end may be the first half of CRLF: wait for more text.
      if (m[0] === "\r" && m.index === this.#buffer.length - 1) break;
      const line = this.#buffer.slice(0, m.index);
      this.#buffer = this.#buffer.slice(m.index + m[0].length);
      this.#line(line, events);
    }
    return events;
  }

  /** Flushes at end of stream: a final event without its blank line still counts. */
  end(): string[] {
    const events: string[] = [];
    if (this.#buffer !== "") this.#line(this.#buffer.replace(/\r$/, ""), events);
    this.#buffer = "";
    this.#line("", events);
    return events;
  }

  #line(line: string, events: string[]): void {
    if (line === "") {
      if (this.#data.length > 0) events.push(this.#data.join("\n"));
      this.#data = [];
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.#data.push(value);
  }
}

/** One streamed completion request. */
export interface CompletionRequest {
  /** Server base URL, e.g. "http://127.0.0.1:8000" (no trailing "/v1"). */
  readonly baseUrl: string;
  /** The `model` field sent. */
  readonly model: string;
  /** A string, or an array of token ids (uint32 values). */
  readonly prompt: string | readonly number[];
  /** Planned prompt length in tokens (used when the server reports no usage). */
  readonly promptTokens: number;
  readonly maxTokens: number;
  /** vLLM's `ignore_eos`: generate exactly `maxTokens` tokens. */
  readonly ignoreEos: boolean;
  readonly temperature: number;
  /** Whole-request deadline in milliseconds (connect, headers and the full stream). */
  readonly timeoutMs: number;
  /** Extra fields merged into the JSON body. */
  readonly extraBody?: Readonly<Record<string, unknown>>;
}

/** What {@linkcode streamCompletion} returns: a {@linkcode RequestResult} with the text. */
export interface StreamOutcome extends RequestResult {
  /** Concatenated streamed text. */
  readonly text: string;
}

/** The JSON body sent for `req`. */
export function completionBody(req: CompletionRequest): Record<string, unknown> {
  return {
    model: req.model,
    prompt: typeof req.prompt === "string" ? req.prompt : [...req.prompt],
    max_tokens: req.maxTokens,
    temperature: req.temperature,
    ignore_eos: req.ignoreEos,
    stream: true,
    stream_options: { include_usage: true },
    ...req.extraBody,
  };
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The server's error message from an OpenAI-style `{"error": {"message"}}` body, if any. */
function errorMessage(v: unknown): string | undefined {
  if (!isRecord(v)) return undefined;
  const e = v.error;
  if (typeof e === "string") return e;
  if (isRecord(e) && typeof e.message === "string") return e.message;
  if (typeof v.message === "string") return v.message;
  return undefined;
}

function oneLine(s: string, max = 300): string {
  const flat = s.replace(/\s+/g, " ").trim();
  return flat.length > max ? `${flat.slice(0, max)}...` : flat;
}

/** The message of a non-200 answer: the status and the server's message (or body). */
async function httpError(res: Response): Promise<string> {
  const body = await res.text();
  let message: string | undefined;
  try {
    message = errorMessage(JSON.parse(body));
  } catch {
    message = undefined;
  }
  return `HTTP ${res.status}: ${oneLine(message ?? (body || res.statusText))}`;
}

/** A stream's chunks as they arrive: their times, the text, the usage chunk, `[DONE]`. */
class StreamRecord {
  /** Send time, a `performance.now()` value. */
  readonly t0: number;
  /** Send to the first chunk carrying a choice; null until one arrives. */
  ttft: number | null = null;
  /** Gaps between consecutive chunks carrying a choice. */
  readonly itl: number[] = [];
  text = "";
  /** Chunks carrying a choice. */
  chunks = 0;
  usage: { prompt: number; completion: number } | undefined;
  /** Whether `data: [DONE]` arrived. */
  done = false;
  #last = 0;
  readonly #promptTokens: number;

  constructor(t0: number, promptTokens: number) {
    this.t0 = t0;
    this.#promptTokens = promptTokens;
  }

  /** Takes one event's payload; returns why it fails the request, if it does. */
  take(payload: string): string | undefined {
    if (payload.trim() === "[DONE]") {
      this.done = true;
      return undefined;
    }
    let chunk: unknown;
    try {
      chunk = JSON.parse(payload);
    } catch {
      return `invalid JSON in stream: ${oneLine(payload, 80)}`;
    }
    const err = isRecord(chunk) && "error" in chunk ? errorMessage(chunk) : undefined;
    if (err !== undefined) return `stream error: ${oneLine(err)}`;
    if (!isRecord(chunk)) return `unexpected chunk: ${oneLine(payload, 80)}`;
    const u = chunk.usage;
    if (isRecord(u) && typeof u.completion_tokens === "number") {
      this.usage = {
        completion: u.completion_tokens,
        prompt: typeof u.prompt_tokens === "number" ? u.prompt_tokens : this.#promptTokens,
      };
    }
    const choices = Array.isArray(chunk.choices) ? chunk.choices : [];
    const first: unknown = choices[0];
    const piece = isRecord(first) && typeof first.text === "string" ? first.text : "";
    // As `vllm bench serve`: every chunk carrying a choice marks token arrival, even when its
    // text is empty (special tokens, ids past a padded vocabulary, a partial UTF-8 character).
    if (isRecord(first)) {
      const now = performance.now();
      if (this.ttft === null) this.ttft = now - this.t0;
      else this.itl.push(now - this.#last);
      this.#last = now;
      this.chunks++;
      this.text += piece;
    }
    return undefined;
  }

  /** The outcome now: failed with `error`, or ok without one. */
  outcome(index: number, epochMs: number, error?: string): StreamOutcome {
    const e2e = performance.now() - this.t0;
    const ok = error === undefined;
    return {
      index,
      ok,
      ...(ok ? {} : { error }),
      startMs: this.t0 - epochMs,
      ttftMs: this.ttft,
      e2eMs: e2e,
      itlMs: this.itl,
      promptTokens: this.usage?.prompt ?? this.#promptTokens,
      outputTokens: this.usage?.completion ?? this.chunks,
      usageReported: this.usage !== undefined,
      text: this.text,
    };
  }
}

/**
 * Reads `body`'s events into `record` until `[DONE]` or the end of the stream; returns
 * `fail(why)` for the first event that fails the request (taken before the reader is
 * cancelled), else undefined.
 */
async function readEvents(
  body: ReadableStream<Uint8Array>,
  record: StreamRecord,
  fail: (why: string) => StreamOutcome,
): Promise<StreamOutcome | undefined> {
  const parser = new SseParser();
  const decoder = new TextDecoder();
  const reader = body.getReader();
  try {
    while (!record.done) {
      const { value, done: eof } = await reader.read();
      const payloads = eof ? parser.end() : parser.push(decoder.decode(value, { stream: true }));
      for (const p of payloads) {
        const err = record.take(p);
        if (err !== undefined) return fail(err);
        if (record.done) break;
      }
      if (eof) break;
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
  return undefined;
}

/**
 * Sends `req` with `stream: true` and times the stream. Never throws for server or network
 * problems: they come back as `ok: false` with `error`. `startMs` is relative to `epochMs`
 * (a `performance.now()` value, default 0); `index` is copied into the result.
 */
export async function streamCompletion(
  req: CompletionRequest,
  index = 0,
  epochMs = 0,
): Promise<StreamOutcome> {
  const timeout = AbortSignal.timeout(req.timeoutMs);
  const record = new StreamRecord(performance.now(), req.promptTokens);
  const finish = (error?: string) => record.outcome(index, epochMs, error);
  try {
    const url = `${req.baseUrl.replace(/\/+$/, "")}/v1/completions`;
    const res = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "text/event-stream" },
      body: JSON.stringify(completionBody(req)),
      signal: timeout,
    });
    if (res.status !== 200) return finish(await httpError(res));
    if (res.body === null) return finish("HTTP 200 with no body");
    const failed = await readEvents(res.body, record, finish);
    if (failed !== undefined) return failed;
    if (!record.done) return finish("stream ended without data: [DONE]");
    if (record.ttft === null) return finish("no tokens streamed");
    return finish();
  } catch (e) {
    if (timeout.aborted) return finish(`timed out after ${req.timeoutMs / 1000} s`);
    const message = e instanceof Error ? e.message : String(e);
    return finish(oneLine(message));
  }
}
