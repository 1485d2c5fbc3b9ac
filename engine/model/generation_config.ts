/**
 * Parsing of a Hugging Face `generation_config.json` (optional in a checkpoint): the model's
 * default sampling settings and special token ids. Unknown fields are ignored; a field of the
 * wrong type gives a one-line {@linkcode ConfigError} naming it.
 *
 * @module
 */

import { z } from "zod";
import { ConfigError } from "./errors.ts";

/** Generation defaults; a field is `undefined` when the file does not set it. */
export interface GenerationConfig {
  readonly bosTokenId?: number;
  /** End-of-sequence ids (single id or list in the file, normalised to a list). */
  readonly eosTokenIds?: readonly number[];
  readonly padTokenId?: number;
  readonly doSample?: boolean;
  readonly temperature?: number;
  readonly topP?: number;
  readonly topK?: number;
  readonly minP?: number;
  readonly repetitionPenalty?: number;
  readonly maxNewTokens?: number;
  /** Maximum total length (prompt + generated), `max_length`. */
  readonly maxLength?: number;
}

const tokenId = z.number().int().nonnegative();

const schema = z.object({
  bos_token_id: tokenId.nullish(),
  eos_token_id: z.union([tokenId, z.array(tokenId)]).nullish(),
  pad_token_id: tokenId.nullish(),
  do_sample: z.boolean().nullish(),
  temperature: z.number().nonnegative().nullish(),
  top_p: z.number().gt(0).lte(1).nullish(),
  top_k: z.number().int().nonnegative().nullish(),
  min_p: z.number().min(0).lte(1).nullish(),
  repetition_penalty: z.number().positive().nullish(),
  max_new_tokens: z.number().int().positive().nullish(),
  max_length: z.number().int().positive().nullish(),
});

/**
 * The sampling fields a server may set over the model's (vLLM's `--override-generation-config`):
 * `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty` and `max_new_tokens`, no others.
 */
export const generationOverrideSchema = schema.pick({
  temperature: true,
  top_p: true,
  top_k: true,
  min_p: true,
  repetition_penalty: true,
  max_new_tokens: true,
}).strict();

/** Fields set over a generation config ({@linkcode generationOverrideSchema}). */
export type GenerationOverride = z.input<typeof generationOverrideSchema>;

/** `config` (null: none) with the fields of `override` set over it. */
export function overrideGenerationConfig(
  config: GenerationConfig | null,
  override: GenerationOverride,
): GenerationConfig {
  return Object.freeze({
    ...config,
    ...parseGenerationConfig(override, "--override-generation-config"),
  });
}

function describe(v: unknown): string {
  const s = JSON.stringify(v);
  return s === undefined ? String(v) : s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

/**
 * Parses the contents of a `generation_config.json` (already JSON-decoded). `null` values count
 * as absent.
 *
 * @param source file name to start error messages with (default `generation_config.json`).
 * @throws {ConfigError} one line naming the invalid field.
 */
export function parseGenerationConfig(
  json: unknown,
  source = "generation_config.json",
): GenerationConfig {
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw new ConfigError(`${source}: expected a JSON object`);
  }
  const parsed = schema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const field = (issue?.path ?? []).map(String).join(".");
    const value = typeof issue?.path[0] === "string" ? Reflect.get(json, issue.path[0]) : json;
    throw new ConfigError(
      `${source}: invalid field "${field}": ${describe(value)} (${issue?.message ?? "invalid"})`,
    );
  }
  const r = parsed.data;
  const eos = r.eos_token_id;
  const out: {
    -readonly [K in keyof GenerationConfig]: GenerationConfig[K];
  } = {};
  if (r.bos_token_id != null) out.bosTokenId = r.bos_token_id;
  if (eos != null) out.eosTokenIds = Object.freeze(typeof eos === "number" ? [eos] : [...eos]);
  if (r.pad_token_id != null) out.padTokenId = r.pad_token_id;
  if (r.do_sample != null) out.doSample = r.do_sample;
  if (r.temperature != null) out.temperature = r.temperature;
  if (r.top_p != null) out.topP = r.top_p;
  if (r.top_k != null) out.topK = r.top_k;
  if (r.min_p != null) out.minP = r.min_p;
  if (r.repetition_penalty != null) out.repetitionPenalty = r.repetition_penalty;
  if (r.max_new_tokens != null) out.maxNewTokens = r.max_new_tokens;
  if (r.max_length != null) out.maxLength = r.max_length;
  return Object.freeze(out);
}
