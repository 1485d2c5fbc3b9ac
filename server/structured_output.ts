/**
 * The structured-output fields of a request -> the engine's {@linkcode StructuredOutputSpec}:
 * OpenAI's `response_format` (`json_object`, `json_schema`), vLLM's `structured_outputs`
 * (`json`, `regex`, `choice`, `grammar`, `json_object`) and its older `guided_*` spellings. At
 * most one may constrain a request; what a grammar means is checked when the engine compiles it.
 *
 * @module
 */

import type { StructuredOutputSpec } from "../scheduler/sampling_params.ts";
import { ApiError, type ChatRequest, type CompletionRequest } from "./protocol.ts";

function invalid(param: string, message: string): ApiError {
  return new ApiError(400, message, { param, code: "invalid_value" });
}

/** A JSON schema given as an object, a boolean, or a string holding JSON. */
function schemaOf(value: unknown, param: string): unknown {
  if (typeof value !== "string") return value;
  try {
    return JSON.parse(value);
  } catch {
    throw invalid(param, `${param} is not valid JSON`);
  }
}

/** Every constraint a request spells, with the parameter that spelled it. */
function constraints(body: CompletionRequest | ChatRequest): [string, StructuredOutputSpec][] {
  const out: [string, StructuredOutputSpec][] = [];
  const has = (v: unknown) => v !== undefined && v !== null;
  const rf = body.response_format;
  if (rf?.type === "json_object") out.push(["response_format", { kind: "json_object" }]);
  if (rf?.type === "json_schema") {
    out.push(["response_format", {
      kind: "json_schema",
      schema: rf.json_schema.schema ?? {},
      strict: rf.json_schema.strict ?? false,
    }]);
  }
  const so = body.structured_outputs;
  if (has(so?.structural_tag)) {
    throw new ApiError(400, "structured_outputs.structural_tag is not supported yet", {
      param: "structured_outputs.structural_tag",
      code: "not_supported",
    });
  }
  const json = so?.json ?? body.guided_json;
  const jsonParam = has(so?.json) ? "structured_outputs.json" : "guided_json";
  if (has(json)) {
    out.push([jsonParam, { kind: "json_schema", schema: schemaOf(json, jsonParam), strict: true }]);
  }
  if (so?.json_object === true) {
    out.push(["structured_outputs.json_object", { kind: "json_object" }]);
  }
  for (
    const [param, pattern] of [["structured_outputs.regex", so?.regex], [
      "guided_regex",
      body.guided_regex,
    ]] as const
  ) {
    if (has(pattern)) out.push([param, { kind: "regex", pattern: pattern! }]);
  }
  for (
    const [param, choices] of [["structured_outputs.choice", so?.choice], [
      "guided_choice",
      body.guided_choice,
    ]] as const
  ) {
    if (has(choices)) out.push([param, { kind: "choice", choices: choices! }]);
  }
  for (
    const [param, ebnf] of [["structured_outputs.grammar", so?.grammar], [
      "guided_grammar",
      body.guided_grammar,
    ]] as const
  ) {
    if (has(ebnf)) out.push([param, { kind: "grammar", ebnf: ebnf! }]);
  }
  return out;
}

/**
 * The request's structured-output constraint, or null for free text.
 *
 * @throws {ApiError} 400 when several are given, or a JSON schema string is not JSON.
 */
export function structuredOutputFor(
  body: CompletionRequest | ChatRequest,
): StructuredOutputSpec | null {
  const found = constraints(body);
  if (found.length > 1) {
    throw invalid(
      found[1]![0],
      `Give one structured-output constraint, not several: ${found.map(([p]) => p).join(", ")}`,
    );
  }
  return found[0]?.[1] ?? null;
}
