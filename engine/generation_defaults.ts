/**
 * The sampling defaults a served model's requests start from, as vLLM takes them: the model's
 * `generation_config.json` (`--generation-config auto`, the default), none (`vllm`), or the one in
 * another directory, with `--override-generation-config` fields set over it. Requests override
 * every default they set but `max_new_tokens`, a limit ({@linkcode generationDefaultsOf}). The
 * EOS ids of the model's generation config (or, with a directory, of that one) stop generation
 * beside config.json's whatever the defaults' source, as in vLLM, where `vllm` drops the
 * defaults but not the file's EOS ids.
 *
 * @module
 */

import { join } from "node:path";
import { readCheckpointJson } from "./model/checkpoint_files.ts";
import {
  type GenerationConfig,
  type GenerationOverride,
  overrideGenerationConfig,
  parseGenerationConfig,
} from "./model/generation_config.ts";
import type { SamplingParams } from "../scheduler/sampling_params.ts";

/** The generation config in use and where it came from (for the start-up log). */
export interface ResolvedGenerationConfig {
  /** Where the sampling defaults come from (null: none). */
  readonly config: GenerationConfig | null;
  /** EOS ids of the generation config file in use (the model's unless a directory is named). */
  readonly eosTokenIds: readonly number[];
  /** E.g. `the model's generation_config.json`, `--generation-config vllm: none from the model`. */
  readonly from: string;
}

/**
 * The generation config `source` names (`auto`: `own`, the checkpoint's; `vllm`: none; else a
 * directory's generation_config.json), with `override` set over it.
 *
 * @throws {CheckpointError} when the directory's file is missing or not JSON.
 * @throws {ConfigError} naming a field of the wrong type.
 */
export async function resolveGenerationConfig(
  source: string,
  own: GenerationConfig | null,
  override?: GenerationOverride,
): Promise<ResolvedGenerationConfig> {
  let file = own;
  let config: GenerationConfig | null;
  let from: string;
  if (source === "auto") {
    config = own;
    from = own === null
      ? "the model has no generation_config.json"
      : "the model's generation_config.json";
  } else if (source === "vllm") {
    config = null;
    from = "--generation-config vllm: none from the model";
  } else {
    const path = join(source, "generation_config.json");
    file = config = parseGenerationConfig(await readCheckpointJson(path), path);
    from = path;
  }
  const eosTokenIds = file?.eosTokenIds ?? [];
  if (override === undefined) return { config, eosTokenIds, from };
  const keys = Object.keys(override).join(", ");
  return {
    config: overrideGenerationConfig(config, override),
    eosTokenIds,
    from: `${from}, with ${keys} from --override-generation-config`,
  };
}

/**
 * The sampling defaults a generation config sets (requests override them), and its
 * `max_new_tokens` as `maxTokens`: as in vLLM, a limit on every request's output (the server
 * takes the least of it, the request's `max_tokens` and the room left in the context).
 */
export function generationDefaultsOf(gen: GenerationConfig | null): Partial<SamplingParams> {
  return {
    ...(gen?.maxNewTokens !== undefined ? { maxTokens: gen.maxNewTokens } : {}),
    ...(gen?.temperature !== undefined ? { temperature: gen.temperature } : {}),
    ...(gen?.topP !== undefined ? { topP: gen.topP } : {}),
    ...(gen?.topK !== undefined ? { topK: gen.topK } : {}),
    ...(gen?.minP !== undefined ? { minP: gen.minP } : {}),
    ...(gen?.repetitionPenalty !== undefined ? { repetitionPenalty: gen.repetitionPenalty } : {}),
  };
}

/** One line on the defaults in use, e.g. `Sampling defaults: temperature 0.6, top_p 0.95 (...)`. */
export function generationDefaultsLine(resolved: ResolvedGenerationConfig): string {
  const d = generationDefaultsOf(resolved.config);
  const parts = [
    d.temperature !== undefined ? `temperature ${d.temperature}` : null,
    d.topP !== undefined ? `top_p ${d.topP}` : null,
    d.topK !== undefined ? `top_k ${d.topK}` : null,
    d.minP !== undefined ? `min_p ${d.minP}` : null,
    d.repetitionPenalty !== undefined ? `repetition_penalty ${d.repetitionPenalty}` : null,
    d.maxTokens != null ? `max_new_tokens ${d.maxTokens} (a limit on every request)` : null,
  ].filter((p) => p !== null);
  return `Sampling defaults: ${parts.length > 0 ? parts.join(", ") : "none"} (${resolved.from})`;
}
