/**
 * Writes a complete Hugging Face style checkpoint with random weights for a preset (see
 * engine/model/presets.ts): config.json, generation_config.json, model.safetensors (or N shards
 * plus model.safetensors.index.json), tokenizer.json, tokenizer_config.json (with a chat
 * template) and special_tokens_map.json.
 *
 * ```sh
 * deno task make-model --out DIR --preset tiny-qwen3 [--dtype f32|f16|bf16] [--seed N] [--shards N]
 *   [--layout save-pretrained|hub|unprefixed] [--fp8 block|channel|tensor [--fp8-block N]]
 *   [--gptq 4|8 [--asym] [--act-order] [--gptq-v2] | --awq | --pack-quantized 4|8 [--asym] [--act-order]] [--group-size N]
 * ```
 *
 * Weights are deterministic in `--seed` and independent of `--shards` (each tensor draws from its
 * own stream seeded by the seed and the tensor's name); the same seed in another dtype gives the
 * same values rounded differently. Tensors are generated and written one at a time, so memory
 * stays around the size of the largest tensor (a 1.2 GB qwen3-0.6b bf16 checkpoint needs ~0.3 GB).
 * `--layout` names the tensors as `save_pretrained` does (default), as the hub's files have them
 * (GPT-2: unprefixed, with causal-mask buffers), or unprefixed (tools/checkpoint_layout.ts).
 * `--fp8` writes an FP8 checkpoint (Llama-family presets): every layer's linear projection as
 * `F8_E4M3` with a BF16 scale tensor, the other tensors in `--dtype`, and the
 * `quantization_config` saying so in config.json (tools/fp8_weights.ts): `block`, as Qwen's
 * `-FP8` releases are (a `weight_scale_inv` per block of `--fp8-block`, default 128, squared), or
 * `channel` / `tensor`, as llm-compressor's `FP8_DYNAMIC` compressed-tensors checkpoints are (a
 * `weight_scale` per output channel or per tensor). `--gptq BITS` and `--awq` write those
 * projections as GPTQ or AWQ packed integers, `--pack-quantized BITS` as a compressed-tensors
 * W4A16 / W8A16 checkpoint (tools/packed_int_weights.ts; `--group-size`
 * inputs per group, default 128; `--group-size=-1`: one group per row), F16 scales, the rest in
 * `--dtype`.
 *
 * @module
 */

import { MAKE_MODEL_USAGE, parseMakeModelArgs } from "./make_model_args.ts";
import {
  type Fp8CheckpointLayout,
  fp8QuantizationConfig,
  fp8ScaleTensor,
  quantizeFp8,
} from "./fp8_weights.ts";
import {
  type PackedIntLayout,
  packedIntQuantizationConfig,
  packedPartSpecs,
  quantizePackedInt,
} from "./packed_int_weights.ts";
import { type CheckpointLayout, type LaidOutTensor, layOut } from "./checkpoint_layout.ts";
import { writeSafetensors } from "../engine/model/safetensors.ts";
import { DTYPE_BYTES } from "../engine/model/safetensors_header.ts";
import type { SafetensorsDType, TensorToWrite } from "../engine/model/safetensors.ts";
import { buildBpeTokenizer } from "../engine/model/bpe_tokenizer_builder.ts";
import {
  type CheckpointDtype,
  getPreset,
  type ModelPreset,
  PRESETS,
  specialTokensOf,
  TOKENIZER_SIZE,
  tokenizerFlavorOf,
} from "../engine/model/presets.ts";
import {
  presetConfig,
  presetGenerationConfig,
  presetSpecialTokensMap,
  presetTokenizerConfig,
  specialIdsOf,
} from "../engine/model/preset_files.ts";
import { presetTensors, type TensorSpec } from "../engine/model/preset_tensors.ts";
import { bf16Bits, randomTensorBytes } from "./random_tensor.ts";

export { parseMakeModelArgs };

/** Options of {@linkcode makeModel}. */
export interface MakeModelOptions {
  /** Output directory (created if missing; existing checkpoint files are overwritten). */
  out: string;
  /** Preset name (a key of `PRESETS`). */
  preset: string;
  /** Storage dtype; default: the preset's `defaultDtype`. */
  dtype?: CheckpointDtype;
  /** Random seed (unsigned 32-bit); default 0. */
  seed?: number;
  /** Number of safetensors shards; 1 (default) writes a single `model.safetensors`. */
  shards?: number;
  /** Tensor names and extra buffers (tools/checkpoint_layout.ts); default `save-pretrained`. */
  layout?: CheckpointLayout;
  /**
   * The layout of an FP8 checkpoint (see the module doc); undefined (default) writes every tensor
   * in `dtype`.
   */
  fp8?: Fp8CheckpointLayout;
  /** The layout of a GPTQ / AWQ checkpoint; undefined (default): none. */
  packedInt?: PackedIntLayout;
}

/** What {@linkcode makeModel} wrote. */
export interface MadeModel {
  preset: ModelPreset;
  dtype: CheckpointDtype;
  /** Paths of the files written, relative to `out`. */
  files: string[];
  /** Bytes of tensor data (`total_size` of the index). */
  totalSize: number;
  /** Tensor name -> shard file name. */
  weightMap: Map<string, string>;
}

const SAFETENSORS_DTYPE: Record<CheckpointDtype, SafetensorsDType> = {
  f32: "F32",
  f16: "F16",
  bf16: "BF16",
};

/** A layer's linear projection: what an FP8 checkpoint stores as F8_E4M3. */
const FP8_WEIGHT = /(^|\.)layers\.\d+\..*_proj\.weight$/;

/**
 * The tensor(s) one laid-out tensor is written as: itself in `dtype`, or, for a projection of an
 * FP8 checkpoint, its F8_E4M3 codes and BF16 scale tensor (quantized once, when the codes are
 * written, which comes first).
 */
function tensorsToWrite(
  t: LaidOutTensor,
  dtype: CheckpointDtype,
  seed: number,
  fp8: Fp8CheckpointLayout | undefined,
  packedInt: PackedIntLayout | undefined,
): TensorToWrite[] {
  const spec = t.spec;
  if (spec === null) return [t.buffer!];
  if (packedInt !== undefined && FP8_WEIGHT.test(t.name) && spec.shape.length === 2) {
    return packedTensors(t.name, spec, seed, packedInt);
  }
  if (fp8 === undefined || !FP8_WEIGHT.test(t.name) || spec.shape.length !== 2) {
    return [{
      name: t.name,
      dtype: SAFETENSORS_DTYPE[dtype],
      shape: spec.shape,
      data: () => randomTensorBytes(spec, dtype, seed),
    }];
  }
  const [rows, cols] = spec.shape as [number, number];
  let weight: ReturnType<typeof quantizeFp8> | undefined;
  const quantized = () => {
    if (weight === undefined) {
      const values = new Float32Array(randomTensorBytes(spec, "f32", seed).buffer);
      weight = quantizeFp8(values, rows, cols, fp8);
    }
    return weight;
  };
  const scale = fp8ScaleTensor(t.name, rows, cols, fp8);
  return [
    { name: t.name, dtype: "F8_E4M3", shape: spec.shape, data: () => quantized().codes },
    {
      ...scale,
      dtype: "BF16",
      data: () => new Uint8Array(bf16Bits(quantized().scales).buffer),
    },
  ];
}

/**
 * A projection of a GPTQ / AWQ / `pack-quantized` checkpoint: its parts (`X.qweight`,
 * `X.weight_packed`, ...; tools/packed_int_weights.ts), quantized once from the projection's f32
 * values when the first is written.
 */
function packedTensors(
  name: string,
  spec: TensorSpec,
  seed: number,
  layout: PackedIntLayout,
): TensorToWrite[] {
  const [rows, cols] = spec.shape as [number, number];
  let packed: ReturnType<typeof quantizePackedInt> | undefined;
  const quantized = () => {
    if (packed === undefined) {
      const values = new Float32Array(randomTensorBytes(spec, "f32", seed).buffer);
      packed = quantizePackedInt(values, rows, cols, layout, seed);
    }
    return packed;
  };
  const prefix = name.slice(0, -"weight".length);
  return packedPartSpecs(layout, rows, cols).map(({ suffix, dtype, shape }) => ({
    name: prefix + suffix,
    dtype,
    shape,
    data: () => quantized()[suffix]!.data,
  }));
}

/**
 * Splits tensors (in order) into exactly `shards` contiguous groups of roughly equal bytes.
 *
 * @throws {RangeError} when there are fewer tensors than shards.
 */
export function assignShards(sizes: readonly number[], shards: number): number[] {
  if (sizes.length < shards) {
    throw new RangeError(`Cannot split ${sizes.length} tensors into ${shards} shards`);
  }
  const total = sizes.reduce((a, b) => a + b, 0);
  const target = total / shards;
  const out: number[] = [];
  let shard = 0;
  let current = 0;
  for (let i = 0; i < sizes.length; i++) {
    const size = sizes[i]!;
    const shardsAfter = shards - 1 - shard;
    const tensorsLeft = sizes.length - i;
    if (
      current > 0 && shardsAfter > 0 &&
      (current + size / 2 > target || tensorsLeft <= shardsAfter)
    ) {
      shard++;
      current = 0;
    }
    out.push(shard);
    current += size;
  }
  return out;
}

function shardName(k: number, n: number): string {
  const pad = (x: number) => String(x).padStart(5, "0");
  return `model-${pad(k + 1)}-of-${pad(n)}.safetensors`;
}

async function writeJson(path: string, value: unknown): Promise<void> {
  await Deno.writeTextFile(path, JSON.stringify(value, null, 2) + "\n");
}

/** Generates the checkpoint described by `options` (see module doc). */
export async function makeModel(options: MakeModelOptions): Promise<MadeModel> {
  const preset = getPreset(options.preset);
  const dtype = options.dtype ?? preset.defaultDtype;
  const seed = options.seed ?? 0;
  const shards = options.shards ?? 1;
  if (!Number.isSafeInteger(seed) || seed < 0 || seed > 0xffffffff) {
    throw new RangeError(`Invalid seed ${seed}: expected an integer in [0, 2^32)`);
  }
  if (!Number.isSafeInteger(shards) || shards < 1) {
    throw new RangeError(`Invalid shard count ${shards}: expected a positive integer`);
  }
  const fp8 = options.fp8;
  const packedInt = options.packedInt;
  if (packedInt !== undefined) {
    const g = packedInt.groupSize;
    if (fp8 !== undefined) throw new RangeError("Cannot write a checkpoint both FP8 and packed");
    if (g !== -1 && (!Number.isSafeInteger(g) || g < 1)) {
      throw new RangeError(`Invalid group size ${g}: expected a positive integer or -1`);
    }
    if (preset.architecture === "gpt2") {
      throw new RangeError(
        `Cannot write ${preset.name} as ${packedInt.method}: packed checkpoints are for the Llama-family presets`,
      );
    }
  }
  if (fp8 !== undefined) {
    if (fp8.scheme === "block" && (!Number.isSafeInteger(fp8.block) || fp8.block < 1)) {
      throw new RangeError(`Invalid FP8 block size ${fp8.block}: expected a positive integer`);
    }
    if (preset.architecture === "gpt2") {
      throw new RangeError(
        `Cannot write ${preset.name} as FP8: FP8 checkpoints are for the Llama-family presets`,
      );
    }
  }
  const out = options.out;
  await Deno.mkdir(out, { recursive: true });

  const tokenizer = buildBpeTokenizer({
    flavor: tokenizerFlavorOf(preset),
    vocabSize: TOKENIZER_SIZE,
    specialTokens: specialTokensOf(preset),
    bosToken: preset.architecture === "llama" ? "<|endoftext|>" : undefined,
  });
  const ids = specialIdsOf(preset, tokenizer.specialIds);
  const files: string[] = [];
  const json = async (name: string, value: unknown) => {
    await writeJson(`${out}/${name}`, value);
    files.push(name);
  };
  const config = presetConfig(preset, dtype, ids);
  await json(
    "config.json",
    fp8 !== undefined
      ? { ...config, quantization_config: fp8QuantizationConfig(fp8) }
      : packedInt !== undefined
      ? { ...config, quantization_config: packedIntQuantizationConfig(packedInt) }
      : config,
  );
  await json("generation_config.json", presetGenerationConfig(preset, ids));
  await json("tokenizer.json", tokenizer.json);
  await json("tokenizer_config.json", presetTokenizerConfig(preset, tokenizer.specialIds));
  await json("special_tokens_map.json", presetSpecialTokensMap(preset));

  const laidOut = layOut(presetTensors(preset), preset, options.layout ?? "save-pretrained");
  const specs = laidOut.flatMap((t) => tensorsToWrite(t, dtype, seed, fp8, packedInt));
  const sizes = specs.map((t) => t.shape.reduce((a, d) => a * d, DTYPE_BYTES[t.dtype]!));
  const totalSize = sizes.reduce((a, b) => a + b, 0);
  const metadata = { format: "pt" };
  const weightMap = new Map<string, string>();
  if (shards === 1) {
    await writeSafetensors(`${out}/model.safetensors`, specs, metadata);
    files.push("model.safetensors");
    for (const s of specs) weightMap.set(s.name, "model.safetensors");
  } else {
    const assignment = assignShards(sizes, shards);
    for (let k = 0; k < shards; k++) {
      const name = shardName(k, shards);
      const group = specs.filter((_, i) => assignment[i] === k);
      await writeSafetensors(`${out}/${name}`, group, metadata);
      files.push(name);
      for (const s of group) weightMap.set(s.name, name);
    }
    const sortedMap: Record<string, string> = {};
    for (const name of [...weightMap.keys()].sort()) sortedMap[name] = weightMap.get(name)!;
    await json("model.safetensors.index.json", {
      metadata: { total_size: totalSize },
      weight_map: sortedMap,
    });
  }
  return { preset, dtype, files, totalSize, weightMap };
}

if (import.meta.main) {
  let options: MakeModelOptions;
  try {
    options = parseMakeModelArgs(Deno.args);
  } catch (e) {
    if (Deno.args.includes("--help")) {
      console.log(`${MAKE_MODEL_USAGE}\npresets: ${Object.keys(PRESETS).join(", ")}`);
      Deno.exit(0);
    }
    console.error(`make_model: ${e instanceof Error ? e.message : e} (${MAKE_MODEL_USAGE})`);
    Deno.exit(2);
  }
  const t0 = performance.now();
  const made = await makeModel(options);
  const seconds = ((performance.now() - t0) / 1000).toFixed(1);
  console.log(
    `wrote ${made.preset.name} (${made.dtype}, ${
      (made.totalSize / 1e6).toFixed(1)
    } MB of weights, ${made.files.length} files) to ${options.out} in ${seconds} s`,
  );
}
