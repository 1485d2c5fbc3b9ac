/**
 * Incremental detokenization for streaming: feed generated token ids one at a time and get the
 * new text each one adds.
 *
 * Decoding token by token is wrong for byte-level vocabularies: a Chinese character or an emoji
 * is often split across tokens, and each part alone decodes to U+FFFD. Decoding the whole
 * sequence at every step is right but O(n) per token. This uses the prefix-offset / read-offset
 * technique (as in vLLM and TGI): only a small window `ids[prefixOffset:]` is decoded each step;
 * `ids[prefixOffset:readOffset]` is text already sent, and the delta is what the window's text
 * adds to it. While the window's text ends with U+FFFD (an unfinished UTF-8 sequence) nothing is
 * sent and the offsets stay, so a character is never split.
 *
 * Invariant: the concatenation of all deltas plus {@linkcode IncrementalDetokenizer.finish} equals
 * `tokenizer.decode(ids, { skipSpecialTokens, cleanUpTokenizationSpaces: false })` (clean-up of
 * tokenization spaces is not applied: it is not incremental).
 *
 * A run of tokens that keeps the text ending in U+FFFD for other reasons (the model writing the
 * real character U+FFFD, or invalid byte sequences) would make the window grow; after
 * {@linkcode MAX_PENDING} such tokens the detokenizer looks for a token boundary that is also a
 * character boundary (decoding both sides separately gives the same text as decoding them
 * together, and the right side decodes to some text, so the left side's last character is
 * closed) and advances to it, so the cost per token stays bounded.
 *
 * @module
 */

import type { Tokenizer } from "./tokenizer.ts";

/** Tokens held back before looking for a character boundary inside the pending tokens. */
export const MAX_PENDING = 8;

/** Prompt tokens decoded as left context (for decoders whose output depends on it). */
const PROMPT_CONTEXT = 5;

const REPLACEMENT = "\uFFFD";

/** Options of {@linkcode IncrementalDetokenizer}. */
export interface DetokenizerOptions {
  /** Leave special tokens out of the text. Default false. */
  skipSpecialTokens?: boolean;
  /**
   * The prompt's ids: its last few tokens are decoded as context (never emitted), as some
   * decoders (SentencePiece) drop a leading space at the very start of a text.
   */
  promptIds?: readonly number[];
}

/** Streams the text of a growing id sequence (see module doc). One instance per sequence. */
export class IncrementalDetokenizer {
  readonly #tokenizer: Pick<Tokenizer, "decode">;
  readonly #skipSpecial: boolean;
  /** Context ids followed by the generated ids. */
  readonly #ids: number[] = [];
  /** Number of context (prompt) ids at the start of #ids. */
  readonly #context: number;
  #prefixOffset = 0;
  #readOffset = 0;
  /** Length of decode(ids[prefixOffset:readOffset]): text of the window already sent. */
  #sent = 0;
  #finished = false;

  /**
   * @param tokenizer the sequence's tokenizer (only `decode` is used).
   */
  constructor(tokenizer: Pick<Tokenizer, "decode">, options: DetokenizerOptions = {}) {
    this.#tokenizer = tokenizer;
    this.#skipSpecial = options.skipSpecialTokens ?? false;
    const prompt = options.promptIds ?? [];
    const context = prompt.slice(Math.max(0, prompt.length - PROMPT_CONTEXT));
    // A prompt ending mid-character is no boundary: then start without context.
    const contextText = this.#decode(context);
    if (!contextText.endsWith(REPLACEMENT)) {
      this.#ids.push(...context);
      this.#readOffset = context.length;
      this.#sent = contextText.length;
    }
    this.#context = this.#ids.length;
  }

  /** Generated ids so far (without the prompt context). */
  get ids(): readonly number[] {
    return this.#ids.slice(this.#context);
  }

  #decode(ids: readonly number[]): string {
    return this.#tokenizer.decode(ids, {
      skipSpecialTokens: this.#skipSpecial,
      cleanUpTokenizationSpaces: false,
    });
  }

  /** Adds `id` and returns the text it completes (often "", e.g. in the middle of a character). */
  push(id: number): string {
    if (this.#finished) throw new RangeError("Cannot push to a finished detokenizer");
    const ids = this.#ids;
    ids.push(id);
    const text = this.#decode(ids.slice(this.#prefixOffset));
    if (!text.endsWith(REPLACEMENT)) return this.#advance(text, ids.length);
    if (ids.length - this.#readOffset <= MAX_PENDING) return "";
    // Held too long: find a boundary k inside the pending tokens. The right side must decode to
    // some text: tokens that decode to nothing (skipped special tokens, padded ids) do not close
    // an unfinished character on the left, which a later token may still complete.
    for (let k = ids.length - 1; k > this.#readOffset && k >= ids.length - MAX_PENDING; k--) {
      const left = this.#decode(ids.slice(this.#prefixOffset, k));
      const right = this.#decode(ids.slice(k));
      if (right !== "" && left + right === text) return this.#advance(left, k);
    }
    return "";
  }

  /**
   * Sends the window's text up to `end` (`text` = decode(ids[prefixOffset:end]), which ends on
   * a character boundary) and moves the window forward.
   */
  #advance(text: string, end: number): string {
    const delta = text.length > this.#sent ? text.slice(this.#sent) : "";
    this.#prefixOffset = this.#readOffset;
    this.#readOffset = end;
    this.#sent = this.#decode(this.#ids.slice(this.#prefixOffset, end)).length;
    return delta;
  }

  /**
   * Returns the text still held back (an unfinished character decodes to U+FFFD here, as in a
   * full decode). Call once, at the end of the sequence; `push` is refused afterwards.
   */
  finish(): string {
    if (this.#finished) return "";
    this.#finished = true;
    const text = this.#decode(this.#ids.slice(this.#prefixOffset));
    return text.length > this.#sent ? text.slice(this.#sent) : "";
  }
}
