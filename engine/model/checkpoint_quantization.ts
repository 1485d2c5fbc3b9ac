/**
 * A checkpoint's own quantization: `config.json`'s `quantization_config`, as transformers
 * writes it for pre-quantized weights. One kind is served: fine-grained FP8
 * (`quant_method: "fp8"`, `fmt: "e4m3"`, `weight_block_size: [bm, bn]`, dynamic activation
 * scales: Qwen's `-FP8` and DeepSeek-V3's releases), dequantized while loading
 * (engine/model/fp8.ts). Every other method (GPTQ, AWQ, bitsandbytes, compressed-tensors, ...)
 * is refused with one line that names it and says what loads instead.
 *
 * @module
 */

import { z } from "zod";
import { ConfigError, describeValue } from "./errors.ts";

/** The quantization of a checkpoint's weights as stored (null: none, plain F32 / F16 / BF16). */
export interface CheckpointQuantization {
  readonly method: "fp8";
  /** Weight rows per scale (`weight_block_size[0]`). */
  readonly blockRows: number;
  /** Weight columns per scale (`weight_block_size[1]`). */
  readonly blockCols: number;
}

const positiveInt = z.number().int().positive();

const fp8Schema = z.object({
  quant_method: z.literal("fp8"),
  fmt: z.literal("e4m3").optional(),
  activation_scheme: z.literal("dynamic").optional(),
  weight_block_size: z.tuple([positiveInt, positiveInt]),
});

/** What to load instead, for the refusals. */
const INSTEAD =
  "this server loads F32 / F16 / BF16 checkpoints (quantizing them itself with --quantization int8|int4) and fine-grained FP8 ones";

/**
 * The `quantization_config` of a parsed `config.json` (`raw`), or null when it has none.
 *
 * @throws {ConfigError} `"<source>: ..."` for a method other than fine-grained FP8, or an FP8
 *   configuration this engine does not read (another format, static activation scales, no
 *   `weight_block_size`).
 */
export function parseCheckpointQuantization(
  raw: unknown,
  source: string,
): CheckpointQuantization | null {
  const q = typeof raw === "object" && raw !== null
    ? Reflect.get(raw, "quantization_config")
    : undefined;
  if (q === undefined || q === null) return null;
  if (typeof q !== "object" || Array.isArray(q)) {
    throw new ConfigError(
      `${source}: "quantization_config" must be an object, got ${describeValue(q)}`,
    );
  }
  const method = Reflect.get(q, "quant_method");
  if (method !== "fp8") {
    throw new ConfigError(
      `${source}: the weights are pre-quantized with quant_method ${
        describeValue(method)
      }, which this engine cannot read; ${INSTEAD}`,
    );
  }
  const parsed = fp8Schema.safeParse(q);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const field = issue.path.join(".") || "quantization_config";
    const value = issue.path.reduce<unknown>(
      (v, k) => (typeof v === "object" && v !== null ? Reflect.get(v, k) : undefined),
      q,
    );
    throw new ConfigError(
      `${source}: quantization_config.${field} ${describeValue(value)} is not supported: ` +
        `FP8 weights load with fmt "e4m3", activation_scheme "dynamic" and a weight_block_size [rows, cols]`,
    );
  }
  const [blockRows, blockCols] = parsed.data.weight_block_size;
  return { method: "fp8", blockRows, blockCols };
}
