/**
 * Grammar sources and compilation of structured outputs, in the grammar worker
 * (grammar_worker.ts): the EBNF of each {@linkcode StructuredOutputSpec} kind and its
 * compilation against the model's vocabulary with xgrammar.
 *
 * JSON (`json_object`, `json_schema`) is generated on one line with `", "` and `": "`
 * separators: no free whitespace, so a model cannot run into `max_tokens` on spaces.
 *
 * @module
 */

import type { StructuredOutputSpec } from "../../scheduler/sampling_params.ts";
import { type XgCompiledGrammar, type XgGrammarCompiler, xgrammar } from "./xgrammar.ts";

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

/**
 * Compiles `spec` with `compiler`. xgrammar reports a bad grammar by printing `[FATAL] <reason>`
 * on stderr itself (through a `console.error` it bound at load, out of reach) and aborting the
 * call with "Aborted()": that becomes a message pointing to the log.
 */
export async function compileSpec(
  compiler: XgGrammarCompiler,
  spec: StructuredOutputSpec,
): Promise<XgCompiledGrammar> {
  try {
    return await compileWith(compiler, spec);
  } catch (e) {
    const message = e instanceof Error ? e.message : String(e);
    if (!message.startsWith("Aborted(")) throw e;
    throw new Error("xgrammar could not compile it (its reason is in the server's log)");
  }
}

async function compileWith(
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
      return await compiler.compileGrammar(`root ::= ${spec.choices.map(ebnfString).join(" | ")}`);
    case "grammar":
      return await compiler.compileGrammar(spec.ebnf);
    case "tool_calls":
      return await compiler.compileGrammar(await toolCallGrammar(spec.tools, spec.parallel));
  }
}
