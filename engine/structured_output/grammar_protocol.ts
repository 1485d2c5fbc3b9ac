/**
 * Messages between {@linkcode StructuredOutputs} (the engine's thread) and the grammar worker
 * (grammar_worker.ts), which owns xgrammar: the compiler, the compiled grammars and one matcher
 * per constrained request. The worker handles messages one at a time, in order.
 *
 * @module
 */

import type { StructuredOutputSpec } from "../../scheduler/sampling_params.ts";
import type { GrammarVocab } from "../tokenizer.ts";

/** Messages to the worker. */
export type ToGrammarWorker =
  /** First message: the vocabulary every grammar compiles against. */
  | {
    readonly type: "init";
    readonly vocab: GrammarVocab;
    /** The logits width (ids past the tokenizer's vocabulary are padding, never allowed). */
    readonly vocabSize: number;
    readonly stopTokenIds: readonly number[];
  }
  /**
   * Compile (or reuse, by `key`) `spec`'s grammar and start `id`'s matcher, feed it `replay`
   * (tokens it had accepted in a previous worker), and reply "opened", with the first mask
   * when `mask`.
   */
  | {
    readonly type: "open";
    readonly id: string;
    readonly key: string;
    readonly spec: StructuredOutputSpec;
    readonly replay: readonly number[];
    readonly mask: boolean;
  }
  /** Feed `tokens` to `id`'s matcher; then reply with its next mask when `mask`. */
  | {
    readonly type: "accept";
    readonly id: string;
    readonly tokens: readonly number[];
    readonly mask: boolean;
  }
  /** End `id`'s matcher. */
  | { readonly type: "close"; readonly id: string };

/** Messages from the worker. */
export type FromGrammarWorker =
  /** `id`'s grammar starts compiling now (not cached); its time limit runs from here. */
  | { readonly type: "compiling"; readonly id: string }
  /** `id`'s matcher started (error null; `mask` when asked for) or its grammar failed. */
  | {
    readonly type: "opened";
    readonly id: string;
    readonly error: string | null;
    readonly mask: Uint32Array | null;
  }
  /** `id`'s allowed-token bitmask after the tokens it accepted: `ceil(vocabSize / 32)` words. */
  | { readonly type: "mask"; readonly id: string; readonly mask: Uint32Array }
  /** `id`'s matcher refused `token` (a bug: the mask allowed it). */
  | { readonly type: "rejected"; readonly id: string; readonly token: number };
