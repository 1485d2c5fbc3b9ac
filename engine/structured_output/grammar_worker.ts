/**
 * The grammar worker (a Web Worker started by {@linkcode StructuredOutputs}): xgrammar's
 * compiler, the compiled grammars (cached by specification, at most
 * {@linkcode GRAMMAR_CACHE_SIZE}) and one matcher per constrained request live here, off the
 * engine's thread, so compiling a grammar never stalls the engine's steps and the engine can
 * stop a compile that runs too long by terminating the worker. Messages
 * (grammar_protocol.ts) are handled one at a time, in order.
 *
 * @module
 */

/// <reference lib="deno.worker" />

import type { FromGrammarWorker, ToGrammarWorker } from "./grammar_protocol.ts";
import { compileSpec } from "./grammars.ts";
import {
  type XgCompiledGrammar,
  type XgGrammarCompiler,
  type XgGrammarMatcher,
  xgrammar,
} from "./xgrammar.ts";

/** Compiled grammars kept for reuse (by specification). */
export const GRAMMAR_CACHE_SIZE = 256;

let compiler: XgGrammarCompiler | null = null;
const cache = new Map<string, XgCompiledGrammar>();
const matchers = new Map<
  string,
  { readonly matcher: XgGrammarMatcher; readonly own: XgCompiledGrammar | null }
>();

function post(message: FromGrammarWorker): void {
  const mask = message.type === "opened" || message.type === "mask" ? message.mask : null;
  self.postMessage(message, mask === null ? [] : [mask.buffer as ArrayBuffer]);
}

/** `matcher`'s next mask, copied out of xgrammar's memory (which the next call reuses). */
async function nextMask(matcher: XgGrammarMatcher): Promise<Uint32Array> {
  const bits = await matcher.getNextTokenBitmask();
  return new Uint32Array(bits.buffer, bits.byteOffset, bits.length).slice();
}

async function handle(m: ToGrammarWorker): Promise<void> {
  switch (m.type) {
    case "init": {
      // Before any grammar's time limit starts.
      const xg = xgrammar();
      const info = await xg.TokenizerInfo.createTokenizerInfo(
        [...m.vocab.encoded],
        m.vocab.vocabType,
        m.vocab.prependSpace,
        m.vocabSize,
        [...m.stopTokenIds],
      );
      compiler = await xg.GrammarCompiler.createGrammarCompiler(info, true);
      return;
    }
    case "open": {
      let own: XgCompiledGrammar | null = null;
      try {
        let grammar = cache.get(m.key);
        if (grammar === undefined) {
          post({ type: "compiling", id: m.id });
          grammar = await compileSpec(compiler!, m.spec);
          if (cache.size < GRAMMAR_CACHE_SIZE) cache.set(m.key, grammar);
          else own = grammar;
        }
        const matcher = await xgrammar().GrammarMatcher.createGrammarMatcher(grammar);
        matchers.set(m.id, { matcher, own });
        for (const t of m.replay) {
          if (!matcher.acceptToken(t)) return post({ type: "rejected", id: m.id, token: t });
        }
        post({
          type: "opened",
          id: m.id,
          error: null,
          mask: m.mask ? await nextMask(matcher) : null,
        });
      } catch (error) {
        own?.dispose();
        const why = error instanceof Error ? error.message : String(error);
        post({ type: "opened", id: m.id, error: why, mask: null });
      }
      return;
    }
    case "accept": {
      const entry = matchers.get(m.id);
      if (entry === undefined) return;
      for (const t of m.tokens) {
        if (!entry.matcher.acceptToken(t)) return post({ type: "rejected", id: m.id, token: t });
      }
      if (m.mask) post({ type: "mask", id: m.id, mask: await nextMask(entry.matcher) });
      return;
    }
    case "close": {
      const entry = matchers.get(m.id);
      if (entry === undefined) return;
      matchers.delete(m.id);
      entry.matcher.dispose();
      entry.own?.dispose();
      return;
    }
  }
}

let queue = Promise.resolve();
self.onmessage = (event: MessageEvent<ToGrammarWorker>) => {
  // An unexpected error reaches the engine as the worker's error event (it restarts it).
  queue = queue.then(() => handle(event.data)).catch((error) => {
    setTimeout(() => {
      throw error;
    });
  });
};
