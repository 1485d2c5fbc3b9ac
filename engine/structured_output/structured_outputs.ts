/**
 * Structured outputs in the engine: one xgrammar matcher per constrained request, on the CPU.
 * For each step the engine asks {@linkcode StructuredOutputs.masks} for the allowed-token
 * bitmask of every constrained request that samples in it (the GPU sampler masks those rows
 * only, before logits processing and sampling: kernels/token_mask.ts); each token read back is
 * fed to the request's matcher ({@linkcode StructuredOutputs.accept}). The scheduler runs a
 * constrained request only once its previous token is known (scheduler/step_commit.ts), so
 * its mask always follows every token it has.
 *
 * Grammars are compiled on admission, against the model's vocabulary over the whole logits
 * width (ids past the tokenizer's vocabulary, padding, are never allowed), and cached by their
 * specification (at most {@linkcode GRAMMAR_CACHE_SIZE}). JSON (`json_object`, `json_schema`)
 * is generated on one line with `", "` and `": "` separators: no free whitespace, so a model
 * cannot run into `max_tokens` on spaces. A JSON schema keyword the engine does not enforce is
 * refused with a 400 naming it ({@linkcode checkJsonSchema}).
 *
 * @module
 */

import type { StructuredOutputSpec } from "../../scheduler/sampling_params.ts";
import type { SchedulerOutput } from "../../scheduler/scheduler_output.ts";
import { InvalidParameterError } from "../input_processor.ts";
import type { Tokenizer } from "../tokenizer.ts";
import {
  type XgCompiledGrammar,
  type XgGrammarCompiler,
  type XgGrammarMatcher,
  xgrammar,
} from "./xgrammar.ts";

/** Compiled grammars kept for reuse (by specification). */
export const GRAMMAR_CACHE_SIZE = 256;

/**
 * JSON schema keywords enforced by the grammar (xgrammar's JSON schema converter), and the
 * annotations that constrain nothing. Any other keyword gets a 400.
 */
const SCHEMA_KEYWORDS = new Set([
  "type",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "prefixItems",
  "enum",
  "const",
  "anyOf",
  "oneOf",
  "$ref",
  "$defs",
  "definitions",
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "minimum",
  "maximum",
  "exclusiveMinimum",
  "exclusiveMaximum",
  "pattern",
  "minProperties",
  "maxProperties",
  "unevaluatedProperties",
  "unevaluatedItems",
  // Annotations.
  "title",
  "description",
  "default",
  "examples",
  "$schema",
  "$id",
  "$comment",
  "deprecated",
  "readOnly",
  "writeOnly",
]);
/** Keywords whose value is a map of schemas. */
const SCHEMA_MAPS = new Set(["properties", "$defs", "definitions"]);
/** Keywords whose value is a schema or a list of schemas. */
const SCHEMA_VALUES = new Set([
  "items",
  "prefixItems",
  "anyOf",
  "oneOf",
  "additionalProperties",
  "unevaluatedProperties",
  "unevaluatedItems",
]);

/**
 * Throws an {@linkcode InvalidParameterError} naming the first keyword of `schema` that the
 * grammar would not enforce (e.g. `format`, `allOf`, `not`, `if`).
 */
export function checkJsonSchema(schema: unknown, param: string, path = "schema"): void {
  if (typeof schema === "boolean") return;
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
    throw new InvalidParameterError(param, `${path} must be a JSON schema object`);
  }
  for (const [key, value] of Object.entries(schema)) {
    if (!SCHEMA_KEYWORDS.has(key)) {
      throw new InvalidParameterError(
        param,
        `${path} uses the JSON schema keyword "${key}", which structured outputs do not enforce`,
      );
    }
    if (SCHEMA_MAPS.has(key) && typeof value === "object" && value !== null) {
      for (const [name, sub] of Object.entries(value)) {
        checkJsonSchema(sub, param, `${path}.${key}.${name}`);
      }
    } else if (SCHEMA_VALUES.has(key)) {
      const subs = Array.isArray(value) ? value : [value];
      subs.forEach((sub, i) =>
        checkJsonSchema(sub, param, `${path}.${key}${Array.isArray(value) ? `.${i}` : ""}`)
      );
    }
  }
}

/**
 * The EBNF of a JSON schema (one line, `", "` / `": "` separators), with xgrammar 0.1.27's
 * character class for strings with `minLength` / `maxLength`, `[^"\\\r\n]`, narrowed to
 * JSON's `[^\0-\x1f"\\]`: as generated it lets control characters into a string, which no
 * JSON parser accepts (measured 2026-11-25: a random-weight model wrote U+001E into a
 * `maxLength` string).
 */
export async function jsonGrammar(schema: unknown, strict: boolean): Promise<string> {
  const grammar = await xgrammar().Grammar.fromJSONSchema(
    JSON.stringify(schema),
    false,
    -1,
    [", ", ": "],
    strict,
  );
  try {
    return grammar.toString().replaceAll('[^\\"\\\\\\r\\n]', '[^\\0-\\x1f\\"\\\\]');
  } finally {
    grammar.dispose();
  }
}

/**
 * Prefixes every rule name of an EBNF grammar with `prefix` (in definitions and references,
 * never inside string literals or character classes), so several grammars can be merged.
 */
export function prefixRules(ebnf: string, prefix: string): string {
  const names = new Set([...ebnf.matchAll(/^([A-Za-z_][A-Za-z0-9_]*)\s*::=/gm)].map((m) => m[1]!));
  let out = "";
  for (let i = 0; i < ebnf.length;) {
    const c = ebnf[i]!;
    if (c === '"' || c === "[") {
      const close = c === '"' ? '"' : "]";
      let j = i + 1;
      while (j < ebnf.length && ebnf[j] !== close) j += ebnf[j] === "\\" ? 2 : 1;
      out += ebnf.slice(i, j + 1);
      i = j + 1;
    } else if (/[A-Za-z_]/.test(c)) {
      let j = i;
      while (j < ebnf.length && /[A-Za-z0-9_]/.test(ebnf[j]!)) j++;
      const word = ebnf.slice(i, j);
      out += names.has(word) ? prefix + word : word;
      i = j;
    } else {
      out += c;
      i++;
    }
  }
  return out;
}

/**
 * The grammar of tool calls in the Hermes / Qwen format, one or (with `parallel`) several
 * separated by a newline: `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`,
 * ARGS following the tool's parameters schema (JSON on one line, as for `json_schema`).
 */
export async function toolCallGrammar(
  tools: readonly { readonly name: string; readonly parameters: unknown }[],
  parallel: boolean,
): Promise<string> {
  const rules: string[] = [];
  const calls: string[] = [];
  for (const [i, tool] of tools.entries()) {
    const args = prefixRules(
      await jsonGrammar(tool.parameters ?? { type: "object" }, true),
      `t${i}_`,
    );
    rules.push(args);
    const head = `<tool_call>\n{"name": ${JSON.stringify(tool.name)}, "arguments": `;
    calls.push(`${ebnfString(head)} t${i}_root ${ebnfString("}\n</tool_call>")}`);
  }
  const root = parallel ? 'root ::= call ("\\n" call)*' : "root ::= call";
  return [root, `call ::= ${calls.map((c) => `(${c})`).join(" | ")}`, ...rules].join("\n");
}

/** An EBNF string literal of `text` (xgrammar's escapes). */
function ebnfString(text: string): string {
  return JSON.stringify(text);
}

interface Entry {
  readonly matcher: XgGrammarMatcher;
  /** The compiled grammar, when not shared through the cache (disposed with the matcher). */
  readonly own: XgCompiledGrammar | null;
  /** The text the grammar waits for (e.g. `</think>`); null once it applies. */
  waitingFor: string | null;
  /** The end of the output decoded so far, while waiting (to find the text across tokens). */
  tail: string;
}

/** The structured-output state of one engine (see the module documentation). */
export class StructuredOutputs {
  readonly #tokenizer: Tokenizer | null;
  readonly #vocabSize: number;
  readonly #stopTokenIds: readonly number[];
  #compiler: Promise<XgGrammarCompiler> | null = null;
  readonly #cache = new Map<string, Promise<XgCompiledGrammar>>();
  readonly #matchers = new Map<string, Entry>();

  /**
   * @param tokenizer the model's tokenizer (structured outputs need one).
   * @param vocabSize the logits width (the model's `vocab_size`).
   * @param stopTokenIds the model's end-of-sequence ids (allowed once the grammar is complete).
   */
  constructor(tokenizer: Tokenizer | null, vocabSize: number, stopTokenIds: readonly number[]) {
    this.#tokenizer = tokenizer;
    this.#vocabSize = vocabSize;
    this.#stopTokenIds = stopTokenIds;
  }

  /** Whether some request is constrained now. */
  get active(): boolean {
    return this.#matchers.size > 0;
  }

  /**
   * Compiles (or reuses) `spec`'s grammar and starts `requestId`'s matcher.
   *
   * @throws {InvalidParameterError} when the model has no tokenizer, or the grammar is invalid
   *   or uses what the engine cannot enforce.
   */
  async admit(
    requestId: string,
    spec: StructuredOutputSpec,
    param: string,
    after: string | null = null,
  ): Promise<void> {
    if (this.#tokenizer === null) {
      throw new InvalidParameterError(
        param,
        "Structured outputs need the model's tokenizer; this model has none",
      );
    }
    if (spec.kind === "json_schema") checkJsonSchema(spec.schema, param);
    if (spec.kind === "tool_calls") {
      spec.tools.forEach((t, i) =>
        checkJsonSchema(t.parameters, `tools.${i}.function.parameters`, "parameters")
      );
    }
    const key = JSON.stringify(spec);
    let compiled = this.#cache.get(key);
    let own: XgCompiledGrammar | null = null;
    try {
      if (compiled === undefined) {
        const fresh = this.#compile(spec);
        if (this.#cache.size < GRAMMAR_CACHE_SIZE) {
          this.#cache.set(key, fresh);
          fresh.catch(() => this.#cache.delete(key));
          compiled = fresh;
        } else {
          own = await fresh;
          compiled = Promise.resolve(own);
        }
      }
      const grammar = await compiled;
      const matcher = await xgrammar().GrammarMatcher.createGrammarMatcher(grammar);
      this.#matchers.set(requestId, { matcher, own, waitingFor: after, tail: "" });
    } catch (error) {
      own?.dispose();
      if (error instanceof InvalidParameterError) throw error;
      const why = error instanceof Error ? error.message : String(error);
      throw new InvalidParameterError(param, `Invalid ${spec.kind} for structured outputs: ${why}`);
    }
  }

  /**
   * The allowed-token bitmasks of the constrained requests that sample in `output` (request id
   * -> `ceil(vocabSize / 32)` words), or undefined when none does.
   */
  async masks(output: SchedulerOutput): Promise<Map<string, Uint32Array> | undefined> {
    let masks: Map<string, Uint32Array> | undefined;
    for (const r of output.scheduled) {
      if (!r.samplesToken) continue;
      const entry = this.#matchers.get(r.requestId);
      if (entry === undefined || entry.waitingFor !== null) continue;
      const bits = await entry.matcher.getNextTokenBitmask();
      // A copy: the array may be a view of xgrammar's memory, reused by the next call.
      const mask = new Uint32Array(bits.length);
      mask.set(new Uint32Array(bits.buffer, bits.byteOffset, bits.length));
      (masks ??= new Map()).set(r.requestId, mask);
    }
    return masks;
  }

  /**
   * Feeds tokens read back for `requestId` to its matcher (a no-op for unconstrained ones).
   * Returns false when the grammar rejects one (a bug: the mask allowed it) and true otherwise.
   */
  accept(requestId: string, tokenIds: readonly number[]): boolean {
    const entry = this.#matchers.get(requestId);
    if (entry === undefined) return true;
    for (const t of tokenIds) {
      if (entry.waitingFor !== null) {
        // Until the text is out, tokens are free (not the grammar's); it applies after them.
        const marker = entry.waitingFor;
        entry.tail = (entry.tail + this.#tokenizer!.decode([t])).slice(-4 * marker.length);
        if (entry.tail.includes(marker)) entry.waitingFor = null;
        continue;
      }
      if (!entry.matcher.acceptToken(t)) return false;
    }
    return true;
  }

  /** Whether `requestId`'s grammar is complete (its stop token accepted). */
  terminated(requestId: string): boolean {
    const entry = this.#matchers.get(requestId);
    return entry !== undefined && entry.waitingFor === null && entry.matcher.isTerminated();
  }

  /** Ends `requestId`'s matcher. */
  release(requestId: string): void {
    const entry = this.#matchers.get(requestId);
    if (entry === undefined) return;
    this.#matchers.delete(requestId);
    entry.matcher.dispose();
    entry.own?.dispose();
  }

  #compilerFor(): Promise<XgGrammarCompiler> {
    this.#compiler ??= (async () => {
      const xg = xgrammar();
      const v = this.#tokenizer!.grammarVocab;
      const info = await xg.TokenizerInfo.createTokenizerInfo(
        [...v.encoded],
        v.vocabType,
        v.prependSpace,
        this.#vocabSize,
        [...this.#stopTokenIds],
      );
      return await xg.GrammarCompiler.createGrammarCompiler(info, true);
    })();
    return this.#compiler;
  }

  /**
   * Compiles `spec`. xgrammar reports a bad grammar by printing `[FATAL] <reason>` on stderr
   * itself (through a `console.error` it bound at load, out of reach) and aborting the call
   * with "Aborted()": that becomes a message pointing to the log.
   */
  async #compile(spec: StructuredOutputSpec): Promise<XgCompiledGrammar> {
    const compiler = await this.#compilerFor();
    try {
      return await this.#compileWith(compiler, spec);
    } catch (e) {
      const message = e instanceof Error ? e.message : String(e);
      if (!message.startsWith("Aborted(")) throw e;
      throw new Error("xgrammar could not compile it (its reason is in the server's log)");
    }
  }

  async #compileWith(
    compiler: XgGrammarCompiler,
    spec: StructuredOutputSpec,
  ): Promise<XgCompiledGrammar> {
    switch (spec.kind) {
      case "json_object":
        return await compiler.compileGrammar(await jsonGrammar({ type: "object" }, false));
      case "json_schema":
        return await compiler.compileGrammar(await jsonGrammar(spec.schema, spec.strict));
      case "regex":
        return await compiler.compileStructuralTag({
          type: "structural_tag",
          format: { type: "regex", pattern: spec.pattern },
        });
      case "choice":
        return await compiler.compileGrammar(
          `root ::= ${spec.choices.map(ebnfString).join(" | ")}`,
        );
      case "grammar":
        return await compiler.compileGrammar(spec.ebnf);
      case "tool_calls":
        return await compiler.compileGrammar(await toolCallGrammar(spec.tools, spec.parallel));
    }
  }
}
