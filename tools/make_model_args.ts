/**
 * The command line of tools/make_model.ts (`deno task make-model`), parsed into its options.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { CHECKPOINT_LAYOUTS, type CheckpointLayout } from "./checkpoint_layout.ts";
import { FP8_SCHEMES, type Fp8CheckpointLayout } from "./fp8_weights.ts";
import type { PackedIntLayout } from "./packed_int_weights.ts";
import type { MakeModelOptions } from "./make_model.ts";
import { getPreset, PRESETS } from "../engine/model/presets.ts";

/** `weight_block_size` of `--fp8 block` without `--fp8-block` (Qwen's and DeepSeek's). */
const DEFAULT_FP8_BLOCK = 128;

/** The usage line of `deno task make-model`. */
export const MAKE_MODEL_USAGE =
  "usage: deno task make-model --out DIR --preset NAME [--dtype f32|f16|bf16] " +
  "[--seed N] [--shards N] [--layout save-pretrained|hub|unprefixed] [--fp8 block|channel|tensor] [--fp8-block N] " +
  "[--gptq 4|8 [--asym] [--act-order] [--gptq-v2] | --awq | --pack-quantized 4|8 [--asym] [--act-order]] [--group-size N]";

function parseCount(flag: string, value: string | undefined, min: number): number | undefined {
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value) || Number(value) < min || Number(value) > 0xffffffff) {
    throw new TypeError(`--${flag} must be an integer >= ${min}, got "${value}"`);
  }
  return Number(value);
}

/** The packed-integer flags: `--gptq 4|8`, `--awq`, `--pack-quantized 4|8`, `--group-size`, ... */
function parsePackedInt(values: {
  gptq?: string;
  awq?: boolean;
  "pack-quantized"?: string;
  "group-size"?: string;
  asym?: boolean;
  "act-order"?: boolean;
  "gptq-v2"?: boolean;
}): PackedIntLayout | undefined {
  const chosen = [
    values.gptq !== undefined ? "--gptq" : "",
    values.awq === true ? "--awq" : "",
    values["pack-quantized"] !== undefined ? "--pack-quantized" : "",
  ].filter((f) => f !== "");
  const variant = (["asym", "act-order", "gptq-v2"] as const).find((f) => values[f] === true);
  if (chosen.length === 0) {
    const stray = variant ?? (values["group-size"] !== undefined ? "group-size" : undefined);
    if (stray !== undefined) {
      throw new TypeError(`--${stray} needs --gptq, --awq or --pack-quantized`);
    }
    return undefined;
  }
  if (chosen.length > 1) throw new TypeError(`${chosen.join(" and ")} exclude each other`);
  const text = values["group-size"];
  if (text !== undefined && text !== "-1" && !/^[1-9]\d*$/.test(text)) {
    throw new TypeError(`--group-size must be a positive integer or -1, got "${text}"`);
  }
  const groupSize = text === undefined ? 128 : Number(text);
  if (values.awq === true) {
    if (variant !== undefined) throw new TypeError(`--${variant} is not for --awq`);
    return { method: "awq", bits: 4, groupSize };
  }
  const flag = chosen[0]!;
  const bits = values.gptq ?? values["pack-quantized"];
  if (bits !== "4" && bits !== "8") throw new TypeError(`${flag} must be 4 or 8, got "${bits}"`);
  if (flag === "--pack-quantized" && values["gptq-v2"] === true) {
    throw new TypeError("--gptq-v2 is for --gptq, not --pack-quantized");
  }
  return {
    method: flag === "--gptq" ? "gptq" : "compressed-tensors",
    bits: bits === "4" ? 4 : 8,
    groupSize,
    symmetric: values.asym !== true,
    actOrder: values["act-order"] === true,
    ...(flag === "--gptq" ? { v2: values["gptq-v2"] === true } : {}),
  };
}

/** Parses command-line arguments into {@linkcode MakeModelOptions}. @throws {TypeError} */
export function parseMakeModelArgs(args: string[]): MakeModelOptions {
  let values;
  try {
    ({ values } = parseArgs({
      args,
      options: {
        out: { type: "string" },
        preset: { type: "string" },
        dtype: { type: "string" },
        seed: { type: "string" },
        shards: { type: "string" },
        layout: { type: "string" },
        fp8: { type: "string" },
        "fp8-block": { type: "string" },
        gptq: { type: "string" },
        awq: { type: "boolean" },
        "pack-quantized": { type: "string" },
        "group-size": { type: "string" },
        asym: { type: "boolean" },
        "act-order": { type: "boolean" },
        "gptq-v2": { type: "boolean" },
        help: { type: "boolean" },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (e) {
    // parseArgs messages can span lines; the CLI reports one.
    throw new TypeError((e instanceof Error ? e.message : String(e)).replaceAll("\n", " "));
  }
  if (values.help === true) throw new TypeError("help requested");
  if (values.out === undefined) throw new TypeError("--out DIR is required");
  if (values.preset === undefined) throw new TypeError("--preset NAME is required");
  if (!Object.hasOwn(PRESETS, values.preset)) {
    throw new TypeError(
      `unknown preset "${values.preset}" (known: ${Object.keys(PRESETS).join(", ")})`,
    );
  }
  const dtype = values.dtype;
  if (dtype !== undefined && dtype !== "f32" && dtype !== "f16" && dtype !== "bf16") {
    throw new TypeError(`--dtype must be f32, f16 or bf16, got "${dtype}"`);
  }
  const layout = values.layout;
  if (layout !== undefined && !(CHECKPOINT_LAYOUTS as readonly string[]).includes(layout)) {
    throw new TypeError(`--layout must be ${CHECKPOINT_LAYOUTS.join(", ")}, got "${layout}"`);
  }
  const scheme = values.fp8;
  if (scheme !== undefined && !(FP8_SCHEMES as readonly string[]).includes(scheme)) {
    throw new TypeError(`--fp8 must be ${FP8_SCHEMES.join(", ")}, got "${scheme}"`);
  }
  if (values["fp8-block"] !== undefined && scheme !== "block") {
    throw new TypeError("--fp8-block needs --fp8 block");
  }
  const fp8: Fp8CheckpointLayout | undefined = scheme === undefined
    ? undefined
    : scheme === "block"
    ? { scheme, block: parseCount("fp8-block", values["fp8-block"], 1) ?? DEFAULT_FP8_BLOCK }
    : { scheme: scheme as "channel" | "tensor" };
  if (fp8 !== undefined && getPreset(values.preset).architecture === "gpt2") {
    throw new TypeError(`--fp8 is for the Llama-family presets, not ${values.preset}`);
  }
  const packedInt = parsePackedInt(values);
  if (packedInt !== undefined && fp8 !== undefined) {
    throw new TypeError("--fp8 and a packed-integer layout exclude each other");
  }
  if (packedInt !== undefined && getPreset(values.preset).architecture === "gpt2") {
    throw new TypeError(
      `packed-integer checkpoints are for the Llama-family presets, not ${values.preset}`,
    );
  }
  return {
    out: values.out,
    preset: values.preset,
    ...(layout !== undefined ? { layout: layout as CheckpointLayout } : {}),
    ...(fp8 !== undefined ? { fp8 } : {}),
    ...(packedInt !== undefined ? { packedInt } : {}),
    dtype,
    seed: parseCount("seed", values.seed, 0),
    shards: parseCount("shards", values.shards, 1),
  };
}
