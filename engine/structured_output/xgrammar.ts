/**
 * The grammar engine of structured outputs: xgrammar (the engine under vLLM, SGLang and WebLLM),
 * compiled to WebAssembly as `@mlc-ai/web-xgrammar` 0.1.27, vendored in `vendor/` (see its
 * README for why) and loaded once, on first use, through `createRequire`. Only the part of its
 * API the engine uses is typed here.
 *
 * @module
 */

import { createRequire } from "node:module";

/** A tokenizer's vocabulary as xgrammar sees it. */
export interface XgTokenizerInfo {
  dispose(): void;
}

/** A grammar compiled against one vocabulary. */
export interface XgCompiledGrammar {
  dispose(): void;
}

/** Compiles grammars against one vocabulary. */
export interface XgGrammarCompiler {
  compileJSONSchema(
    schema: string,
    anyWhitespace?: boolean,
    indent?: number,
    separators?: [string, string],
    strictMode?: boolean,
    maxWhitespaceCnt?: number,
  ): Promise<XgCompiledGrammar>;
  compileGrammar(ebnf: string, rootRule?: string): Promise<XgCompiledGrammar>;
  compileStructuralTag(tag: Record<string, unknown>): Promise<XgCompiledGrammar>;
  dispose(): void;
}

/** One request's position in its grammar. */
export interface XgGrammarMatcher {
  acceptToken(tokenId: number): boolean;
  /** `ceil(vocabSize / 32)` words, bit v % 32 of word v / 32 set when token v is allowed. */
  getNextTokenBitmask(): Promise<Int32Array>;
  isTerminated(): boolean;
  dispose(): void;
}

/** A grammar, not yet compiled. */
export interface XgGrammar {
  /** The grammar in xgrammar's EBNF (which `compileGrammar` reads back). */
  toString(): string;
  dispose(): void;
}

/** The module's entry points. */
export interface XGrammar {
  Grammar: {
    fromJSONSchema(
      schema: string,
      anyWhitespace?: boolean,
      indent?: number,
      separators?: [string, string],
      strictMode?: boolean,
    ): Promise<XgGrammar>;
  };
  TokenizerInfo: {
    createTokenizerInfo(
      encodedVocab: string[],
      vocabType?: string,
      prependSpaceInTokenization?: boolean,
      vocabSize?: number,
      stopTokenIds?: number[],
    ): Promise<XgTokenizerInfo>;
  };
  GrammarCompiler: {
    createGrammarCompiler(
      info: XgTokenizerInfo,
      cacheEnabled?: boolean,
    ): Promise<XgGrammarCompiler>;
  };
  GrammarMatcher: {
    createGrammarMatcher(
      compiled: XgCompiledGrammar,
      overrideStopTokens?: number[],
      terminateWithoutStopToken?: boolean,
    ): Promise<XgGrammarMatcher>;
  };
}

let module: XGrammar | null = null;

/** The xgrammar module (loaded on the first call). */
export function xgrammar(): XGrammar {
  if (module === null) {
    const require = createRequire(import.meta.url);
    module = require("./vendor/web_xgrammar.cjs") as XGrammar;
  }
  return module;
}
