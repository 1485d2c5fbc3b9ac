/**
 * A Hugging Face checkpoint directory: `config.json` (required), `generation_config.json`
 * (optional), and the weights as one `model.safetensors` or as shards listed by
 * `model.safetensors.index.json` (`weight_map`: tensor name -> shard file), opened by
 * engine/model/checkpoint_files.ts. Opening reads only the JSON files and the safetensors
 * headers; tensor data is streamed on demand in bounded chunks from whichever shard holds it. Tokenizer files are handled elsewhere.
 *
 * Tensors are addressed by their canonical names in every layout transformers loads (prefixed
 * or not; non-weight buffers left out): see engine/model/tensor_names.ts.
 *
 * An FP8 checkpoint (`quantization_config`, engine/model/checkpoint_quantization.ts) stores its
 * projections as `F8_E4M3` with a scale tensor beside each (`weight_scale_inv` or
 * `weight_scale`): such a weight reads as its dequantized values (engine/model/fp8.ts), and its
 * scale tensor is part of it, not a weight of its own. A GPTQ or AWQ checkpoint stores a
 * projection `X.weight` as `X.qweight`, `X.qzeros`, `X.scales` (and GPTQ's `X.g_idx`), a
 * compressed-tensors `pack-quantized` one as `X.weight_packed`, `X.weight_scale`,
 * `X.weight_shape` (and `X.weight_zero_point`, `X.weight_g_idx`): those read as one weight
 * `X.weight` of the `[out, in]` shape the model asks for, whose values are the dequantized ones
 * (engine/model/packed_int.ts), or whose codes the weight loader takes as they are
 * ({@linkcode Checkpoint.packedWeight}).
 *
 * @module
 */

import { join } from "node:path";
import type { DType } from "../../gpu/dtype.ts";
import {
  type CheckpointQuantization,
  isPackedInt,
  type PackedIntQuantization,
  packedLayoutName,
  parseCheckpointQuantization,
  scaleBlock,
} from "./checkpoint_quantization.ts";
import { type ModelConfig, parseModelConfig } from "./config.ts";
import { CheckpointError } from "./errors.ts";
import { dequantizeFp8Chunks, type Fp8BlockScales, fp8ScaleShapes } from "./fp8.ts";
import { type GenerationConfig, parseGenerationConfig } from "./generation_config.ts";
import { dequantizePackedChunks, type PackedWeight } from "./packed_int.ts";
import {
  checkPackedParts,
  groupPackedTensors,
  type PackedParts,
  readPackedWeight,
} from "./packed_tensors.ts";
import { fileExists, openWeightFiles, readCheckpointJson } from "./checkpoint_files.ts";
import type { SafetensorsFile, TensorChunk } from "./safetensors.ts";
import { shapeText, type TensorInfo } from "./safetensors_header.ts";
import { TensorNames } from "./tensor_names.ts";

/** An F8_E4M3 weight's scale tensor and block shape (checked by `expectTensor`). */
interface Fp8Layout {
  readonly scale: CheckpointTensor;
  readonly blockRows: number;
  readonly blockCols: number;
  /** Scales per row of blocks: `ceil(cols / blockCols)`. */
  readonly scaleCols: number;
}

/** A tensor of a checkpoint and the file that holds it. */
export interface CheckpointTensor extends TensorInfo {
  /** Path of the safetensors file (shard) holding the tensor. */
  readonly file: string;
}

/** An open checkpoint. Call {@linkcode close} when done to release the shard files. */
export class Checkpoint {
  /** The checkpoint directory. */
  readonly dir: string;
  readonly config: ModelConfig;
  /** Parsed `generation_config.json`, or null when the checkpoint has none. */
  readonly generationConfig: GenerationConfig | null;
  /** Every weight, by canonical name, across all shards (`name` is the canonical name). */
  readonly tensors: ReadonlyMap<string, CheckpointTensor>;
  /** How the files name their tensors, and the canonical -> stored mapping. */
  readonly names: TensorNames;
  /** The weights' quantization as stored (`config.json`'s `quantization_config`), or null. */
  readonly quantization: CheckpointQuantization | null;
  #files: SafetensorsFile[];
  /** Canonical name -> the file holding it and the name it is stored under. */
  #byTensor: Map<string, { file: SafetensorsFile; stored: string }>;
  /** FP8 weight (canonical name) -> its `weight_scale_inv` tensor. */
  #scales = new Map<string, CheckpointTensor>();
  /** Packed-integer weight (canonical `X.weight`) -> its stored parts by role (`X.qweight`, ...). */
  #packed = new Map<string, PackedParts>();

  private constructor(
    dir: string,
    config: ModelConfig,
    generationConfig: GenerationConfig | null,
    quantization: CheckpointQuantization | null,
    files: SafetensorsFile[],
    byTensor: Map<string, SafetensorsFile>,
  ) {
    this.dir = dir;
    this.config = config;
    this.generationConfig = generationConfig;
    this.quantization = quantization;
    this.#files = files;
    this.names = new TensorNames(config.arch, byTensor.keys());
    this.#byTensor = new Map();
    const tensors = new Map<string, CheckpointTensor>();
    for (const canonical of this.names.canonical()) {
      const stored = this.names.stored(canonical)!;
      const file = byTensor.get(stored)!;
      this.#byTensor.set(canonical, { file, stored });
      tensors.set(canonical, { ...file.tensor(stored), name: canonical, file: file.path });
    }
    if (quantization !== null && isPackedInt(quantization)) {
      this.#packed = groupPackedTensors(quantization, tensors);
    } else if (quantization !== null) {
      // Each scale belongs to the weight beside it (one left without one stays, and a load
      // reports it as a weight the config does not account for).
      const suffix = quantization.scaleSuffix;
      for (const [name, t] of tensors) {
        if (!name.endsWith(`.${suffix}`)) continue;
        const weight = `${name.slice(0, -suffix.length)}weight`;
        if (!tensors.has(weight)) continue;
        this.#scales.set(weight, t);
        tensors.delete(name);
      }
    }
    this.tensors = tensors;
  }

  /**
   * Opens the checkpoint in `dir` (see module doc). `model.safetensors` is used when present,
   * else `model.safetensors.index.json` and its shards.
   *
   * @throws {CheckpointError} (or its subclass ConfigError), one line starting with the file or
   * tensor concerned: missing `config.json`, invalid JSON or config, no weights file, an index
   * pointing at a missing shard or at a tensor its shard lacks, a corrupt safetensors file.
   */
  static async open(dir: string): Promise<Checkpoint> {
    const configPath = join(dir, "config.json");
    const rawConfig = await readCheckpointJson(configPath);
    const config = parseModelConfig(rawConfig, configPath);
    const quantization = parseCheckpointQuantization(rawConfig, configPath);
    if (quantization !== null && isPackedInt(quantization) && config.arch === "GPT2LMHeadModel") {
      throw new CheckpointError(
        `${configPath}: ${
          packedLayoutName(quantization.layout)
        } weights are read for the Llama-family architectures, not ${config.arch}`,
      );
    }
    const genPath = join(dir, "generation_config.json");
    const generationConfig = await fileExists(genPath)
      ? parseGenerationConfig(await readCheckpointJson(genPath), genPath)
      : null;

    const { files, byTensor } = await openWeightFiles(dir);
    return new Checkpoint(dir, config, generationConfig, quantization, files, byTensor);
  }

  /** Whether the checkpoint has a weight with canonical name `name`. */
  has(name: string): boolean {
    return this.tensors.has(name);
  }

  /**
   * The weight with canonical name `name`.
   *
   * @throws {CheckpointError} `"<name>: tensor not found in <files> (layout: ...)"`.
   */
  tensor(name: string): CheckpointTensor {
    const t = this.tensors.get(name);
    if (t === undefined) throw this.#notFound(name);
    return t;
  }

  #notFound(name: string): CheckpointError {
    const files = this.#files.map((f) => f.path.split("/").pop()).join(", ");
    return new CheckpointError(
      `${name}: tensor not found in ${files} of ${this.dir} (${this.names.describeLookup(name)})`,
    );
  }

  /**
   * The `weight_scale_inv` tensor of FP8 weight `name`, or undefined when `name` has none.
   */
  fp8Scale(name: string): CheckpointTensor | undefined {
    return this.#scales.get(name);
  }

  /**
   * The tensor called `name`, checked to have exactly `shape` and a readable dtype
   * (F32, F16 or BF16; or F8_E4M3 with its scale tensor, in a fine-grained FP8 checkpoint).
   *
   * @throws {CheckpointError} `"<name>: tensor not found ..."`,
   * `"<name>: expected shape [a, b], found [c, d] in <file>"`, an unsupported dtype, or an FP8
   * weight whose scale tensor is missing or of the wrong shape or dtype.
   */
  expectTensor(name: string, shape: readonly number[]): CheckpointTensor {
    const t = this.tensor(name);
    const packed = this.#packed.get(name);
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      const stored = packed?.codes === undefined
        ? ""
        : ` (its ${packed.codes.name.split(".").pop()} ${shapeText(packed.codes.shape)})`;
      throw new CheckpointError(
        `${name}: expected shape ${shapeText(shape)}, found ${
          shapeText(t.shape)
        }${stored} in ${t.file}`,
      );
    }
    if (packed !== undefined) {
      checkPackedParts(this.quantization as PackedIntQuantization, t, packed);
    } else if (t.dtype === "F8_E4M3") {
      this.#checkFp8(t);
    } else if (t.dtype !== "F32" && t.dtype !== "F16" && t.dtype !== "BF16") {
      throw new CheckpointError(
        `${name}: unsupported dtype ${t.dtype} in ${t.file} (supported: F32, F16, BF16; F8_E4M3 in a fine-grained FP8 checkpoint)`,
      );
    }
    return t;
  }

  /** Whether `name` is a packed-integer weight (GPTQ, AWQ, `pack-quantized`). */
  isPacked(name: string): boolean {
    return this.#packed.has(name);
  }

  /**
   * Packed-integer weight `name` read whole (its codes, zero points, scales and groups), or null
   * when `name` is not one.
   *
   * @throws {CheckpointError} for parts missing or of the wrong shape or dtype (as
   *   {@linkcode expectTensor}), a group index naming a group that does not exist, or a
   *   `weight_shape` other than the weight's.
   */
  packedWeight(name: string): Promise<PackedWeight | null> {
    const parts = this.#packed.get(name);
    if (parts === undefined) return Promise.resolve(null);
    const at = (t: CheckpointTensor) => this.#byTensor.get(t.name)!;
    return readPackedWeight(this.quantization as PackedIntQuantization, this.tensor(name), parts, {
      bytes: async (t) => (await at(t).file.readBytes(at(t).stored)).buffer as ArrayBuffer,
      f32: async (t) => {
        const values = await at(t).file.readTensor(at(t).stored, "f32");
        if (!(values instanceof Float32Array)) throw new TypeError("unreachable: f32 values");
        return values;
      },
    });
  }

  /** Checks an F8_E4M3 weight: an FP8 checkpoint, 2-D, with a scale tensor of the right shape. */
  #checkFp8(t: CheckpointTensor): Fp8Layout {
    const q = this.quantization;
    if (q === null || isPackedInt(q)) {
      throw new CheckpointError(
        `${t.name}: dtype F8_E4M3 in ${t.file}, but config.json has no FP8 quantization_config saying how to scale it`,
      );
    }
    const scale = this.#scales.get(t.name);
    if (scale === undefined || t.shape.length !== 2) {
      throw new CheckpointError(
        `${t.name}: an F8_E4M3 tensor of shape ${
          shapeText(t.shape)
        } in ${t.file} needs to be 2-D with a ${
          t.name.replace(/weight$/, q.scaleSuffix)
        } beside it`,
      );
    }
    const [rows, cols] = t.shape as [number, number];
    const [blockRows, blockCols] = scaleBlock(q.scaling, rows, cols);
    const shapes = fp8ScaleShapes(rows, cols, blockRows, blockCols);
    if (
      !shapes.some((w) =>
        w.length === scale.shape.length && w.every((d, i) => d === scale.shape[i])
      )
    ) {
      throw new CheckpointError(
        `${scale.name}: expected shape ${
          shapeText(shapes[0]!)
        } (one scale per ${blockRows} x ${blockCols} of ${shapeText(t.shape)}), found ${
          shapeText(scale.shape)
        } in ${scale.file}`,
      );
    }
    if (scale.dtype !== "F32" && scale.dtype !== "BF16" && scale.dtype !== "F16") {
      throw new CheckpointError(
        `${scale.name}: unsupported dtype ${scale.dtype} in ${scale.file} (supported: F32, BF16, F16)`,
      );
    }
    return { scale, blockRows, blockCols, scaleCols: Math.ceil(cols / blockCols) };
  }

  /** The scales of FP8 weight `t`, read as f32. */
  async #fp8Scales(t: CheckpointTensor): Promise<Fp8BlockScales> {
    const { scale, blockRows, blockCols, scaleCols } = this.#checkFp8(t);
    const at = this.#byTensor.get(scale.name)!;
    const values = await at.file.readTensor(at.stored, "f32");
    if (!(values instanceof Float32Array)) throw new TypeError("unreachable: f32 scales");
    return { blockRows, blockCols, scaleCols, values };
  }

  /**
   * Streams tensor `name` converted to `targetDtype` in chunks of whole rows of at most
   * `chunkBytes` (default 4 MiB), from whichever shard holds it. The chunk's array is reused
   * by the next chunk. See {@linkcode SafetensorsFile.readTensorChunks}.
   */
  tensorChunks(
    name: string,
    targetDtype: DType,
    chunkBytes?: number,
  ): AsyncGenerator<TensorChunk, void, undefined> {
    if (this.#packed.has(name)) return this.#packedChunks(name, targetDtype, chunkBytes);
    const at = this.#byTensor.get(name);
    if (at === undefined) throw this.#notFound(name);
    const t = this.tensor(name);
    if (t.dtype === "F8_E4M3") return this.#fp8Chunks(t, at, targetDtype, chunkBytes);
    return at.file.readTensorChunks(
      at.stored,
      chunkBytes === undefined ? { targetDtype } : {
        targetDtype,
        chunkBytes,
      },
    );
  }

  /** An FP8 weight's chunks: its bytes' values times their block scales, in f32, then the target. */
  async *#fp8Chunks(
    t: CheckpointTensor,
    at: { file: SafetensorsFile; stored: string },
    targetDtype: DType,
    chunkBytes: number | undefined,
  ): AsyncGenerator<TensorChunk, void, undefined> {
    const scales = await this.#fp8Scales(t);
    const options = chunkBytes === undefined
      ? { targetDtype: "f32" as const }
      : { targetDtype: "f32" as const, chunkBytes };
    yield* dequantizeFp8Chunks(at.file.readTensorChunks(at.stored, options), scales, targetDtype);
  }

  /** A GPTQ / AWQ weight's dequantized rows. */
  async *#packedChunks(
    name: string,
    targetDtype: DType,
    chunkBytes: number | undefined,
  ): AsyncGenerator<TensorChunk, void, undefined> {
    const w = (await this.packedWeight(name))!;
    yield* dequantizePackedChunks(w, targetDtype, chunkBytes ?? 4 << 20);
  }

  /**
   * Reads a whole tensor into a new array of `targetDtype`; for small tensors (norms, biases).
   */
  async readTensor(name: string, targetDtype: DType = "f32"): Promise<Float32Array | Float16Array> {
    const t = this.tensor(name);
    if (t.dtype !== "F8_E4M3" && !this.#packed.has(name)) {
      const at = this.#byTensor.get(name)!;
      return at.file.readTensor(at.stored, targetDtype);
    }
    const n = t.shape.reduce((a, d) => a * d, 1);
    const out = targetDtype === "f16" ? new Float16Array(n) : new Float32Array(n);
    for await (const chunk of this.tensorChunks(name, targetDtype)) {
      out.set(chunk.data, chunk.rowStart * chunk.cols);
    }
    return out;
  }

  /** Closes every shard file. */
  close(): void {
    for (const f of this.#files) f.close();
    this.#files = [];
  }
}

/** Opens the checkpoint in `dir`; see {@linkcode Checkpoint.open}. */
export function openCheckpoint(dir: string): Promise<Checkpoint> {
  return Checkpoint.open(dir);
}
