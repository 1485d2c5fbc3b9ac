/**
 * Per-request output processing: turns the token ids the scheduler produces into the
 * {@linkcode RequestOutput} increments a client streams. It detokenizes incrementally (special
 * tokens skipped unless `skipSpecialTokens` is false, vLLM's `skip_special_tokens`), searches
 * the text for the request's stop strings, holds back text that may still become a stop string,
 * and attaches log-probabilities and token counts.
 *
 * The engine keeps one {@linkcode RequestOutputState} per request:
 *
 * ```ts
 * const state = new RequestOutputState(tokenizer, request);
 * // each step, for each request with new tokens:
 * const { output, stopString } = state.push(newIds, newLogprobs);
 * if (output !== null) stream(output);
 * if (stopString !== null) scheduler.finishRequest(id, "stop", stopString); // then:
 * // when the scheduler (or a stop string, or an abort) finished the request:
 * stream(state.finish(reason, stopReason)); // exactly one increment with finishReason
 * ```
 *
 * Text rules (vLLM / OpenAI semantics):
 * - The concatenation of all increments' `text` is
 *   `decode(outputIds, { skipSpecialTokens, cleanUpTokenizationSpaces: false })` (the
 *   request's, true by default) less the text of a token that ended the request, cut
 *   before the stop string that matched (if one did; with `includeStopStrInOutput`, after it).
 *   An increment never ends inside a UTF-8 character (see engine/detokenizer.ts).
 * - Hold-back: the longest suffix of the text that is a proper prefix of some stop string is not
 *   emitted until more text shows whether it completes the stop string. With stop
 *   `["\n\nUser:"]`, the text `"Hi\n\nUs"` emits `"Hi"` and holds `"\n\nUs"`. With
 *   `includeStopStrInOutput` nothing is held back (the text up to the stop string's end is
 *   emitted whether or not it completes), as vLLM does.
 * - Matching: a stop string may span several tokens and start or end in the middle of a token's
 *   text. The first stop string to be completed wins (smallest end offset in the text; on a tie,
 *   the one that starts first, i.e. the longest): the text is cut where it starts, so it is
 *   independent of how the text was split into tokens or pushes. Each push searches only the
 *   new text plus the held-back text (at most the longest stop string minus one character).
 * - `minTokens`: a stop string only counts when it is completed by the text of output token
 *   number `minTokens` or later (like EOS in scheduler/stop_checker.ts; vLLM ignores stop
 *   strings until min_tokens are generated). A stop string lying wholly in earlier text is text.
 * - Empty stop strings are ignored. With a null tokenizer (mock engine) the text is always ""
 *   and stop strings are never matched; only token ids flow.
 *
 * Token rules:
 * - `tokenIds` holds every token the scheduler produced, including EOS and stop token ids (the
 *   text of the token that ended the request is left out, pushed with `stopToken`, unless
 *   `includeStopStrInOutput`, as vLLM v1 does), except tokens pushed after the token that
 *   completed a stop string: those are dropped (never emitted, not counted). `numOutputTokens`
 *   counts the tokens emitted so far, including the increment's own.
 * - Increments: with a tokenizer, {@linkcode RequestOutputState.push} returns an increment only
 *   when it has new text (tokens whose text is held back, incomplete, or empty ride along with the
 *   next increment that has text, or with the final one); set `emitTokenOnly` to get an increment
 *   for every push with tokens, as vLLM does. With a null tokenizer every push with tokens
 *   returns an increment.
 *
 * @module
 */

import type { FinishReason, PromptLogprob, RequestOutput, TokenLogprob } from "./engine_api.ts";
import type { SamplingParams } from "../scheduler/sampling_params.ts";
import type { Tokenizer } from "./tokenizer.ts";
import { IncrementalDetokenizer } from "./detokenizer.ts";

/** The request fields {@linkcode RequestOutputState} needs. */
export interface OutputRequest {
  readonly requestId: string;
  /** Prompt token ids (its last few decode as left context; its length is `numPromptTokens`). */
  readonly promptTokenIds: readonly number[];
  /**
   * Sampling parameters: `stop`, `includeStopStrInOutput`, `skipSpecialTokens`, `minTokens` and
   * `logprobs` are read.
   */
  readonly params: SamplingParams;
}

/** Options of {@linkcode RequestOutputState}. */
export interface OutputStateOptions {
  /**
   * Return an increment for every push that adds tokens, even when its text is empty (held back,
   * an unfinished character, special tokens), as vLLM's streaming does. Default false: such
   * tokens are carried into the next increment that has text (or the final one).
   */
  emitTokenOnly?: boolean;
  /** Prompt tokens found in the prefix cache; can also be set later through the property. */
  numCachedTokens?: number;
}

/** What {@linkcode RequestOutputState.push} returns. */
export interface PushResult {
  /** The increment to stream now, or null when there is nothing to emit yet. */
  readonly output: RequestOutput | null;
  /**
   * The stop string this push completed, or null. When set, the engine must finish the request
   * (reason "stop") and call {@linkcode RequestOutputState.finish}, whose increment carries the
   * text up to the stop string (`output` is null then, so the stream's last text and its
   * finish reason arrive together).
   */
  readonly stopString: string | null;
}

/** A stop string match in the search buffer. */
interface Match {
  readonly start: number;
  readonly end: number;
  readonly stop: string;
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}

/** Streams one request's output as {@linkcode RequestOutput} increments (see module doc). */
export class RequestOutputState {
  readonly requestId: string;
  /** Prompt tokens found in the prefix cache (set by the engine once the request is admitted). */
  numCachedTokens: number;
  /** Seconds from arrival to the first scheduling (set by the engine then); null before. */
  queueTime: number | null = null;

  readonly #detok: IncrementalDetokenizer | null;
  readonly #stops: readonly string[];
  readonly #maxStopLen: number;
  /** `includeStopStrInOutput`: the matched stop string ends the text; nothing is held back. */
  readonly #keepStop: boolean;
  readonly #minTokens: number;
  readonly #wantLogprobs: boolean;
  readonly #emitTokenOnly: boolean;
  readonly #numPromptTokens: number;
  /**
   * With `params.promptLogprobs`: each prompt token's log-probability (null for the first, and
   * until scored), sent with the first increment; null without them or once sent.
   */
  #promptLogprobs: (PromptLogprob | null)[] | null;

  /** Detokenized text not emitted yet because it may be the start of a stop string. */
  #held = "";
  /**
   * With `includeStopStrInOutput`: the last characters already passed on (at most the longest
   * stop string minus one), searched with the new text, since nothing is held back.
   */
  #tail = "";
  /** Text, tokens and logprobs accumulated for the next increment. */
  #text = "";
  #tokens: number[] = [];
  #logprobs: TokenLogprob[] = [];
  /** Output tokens accepted so far (emitted or pending). */
  #numOutput = 0;
  /** The stop string that matched, once one did. */
  #stopString: string | null = null;
  #finished = false;

  /**
   * @param tokenizer the model's tokenizer, or null (mock engine: no text, no stop strings).
   * @param request the request's id, prompt ids and sampling parameters.
   */
  constructor(
    tokenizer: Tokenizer | null,
    request: OutputRequest,
    options: OutputStateOptions = {},
  ) {
    this.requestId = request.requestId;
    this.numCachedTokens = options.numCachedTokens ?? 0;
    this.#emitTokenOnly = options.emitTokenOnly ?? false;
    this.#numPromptTokens = request.promptTokenIds.length;
    this.#promptLogprobs = (request.params.promptLogprobs ?? null) === null
      ? null
      : new Array<PromptLogprob | null>(this.#numPromptTokens).fill(null);
    this.#minTokens = request.params.minTokens;
    this.#wantLogprobs = request.params.logprobs !== null;
    this.#detok = tokenizer === null ? null : new IncrementalDetokenizer(tokenizer, {
      skipSpecialTokens: request.params.skipSpecialTokens,
      promptIds: request.promptTokenIds,
    });
    this.#stops = tokenizer === null ? [] : [...new Set(request.params.stop)].filter((s) => s);
    this.#maxStopLen = this.#stops.reduce((m, s) => Math.max(m, s.length), 0);
    this.#keepStop = request.params.includeStopStrInOutput;
  }

  /** Output tokens accepted so far (the `numOutputTokens` of the next increment, before it). */
  get numOutputTokens(): number {
    return this.#numOutput;
  }

  /** The stop string that matched, or null. */
  get stopString(): string | null {
    return this.#stopString;
  }

  /** Whether {@linkcode finish} was called. */
  get finished(): boolean {
    return this.#finished;
  }

  /**
   * Feeds output tokens that became known, in order, with their log-probabilities (one per
   * token, required when `params.logprobs` is not null, ignored otherwise). Tokens pushed after a
   * stop string matched are ignored (a pipelined engine may still have some in flight).
   * `stopToken`: the last token ended the request (EOS or one of `stop_token_ids`, the
   * scheduler's "stop"); it counts as an output token but its text is left out, unless
   * `includeStopStrInOutput` (vLLM's rule).
   *
   * @throws {RangeError} after {@linkcode finish}, or when `logprobs` does not align with
   *   `tokenIds`.
   */
  push(
    tokenIds: readonly number[],
    logprobs: readonly TokenLogprob[] | null,
    stopToken = false,
  ): PushResult {
    if (this.#finished) {
      throw new RangeError(`Cannot push to request ${this.requestId}: it is finished`);
    }
    if (this.#stopString !== null) return { output: null, stopString: null };
    const textBefore = this.#text.length;
    const tokensBefore = this.#tokens.length;
    const stop = this.#accept(tokenIds, logprobs, stopToken && !this.#keepStop);
    if (stop !== null) return { output: null, stopString: stop };
    const hasText = this.#text.length > textBefore;
    const hasTokens = this.#tokens.length > tokensBefore;
    const emit = hasText || (hasTokens && (this.#detok === null || this.#emitTokenOnly));
    return { output: emit ? this.#increment(null, null) : null, stopString: null };
  }

  /**
   * The request finished: returns the last increment, the only one with a `finishReason`. Held
   * back text is flushed (it did not become a stop string), also on "abort": an aborted
   * request's text is everything decoded so far, minus any completed stop string. `tokenIds`
   * (and `logprobs`), when given, are pushed first, so the last tokens and the finish travel in
   * one increment.
   *
   * When a stop string matched (in a push, in `tokenIds`, or in the text flushed now), the
   * increment says `finishReason: "stop"`, `stopReason: <the stop string>`, whatever the
   * arguments say. Otherwise it carries `reason` and `stopReason` as given (the scheduler's: a
   * stop token id, or null for EOS and length).
   *
   * @throws {RangeError} when called twice, or when `logprobs` does not align with `tokenIds`.
   */
  finish(
    reason: FinishReason,
    stopReason: number | string | null,
    tokenIds: readonly number[] = [],
    logprobs: readonly TokenLogprob[] | null = null,
  ): RequestOutput {
    if (this.#finished) {
      throw new RangeError(`Cannot finish request ${this.requestId}: it is already finished`);
    }
    if (this.#stopString === null && tokenIds.length > 0) this.#accept(tokenIds, logprobs);
    this.#finished = true;
    if (this.#stopString === null && this.#detok !== null) {
      // Flush the detokenizer (an unfinished character decodes to U+FFFD, as in a full decode),
      // then release the held text: nothing can complete a stop string any more.
      this.#feedText(this.#detok.finish());
      if (this.#stopString === null) {
        this.#text += this.#held;
        this.#held = "";
      }
    }
    if (this.#stopString !== null) return this.#increment("stop", this.#stopString);
    return this.#increment(reason, stopReason);
  }

  /**
   * Accepts tokens until one completes a stop string; returns that stop string or null. With
   * `lastTextless`, the last token is taken without its text.
   */
  #accept(
    tokenIds: readonly number[],
    logprobs: readonly TokenLogprob[] | null,
    lastTextless = false,
  ): string | null {
    if (this.#wantLogprobs) {
      if (logprobs === null || logprobs.length !== tokenIds.length) {
        throw new RangeError(
          `Cannot push to request ${this.requestId}: ${tokenIds.length} tokens but ${
            logprobs === null ? "no" : logprobs.length
          } logprobs (params.logprobs is set)`,
        );
      }
      for (let i = 0; i < tokenIds.length; i++) {
        if (logprobs[i]!.tokenId !== tokenIds[i]) {
          throw new RangeError(
            `Cannot push to request ${this.requestId}: logprob ${i} is for token ${
              logprobs[i]!.tokenId
            }, token is ${tokenIds[i]}`,
          );
        }
      }
    }
    for (let i = 0; i < tokenIds.length; i++) {
      const id = tokenIds[i]!;
      this.#tokens.push(id);
      if (this.#wantLogprobs) this.#logprobs.push(logprobs![i]!);
      this.#numOutput++;
      if (this.#detok === null || (lastTextless && i === tokenIds.length - 1)) continue;
      this.#feedText(this.#detok.push(id));
      if (this.#stopString !== null) return this.#stopString;
    }
    return null;
  }

  /**
   * Appends detokenized text: searches `held + delta` for a stop string completed inside
   * `delta` (when `minTokens` is reached), then moves everything but the new hold-back suffix to
   * the pending increment text. O(|stops| * (|delta| + maxStopLen)) per call.
   */
  #feedText(delta: string): void {
    if (delta === "") return;
    if (this.#keepStop) {
      this.#feedKeepingStop(delta);
      return;
    }
    const buf = this.#held + delta;
    if (this.#numOutput >= this.#minTokens) {
      const match = this.#firstMatch(buf, this.#held.length);
      if (match !== null) {
        this.#text += buf.slice(0, match.start);
        this.#held = "";
        this.#stopString = match.stop;
        return;
      }
    }
    const hold = this.#holdLength(buf);
    this.#text += buf.slice(0, buf.length - hold);
    this.#held = buf.slice(buf.length - hold);
  }

  /**
   * `#feedText` with `includeStopStrInOutput`: `delta` is passed on whole, unless a stop
   * string completes in it (searched in the tail of the earlier text plus `delta`); then it is
   * cut after that stop string.
   */
  #feedKeepingStop(delta: string): void {
    const buf = this.#tail + delta;
    if (this.#numOutput >= this.#minTokens) {
      const match = this.#firstMatch(buf, this.#tail.length);
      if (match !== null) {
        this.#text += buf.slice(this.#tail.length, match.end);
        this.#stopString = match.stop;
        return;
      }
    }
    this.#text += delta;
    this.#tail = buf.slice(Math.max(0, buf.length - (this.#maxStopLen - 1)));
  }

  /** The first stop string completed in `buf` after offset `from` (smallest end, then start). */
  #firstMatch(buf: string, from: number): Match | null {
    let best: Match | null = null;
    for (const stop of this.#stops) {
      // The first occurrence ending after `from` is the one with the smallest end.
      const start = buf.indexOf(stop, Math.max(0, from - stop.length + 1));
      if (start < 0) continue;
      const end = start + stop.length;
      if (best === null || end < best.end || (end === best.end && start < best.start)) {
        best = { start, end, stop };
      }
    }
    return best;
  }

  /** Length of the longest suffix of `buf` that is a proper prefix of some stop string. */
  #holdLength(buf: string): number {
    let hold = 0;
    const limit = Math.min(this.#maxStopLen - 1, buf.length);
    for (const stop of this.#stops) {
      for (let k = Math.min(stop.length - 1, limit); k > hold; k--) {
        if (buf.endsWith(stop.slice(0, k))) {
          hold = k;
          break;
        }
      }
    }
    // Never cut a surrogate pair (only possible with a malformed stop string).
    if (hold > 0 && hold < buf.length && isHighSurrogate(buf.charCodeAt(buf.length - hold - 1))) {
      hold++;
    }
    return hold;
  }

  /**
   * Records scored prompt tokens (`position` >= 1 in the prompt) for the first increment; ignored
   * once that is built, or without `params.promptLogprobs`.
   *
   * @throws {RangeError} for a position outside the prompt.
   */
  scorePrompt(tokens: readonly (PromptLogprob & { readonly position: number })[]): void {
    const list = this.#promptLogprobs;
    if (list === null) return;
    for (const { position, ...entry } of tokens) {
      if (!Number.isInteger(position) || position < 1 || position >= list.length) {
        throw new RangeError(
          `Cannot score prompt position ${position} of request ${this.requestId}: its prompt has ${list.length} tokens`,
        );
      }
      list[position] = entry;
    }
  }

  /** Builds an increment from the pending text and tokens and clears them. */
  #increment(finishReason: FinishReason | null, stopReason: number | string | null): RequestOutput {
    const output: RequestOutput = {
      requestId: this.requestId,
      tokenIds: this.#tokens,
      text: this.#text,
      logprobs: this.#wantLogprobs ? this.#logprobs : null,
      ...(this.#promptLogprobs === null ? {} : { promptLogprobs: this.#promptLogprobs }),
      finishReason,
      stopReason: finishReason === null ? null : stopReason,
      numPromptTokens: this.#numPromptTokens,
      numOutputTokens: this.#numOutput,
      numCachedTokens: this.numCachedTokens,
      ...(this.queueTime === null ? {} : { queueTime: this.queueTime }),
    };
    this.#tokens = [];
    this.#logprobs = [];
    this.#text = "";
    this.#promptLogprobs = null;
    return output;
  }
}
