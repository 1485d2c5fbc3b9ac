/**
 * vLLM's `bad_words`: words the output must not contain. Each word becomes token sequences (as
 * vLLM tokenizes them: the word, and the word after a space when that is another token
 * sequence of the same length); at each step a sequence's last token is banned when the output
 * already ends with the rest of it (a one-token sequence is always banned). The ban is a token
 * mask (kernels/token_mask.ts) computed on the host after every token, so such a request runs a
 * step only once its previous token is known (scheduler/step_commit.ts `tokensToRun`), as a
 * grammar-constrained one does.
 *
 * @module
 */

import { maskWords } from "../kernels/token_mask.ts";
import type { Tokenizer } from "./tokenizer.ts";

/**
 * The token sequences of `words`, vLLM's rule: `word.trimStart()` encoded, and `" " + word`
 * encoded when its first token differs from the first's and it has as many tokens.
 */
export function badWordTokenIds(tokenizer: Tokenizer, words: readonly string[]): number[][] {
  const out: number[][] = [];
  for (const word of words) {
    const bare = tokenizer.encode(word.trimStart(), { addSpecialTokens: false });
    if (bare.length > 0) out.push(bare);
    const spaced = tokenizer.encode(" " + word.trimStart(), { addSpecialTokens: false });
    if (spaced.length > 0 && spaced.length === bare.length && spaced[0] !== bare[0]) {
      out.push(spaced);
    }
  }
  return out;
}

/** One request's bad-word state: its token sequences and the end of its output so far. */
export class BadWords {
  readonly #sequences: readonly (readonly number[])[];
  readonly #keep: number;
  /** The last output tokens, at most the longest sequence minus one. */
  #recent: number[] = [];

  constructor(sequences: readonly (readonly number[])[]) {
    this.#sequences = sequences;
    this.#keep = Math.max(0, ...sequences.map((s) => s.length - 1));
  }

  /** Takes the request's new output tokens, in order. */
  push(tokenIds: readonly number[]): void {
    if (this.#keep === 0) return;
    this.#recent.push(...tokenIds);
    if (this.#recent.length > this.#keep) this.#recent.splice(0, this.#recent.length - this.#keep);
  }

  /**
   * The next token's mask: `base` (a fixed mask, copied) or every token of `vocabSize`, less the
   * banned ones (bit `id % 32` of word `id / 32` cleared).
   */
  mask(base: Uint32Array | null, vocabSize: number): Uint32Array {
    const mask = base === null
      ? new Uint32Array(maskWords(vocabSize)).fill(0xffffffff)
      : base.slice();
    for (const seq of this.#sequences) {
      const prefix = seq.length - 1;
      if (prefix > this.#recent.length) continue;
      const from = this.#recent.length - prefix;
      let match = true;
      for (let i = 0; i < prefix && match; i++) match = this.#recent[from + i] === seq[i];
      if (match) {
        const id = seq[prefix]!;
        mask[id >>> 5]! &= ~(1 << (id & 31));
      }
    }
    return mask;
  }
}
