/**
 * What a JSON schema of a structured-output request (`response_format`, a tool's `parameters`)
 * may use: the keywords the grammar enforces (xgrammar's JSON schema converter) and annotations.
 * {@linkcode checkJsonSchema} refuses any other keyword, anywhere in the schema, with a 400
 * naming it, rather than letting the grammar ignore it silently.
 *
 * @module
 */

import { InvalidParameterError } from "../input_processor.ts";

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
    } else if (SCHEMA_VALUES.has(key) && Array.isArray(value)) {
      value.forEach((sub, i) => checkJsonSchema(sub, param, `${path}.${key}.${i}`));
    } else if (SCHEMA_VALUES.has(key)) {
      checkJsonSchema(value, param, `${path}.${key}`);
    }
  }
}
