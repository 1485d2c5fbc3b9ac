/**
 * A checkpoint's own quantization: `config.json`'s `quantization_config`, as transformers and
 * llm-compressor write it for pre-quantized weights. Two FP8 (`float8_e4m3fn`) layouts are
 * served, both dequantized while loading (engine/model/fp8.ts):
 *
 * - transformers' fine-grained FP8 (`quant_method: "fp8"`, `fmt: "e4m3"`, dynamic activation
 *   scales, `weight_block_size: [bm, bn]`; Qwen's `-FP8` and DeepSeek-V3's releases): a
 *   `weight_scale_inv` of `[ceil(rows / bm), ceil(cols / bn)]` beside each FP8 weight;
 * - compressed-tensors' `float-quantized` format (`quant_method: "compressed-tensors"`; the
 *   `FP8_DYNAMIC` / `FP8_BLOCK` schemes of llm-compressor, e.g. RedHatAI's `-FP8-dynamic` models):
 *   8-bit symmetric float weights with a `weight_scale` per tensor (`[1]`), per output channel
 *   (`[rows, 1]`) or per block (`block_structure`), static weights and dynamic (or no) activation
 *   quantization, no KV-cache scheme, sparsity or transforms.
 *
 * And three packed-integer layouts (engine/model/packed_int.ts), dequantized while loading or,
 * with `--quantization int8|int4`, their codes and scales kept as they are where the format holds
 * them:
 *
 * - GPTQ (`quant_method: "gptq"`; AutoGPTQ / GPTQModel / optimum, Qwen's `-GPTQ-Int4` and
 *   `-GPTQ-Int8` releases): 4- or 8-bit codes packed along the input dimension in `qweight`,
 *   zero points in `qzeros`, scales in `scales` per `group_size` inputs (a `g_idx` mapping each
 *   input to its group under `desc_act`), `checkpoint_format` `gptq` (zero points stored minus
 *   one) or `gptq_v2`;
 * - AWQ (`quant_method: "awq"`, `version: "gemm"`; AutoAWQ, Qwen's `-AWQ` releases): 4-bit codes
 *   packed along the output dimension in AWQ's interleaved order, zero points and scales per
 *   `group_size` inputs;
 * - compressed-tensors' `pack-quantized` format (llm-compressor's W4A16 / W8A16 schemes, e.g.
 *   RedHatAI's `-quantized.w4a16` models): 4- or 8-bit integer weights per group or channel,
 *   symmetric or with zero points, no activation quantization.
 *
 * Every other method or variant (bitsandbytes, compressed-tensors' W8A8 `int-quantized` and
 * FP4 formats, static activation scales, 2- or 3-bit GPTQ, AWQ's GEMV layouts, ...) is refused with one line that
 * names it and says what loads instead.
 *
 * @module
 */

import { z } from "zod";
import type { Quantization, QuantizationChoice } from "../../gpu/quant.ts";
import { ConfigError, describeValue } from "./errors.ts";

/** Which weights share one FP8 scale. */
export type Fp8Scaling =
  | { readonly kind: "tensor" }
  | { readonly kind: "channel" }
  | { readonly kind: "block"; readonly rows: number; readonly cols: number };

/** A checkpoint of FP8 weights (engine/model/fp8.ts). */
export interface Fp8Quantization {
  /** `quantization_config.quant_method`. */
  readonly method: "fp8" | "compressed-tensors";
  /** The name of an FP8 weight's scale tensor, in place of its final `weight`. */
  readonly scaleSuffix: "weight_scale_inv" | "weight_scale";
  readonly scaling: Fp8Scaling;
}

/** How a packed-integer checkpoint lays its tensors out (engine/model/packed_int.ts). */
export type PackedIntLayout = "gptq" | "awq" | "pack-quantized";

/**
 * A checkpoint of GPTQ, AWQ or compressed-tensors `pack-quantized` integer weights
 * (engine/model/packed_int.ts).
 */
export interface PackedIntQuantization {
  /** `quantization_config.quant_method`. */
  readonly method: "gptq" | "awq" | "compressed-tensors";
  readonly layout: PackedIntLayout;
  /** Bits per code (AWQ: 4). */
  readonly bits: 4 | 8;
  /** Inputs per scale and zero point; null: one group spans every input (`group_size: -1`). */
  readonly groupSize: number | null;
  /**
   * Whether the inputs were ordered by activation (GPTQ's `desc_act`, compressed-tensors'
   * `actorder: "group"`): groups follow a `g_idx`, not the inputs' order.
   */
  readonly actOrder: boolean;
  /**
   * Whether the codes were written symmetric (GPTQ `sym`, compressed-tensors `symmetric`; AWQ:
   * false, `zero_point` true).
   */
  readonly symmetric: boolean;
  /** Added to every stored zero point: 1 for GPTQ's original format (`gptq`), else 0. */
  readonly zeroOffset: 0 | 1;
}

/** The quantization of a checkpoint's weights as stored (null: none, plain F32 / F16 / BF16). */
export type CheckpointQuantization = Fp8Quantization | PackedIntQuantization;

/** Whether `q` is a packed-integer quantization (GPTQ, AWQ, `pack-quantized`). */
export function isPackedInt(q: CheckpointQuantization): q is PackedIntQuantization {
  return "layout" in q;
}

/** The name of a packed-integer layout in the load log and errors. */
export function packedLayoutName(layout: PackedIntLayout): string {
  return layout === "pack-quantized" ? "compressed-tensors pack-quantized" : layout.toUpperCase();
}

/** How a checkpoint's quantization reads in the load log. */
export function describeCheckpointQuantization(q: CheckpointQuantization): string {
  if (!isPackedInt(q)) {
    return `FP8 (e4m3) weights of the checkpoint (${q.method}), scaled ${
      describeScaling(q.scaling)
    }`;
  }
  const groups = q.groupSize === null ? "one group per row" : `groups of ${q.groupSize}`;
  return `${packedLayoutName(q.layout)} ${q.bits}-bit weights of the checkpoint (${groups}, ${
    q.symmetric ? "symmetric" : "with zero points"
  }${q.actOrder ? ", act-order" : ""})`;
}

/** Rows and columns of a `[rows, cols]` FP8 weight that share one scale under `scaling`. */
export function scaleBlock(scaling: Fp8Scaling, rows: number, cols: number): [number, number] {
  switch (scaling.kind) {
    case "tensor":
      return [rows, cols];
    case "channel":
      return [1, cols];
    case "block":
      return [scaling.rows, scaling.cols];
  }
}

/** How `scaling` reads in the load log ("per block of 128 x 128", "per output channel", ...). */
export function describeScaling(scaling: Fp8Scaling): string {
  switch (scaling.kind) {
    case "tensor":
      return "per tensor";
    case "channel":
      return "per output channel";
    case "block":
      return `per block of ${scaling.rows} x ${scaling.cols}`;
  }
}

const positiveInt = z.number().int().positive();

const fp8Schema = z.object({
  quant_method: z.literal("fp8"),
  fmt: z.literal("e4m3").optional(),
  activation_scheme: z.literal("dynamic").optional(),
  weight_block_size: z.tuple([positiveInt, positiveInt]),
});

/** compressed-tensors' `QuantizationArgs` of FP8 weights this engine reads. */
const ctWeights = z.object({
  num_bits: z.literal(8),
  type: z.literal("float"),
  symmetric: z.literal(true).optional(),
  strategy: z.enum(["tensor", "channel", "block"]),
  block_structure: z.tuple([positiveInt, positiveInt]).nullish(),
  dynamic: z.literal(false).optional(),
  group_size: z.null().optional(),
  actorder: z.null().optional(),
});

const ctSchema = z.object({
  quant_method: z.literal("compressed-tensors"),
  format: z.enum(["float-quantized", "naive-quantized"]),
  quantization_status: z.literal("compressed").optional(),
  kv_cache_scheme: z.null().optional(),
  // llm-compressor writes a "dense" sparsity config (nothing compressed) beside quantization.
  sparsity_config: z.union([z.null(), z.object({ format: z.literal("dense").optional() })])
    .optional(),
  transform_config: z.null().optional(),
  config_groups: z.record(
    z.string(),
    z.object({
      weights: ctWeights,
      // Activations quantized on the fly by the original (this engine keeps them in f32).
      input_activations: z.union([z.null(), z.object({ dynamic: z.literal(true) })]).optional(),
      output_activations: z.null().optional(),
      format: z.enum(["float-quantized", "naive-quantized"]).nullish(),
    }),
  ),
});

/** compressed-tensors' `QuantizationArgs` of integer weights packed in int32 (`pack-quantized`). */
const ctIntWeights = z.object({
  num_bits: z.union([z.literal(4), z.literal(8)]),
  type: z.literal("int"),
  symmetric: z.boolean().optional(),
  strategy: z.enum(["group", "channel"]),
  group_size: positiveInt.nullish(),
  block_structure: z.null().optional(),
  dynamic: z.literal(false).optional(),
  // "weight" reorders while quantizing only; "group" stores a weight_g_idx.
  actorder: z.enum(["group", "weight"]).nullish(),
});

/** llm-compressor's W4A16 / W8A16 checkpoints (e.g. RedHatAI's `-quantized.w4a16` models). */
const ctPackedSchema = z.object({
  quant_method: z.literal("compressed-tensors"),
  format: z.literal("pack-quantized"),
  quantization_status: z.literal("compressed").optional(),
  kv_cache_scheme: z.null().optional(),
  sparsity_config: ctSchema.shape.sparsity_config,
  transform_config: z.null().optional(),
  config_groups: z.record(
    z.string(),
    z.object({
      weights: ctIntWeights,
      input_activations: z.null().optional(),
      output_activations: z.null().optional(),
      format: z.literal("pack-quantized").nullish(),
    }),
  ),
});

/** GPTQ's `quantization_config` (transformers' GPTQConfig, GPTQModel) as far as it matters here. */
const gptqSchema = z.object({
  quant_method: z.literal("gptq"),
  bits: z.union([z.literal(4), z.literal(8)]),
  group_size: z.union([positiveInt, z.literal(-1)]),
  desc_act: z.boolean().optional(),
  sym: z.boolean().optional(),
  checkpoint_format: z.enum(["gptq", "gptq_v2"]).optional(),
  // GPTQModel's per-module overrides of bits or group size.
  dynamic: z.union([z.null(), z.object({}).strict()]).optional(),
});

/** AWQ's (transformers' AwqConfig, AutoAWQ). */
const awqSchema = z.object({
  quant_method: z.literal("awq"),
  bits: z.literal(4),
  group_size: z.union([positiveInt, z.literal(-1)]),
  zero_point: z.literal(true).optional(),
  version: z.literal("gemm").optional(),
});

/** What to load instead, for the refusals. */
const INSTEAD =
  "this server loads F32 / F16 / BF16 checkpoints (quantizing them itself with --quantization int8|int4), FP8 ones (quant_method fp8, or compressed-tensors float-quantized), 4- or 8-bit GPTQ and compressed-tensors pack-quantized ones, and 4-bit AWQ (GEMM) ones";

/** A one-line refusal naming the first field `parsed` failed on and its value. */
function unsupported(error: z.ZodError, q: object, source: string, what: string): ConfigError {
  const issue = error.issues[0]!;
  const field = issue.path.join(".") || "quantization_config";
  const value = issue.path.reduce<unknown>(
    (v, k) => (typeof v === "object" && v !== null ? Reflect.get(v, k) : undefined),
    q,
  );
  return new ConfigError(
    `${source}: quantization_config.${field} ${describeValue(value)} is not supported: ${what}`,
  );
}

/**
 * The `quantization_config` of a parsed `config.json` (`raw`), or null when it has none.
 *
 * @throws {ConfigError} `"<source>: ..."` for a method other than the four layouts above, or a
 *   variant of them this engine does not read.
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
  if (method === "fp8") {
    const parsed = fp8Schema.safeParse(q);
    if (!parsed.success) {
      throw unsupported(
        parsed.error,
        q,
        source,
        `FP8 weights load with fmt "e4m3", activation_scheme "dynamic" and a weight_block_size [rows, cols]`,
      );
    }
    const [rows, cols] = parsed.data.weight_block_size;
    return { method, scaleSuffix: "weight_scale_inv", scaling: { kind: "block", rows, cols } };
  }
  if (method === "compressed-tensors" && Reflect.get(q, "format") === "pack-quantized") {
    return parsePackQuantized(q, source);
  }
  if (method === "compressed-tensors") {
    const parsed = ctSchema.safeParse(q);
    if (!parsed.success) {
      throw unsupported(
        parsed.error,
        q,
        source,
        "compressed-tensors checkpoints load as float-quantized 8-bit symmetric weights per tensor, channel or block, with dynamic or no activation quantization, and no KV-cache scheme, sparsity or transform",
      );
    }
    const weights = Object.values(parsed.data.config_groups).map((g) => g.weights);
    const first = weights[0];
    if (first === undefined || weights.some((w) => JSON.stringify(w) !== JSON.stringify(first))) {
      throw new ConfigError(
        `${source}: quantization_config.config_groups must hold one weight scheme (found ${weights.length} different or none)`,
      );
    }
    const block = first.block_structure;
    if (first.strategy === "block" && (block === undefined || block === null)) {
      throw new ConfigError(
        `${source}: quantization_config.config_groups: the block strategy needs a block_structure [rows, cols]`,
      );
    }
    const scaling: Fp8Scaling = first.strategy === "block"
      ? { kind: "block", rows: block![0], cols: block![1] }
      : { kind: first.strategy };
    return { method, scaleSuffix: "weight_scale", scaling };
  }
  if (method === "gptq") {
    const parsed = gptqSchema.safeParse(q);
    if (!parsed.success) {
      throw unsupported(
        parsed.error,
        q,
        source,
        "GPTQ checkpoints load with bits 4 or 8, a group_size, checkpoint_format gptq or gptq_v2, and no per-module dynamic overrides",
      );
    }
    const g = parsed.data;
    return {
      method,
      layout: "gptq",
      bits: g.bits,
      groupSize: g.group_size === -1 ? null : g.group_size,
      actOrder: g.desc_act ?? false,
      symmetric: g.sym ?? true,
      zeroOffset: (g.checkpoint_format ?? "gptq") === "gptq" ? 1 : 0,
    };
  }
  if (method === "awq") {
    const parsed = awqSchema.safeParse(q);
    if (!parsed.success) {
      throw unsupported(
        parsed.error,
        q,
        source,
        'AWQ checkpoints load with bits 4, a group_size, zero_point true and version "gemm"',
      );
    }
    const a = parsed.data;
    return {
      method,
      layout: "awq",
      bits: 4,
      groupSize: a.group_size === -1 ? null : a.group_size,
      actOrder: false,
      symmetric: false,
      zeroOffset: 0,
    };
  }
  throw new ConfigError(
    `${source}: the weights are pre-quantized with quant_method ${
      describeValue(method)
    }, which this engine cannot read; ${INSTEAD}`,
  );
}

/** compressed-tensors' `pack-quantized` config (its caller checked `format`). */
function parsePackQuantized(q: object, source: string): PackedIntQuantization {
  const parsed = ctPackedSchema.safeParse(q);
  if (!parsed.success) {
    throw unsupported(
      parsed.error,
      q,
      source,
      "pack-quantized checkpoints load as 4- or 8-bit integer weights per group or channel, with no activation quantization, KV-cache scheme, sparsity or transform",
    );
  }
  const weights = Object.values(parsed.data.config_groups).map((g) => g.weights);
  const w = weights[0];
  if (w === undefined || weights.some((x) => JSON.stringify(x) !== JSON.stringify(w))) {
    throw new ConfigError(
      `${source}: quantization_config.config_groups must hold one weight scheme (found ${weights.length} different or none)`,
    );
  }
  const groupSize = w.group_size ?? null;
  if (w.strategy === "group" && groupSize === null) {
    throw new ConfigError(
      `${source}: quantization_config.config_groups: the group strategy needs a group_size`,
    );
  }
  return {
    method: "compressed-tensors",
    layout: "pack-quantized",
    bits: w.num_bits,
    groupSize: w.strategy === "group" ? groupSize : null,
    actOrder: w.actorder === "group",
    symmetric: w.symmetric ?? true,
    zeroOffset: 0,
  };
}

/**
 * The quantization `choice` means for a checkpoint quantized as `q`: `auto` is `none` for a
 * checkpoint of plain or FP8 weights; for a packed-integer one, `int4` when its codes are
 * symmetric 4-bit ones in contiguous groups (the format holds them exactly), else `int8` (exact
 * for the other 4-bit codes and symmetric 8-bit ones; the values quantized again otherwise).
 * Any other choice stands.
 */
export function resolveQuantization(
  choice: QuantizationChoice,
  q: CheckpointQuantization | null,
): Quantization {
  if (choice !== "auto") return choice;
  if (q === null || !isPackedInt(q)) return "none";
  const contiguous = !q.actOrder || q.groupSize === null;
  return q.bits === 4 && q.symmetric && contiguous ? "int4" : "int8";
}
