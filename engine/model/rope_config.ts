/**
 * RoPE in a Hugging Face `config.json`: the base (`rope_theta`) and the frequency scaling
 * (`rope_scaling` in transformers 4.x, `rope_parameters` in 5.x): none, `linear` or `llama3`.
 *
 * @module
 */

import { z } from "zod";
import { ConfigError, describeValue, requiredField } from "./errors.ts";

const posInt = z.number().int().positive();
const posNum = z.number().positive();

/**
 * RoPE frequency scaling. `none`: plain RoPE. `linear`: positions divided by `factor`
 * (equivalently every inverse frequency divided by it). `llama3`: Llama 3.1's wavelength-banded
 * scaling (see {@linkcode ropeInvFreq}).
 */
export type RopeScaling =
  | { readonly type: "none" }
  | { readonly type: "linear"; readonly factor: number }
  | {
    readonly type: "llama3";
    readonly factor: number;
    readonly lowFreqFactor: number;
    readonly highFreqFactor: number;
    readonly originalMaxPositionEmbeddings: number;
  };

/** A `rope_scaling` / `rope_parameters` object (unknown fields ignored). */
export const ropeDict = z.looseObject({
  rope_type: z.string().optional(),
  type: z.string().optional(),
  rope_theta: posNum.optional(),
  factor: posNum.optional(),
  low_freq_factor: posNum.optional(),
  high_freq_factor: posNum.optional(),
  original_max_position_embeddings: posInt.optional(),
});
type RopeDict = z.infer<typeof ropeDict>;

/** The config fields RoPE is read from. */
export interface RopeFields {
  readonly rope_theta?: number | undefined;
  readonly rope_scaling?: RopeDict | null | undefined;
  readonly rope_parameters?: RopeDict | null | undefined;
}

/**
 * The RoPE base and scaling of a config: transformers 5.x's `rope_parameters`, or 4.x's
 * `rope_theta` and `rope_scaling` (`rope_type` or `type`), default theta 10000.
 *
 * @throws {ConfigError} naming the field: an unsupported type or a missing parameter.
 */
export function parseRope(
  source: string,
  raw: RopeFields,
): { theta: number; scaling: RopeScaling } {
  // transformers 5.x: everything under rope_parameters; 4.x: rope_theta + rope_scaling.
  let dict: RopeDict | null | undefined;
  let key: string;
  let theta: number | undefined;
  if (raw.rope_parameters !== undefined && raw.rope_parameters !== null) {
    dict = raw.rope_parameters;
    key = "rope_parameters";
    theta = dict.rope_theta ?? raw.rope_theta;
  } else {
    dict = raw.rope_scaling;
    key = "rope_scaling";
    theta = raw.rope_theta ?? dict?.rope_theta;
  }
  theta ??= 10000;
  if (dict === undefined || dict === null) return { theta, scaling: { type: "none" } };
  const typeField = dict.rope_type !== undefined ? "rope_type" : "type";
  const type = dict.rope_type ?? dict.type ?? "default";
  const need = <T>(v: T | undefined, f: string): T => requiredField(source, v, `${key}.${f}`);
  switch (type) {
    case "default":
      return { theta, scaling: { type: "none" } };
    case "linear":
      return { theta, scaling: { type: "linear", factor: need(dict.factor, "factor") } };
    case "llama3": {
      const scaling: RopeScaling = {
        type: "llama3",
        factor: need(dict.factor, "factor"),
        lowFreqFactor: need(dict.low_freq_factor, "low_freq_factor"),
        highFreqFactor: need(dict.high_freq_factor, "high_freq_factor"),
        originalMaxPositionEmbeddings: need(
          dict.original_max_position_embeddings,
          "original_max_position_embeddings",
        ),
      };
      if (scaling.highFreqFactor <= scaling.lowFreqFactor) {
        throw new ConfigError(
          `${source}: ${key}.high_freq_factor (${scaling.highFreqFactor}) must exceed low_freq_factor (${scaling.lowFreqFactor})`,
        );
      }
      return { theta, scaling };
    }
    default:
      throw new ConfigError(
        `${source}: unsupported ${key}.${typeField} ${
          describeValue(type)
        } (supported: default, linear, llama3)`,
      );
  }
}
