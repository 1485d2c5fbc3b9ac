/**
 * A request the engine is serving, as its consumer sees it: the increments produced so far,
 * waiting to be read, and how the request ended (finished, or failed with an error). The engine
 * pushes increments; {@linkcode LiveRequest.stream} yields them in order.
 *
 * @module
 */

import type { FinishReason, RequestOutput, TokenLogprob } from "./engine_api.ts";
import type { SampledToken } from "./executors/executor.ts";
import type { RequestOutputState } from "./output_processor.ts";
import type { SamplingParams } from "../scheduler/sampling_params.ts";
import type { BadWords } from "./bad_words.ts";
import { maskWords } from "../kernels/token_mask.ts";

/** One request's output queue and end state. */
export class LiveRequest {
  /** Detokenization, stop strings and logprob shaping of the request's output. */
  readonly state: RequestOutputState;
  readonly params: SamplingParams;
  /**
   * The fixed token mask of `params.allowedTokenIds` (one bit per id of the logits width, set
   * for the allowed ones), applied at every step the request samples in; null without one.
   */
  readonly tokenMask: Uint32Array | null;
  /** `params.badWords` as token sequences and the output's last tokens; null without them. */
  readonly badWords: BadWords | null;
  readonly #vocabSize: number;
  /** `performance.now()` at construction (the request's arrival at the engine). */
  readonly #arrivedAt = performance.now();
  readonly #queue: RequestOutput[] = [];
  #notify: (() => void) | null = null;
  #finished = false;
  #error: Error | null = null;

  /**
   * @param vocabSize the logits width (the masks' bits).
   * @param badWords the state of `params.badWords` (engine/bad_words.ts), or null.
   */
  constructor(
    state: RequestOutputState,
    params: SamplingParams,
    vocabSize: number,
    badWords: BadWords | null = null,
  ) {
    this.state = state;
    this.params = params;
    this.#vocabSize = vocabSize;
    this.tokenMask = params.allowedTokenIds === null
      ? null
      : allowedTokenMask(params.allowedTokenIds, vocabSize);
    this.badWords = badWords;
  }

  /**
   * The mask of the request's next token: its fixed `allowed_token_ids` mask, less what its bad
   * words ban after the output so far; null when it has neither.
   */
  nextMask(): Uint32Array | null {
    return this.badWords === null
      ? this.tokenMask
      : this.badWords.mask(this.tokenMask, this.#vocabSize);
  }

  /** Whether the request has ended (finished, aborted or failed). */
  get finished(): boolean {
    return this.#finished;
  }

  /**
   * Takes the request's new tokens of a step (`sampled`: what the executor read back for it):
   * detokenizes them, checks the stop strings, shapes the logprobs the request asked for and
   * queues the increment, if any. Returns how many tokens count as generated (tokens after a
   * matched stop string are dropped, not counted) and the stop string matched, if any.
   * `stopToken`: the last token ended the request (see `RequestOutputState.push`).
   */
  accept(
    tokenIds: readonly number[],
    sampled: SampledToken | undefined,
    stopToken = false,
  ): { generated: number; stopString: string | null } {
    const wantTop = (this.params.logprobs ?? 0) > 0;
    const logprobs: TokenLogprob[] | null = this.params.logprobs === null
      ? null
      : tokenIds.map((tokenId) => ({
        tokenId,
        logprob: sampled?.logprob ?? 0,
        ...(wantTop ? { top: sampled?.top ?? [] } : {}),
      }));
    this.badWords?.push(tokenIds);
    const before = this.state.numOutputTokens;
    const { output, stopString } = this.state.push(tokenIds, logprobs, stopToken);
    if (output !== null) this.emit(output);
    return { generated: this.state.numOutputTokens - before, stopString };
  }

  /**
   * Notes that a step scheduled the request: its first such step sets the queue time its
   * increments carry from then on.
   */
  scheduled(): void {
    this.state.queueTime ??= (performance.now() - this.#arrivedAt) / 1000;
  }

  /** Queues an increment for the consumer. */
  emit(output: RequestOutput): void {
    this.#queue.push(output);
    this.#wake();
  }

  /** Ends the request with its last increment (`reason`, and the stop token or string). */
  finish(reason: FinishReason, stop: number | string | null): void {
    this.#finished = true;
    this.emit(this.state.finish(reason, stop));
  }

  /** Ends the request with `error`: its stream throws it once the queued increments are read. */
  fail(error: Error): void {
    this.#finished = true;
    this.#error = error;
    this.#wake();
  }

  /**
   * The increments in order, ending after the last one (or throwing the error of
   * {@linkcode fail}). `onEarlyStop` runs when the consumer stops reading before the end.
   */
  async *stream(onEarlyStop: () => void): AsyncGenerator<RequestOutput> {
    try {
      while (true) {
        const next = this.#queue.shift();
        if (next !== undefined) {
          yield next;
          if (next.finishReason !== null) return;
          continue;
        }
        if (this.#error !== null) throw this.#error;
        await new Promise<void>((resolve) => (this.#notify = resolve));
      }
    } finally {
      if (!this.#finished) onEarlyStop();
    }
  }

  #wake(): void {
    const notify = this.#notify;
    this.#notify = null;
    notify?.();
  }
}

/** A token mask (kernels/token_mask.ts: bit `id % 32` of word `id / 32`) allowing `ids` only. */
export function allowedTokenMask(ids: readonly number[], vocabSize: number): Uint32Array {
  const mask = new Uint32Array(maskWords(vocabSize));
  for (const id of ids) mask[id >>> 5]! |= 1 << (id & 31);
  return mask;
}
