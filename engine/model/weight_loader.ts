/**
 * Streams checkpoint tensors to the GPU in bounded chunks, converting to the device's weight
 * dtype on the way, fusing tensors that the engine multiplies together (q/k/v, gate/up) into one
 * matrix, and transposing GPT-2's Conv1D `[in, out]` weights to the `[out, in]` layout the
 * kernels use. Shapes are checked against the config before anything is uploaded.
 *
 * An FP8 checkpoint's weights arrive dequantized (engine/model/checkpoint.ts), in f32 or the
 * device dtype like any other; so do a GPTQ or AWQ checkpoint's, unless a quantization is asked
 * for and this engine's format holds the checkpoint's codes and scales as they are
 * (engine/model/packed_int.ts `exactQuantizedRows`): then those are uploaded, bit for bit.
 *
 * With a quantization (`int8` / `int4`, gpu/quant.ts) the matrices asked for as projections are
 * quantized chunk by chunk on the way (from the checkpoint's own values, read as f32): the packed
 * words are uploaded as they come, the f16 scales (1/16 of the f16 bytes) at the end of each
 * matrix. A matrix whose width is not a multiple of 32 stays in the device dtype, and
 * {@linkcode WeightLoader.notes} says so.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../../gpu/context.ts";
import { bytesPerElement, type DType } from "../../gpu/dtype.ts";
import {
  GROUP,
  quantizable,
  type Quantization,
  type QuantizedRows,
  quantizeRows,
} from "../../gpu/quant.ts";
import { GpuMatrix } from "../../gpu/tensor.ts";
import type { Checkpoint } from "./checkpoint.ts";
import {
  describeCheckpointQuantization,
  isPackedInt,
  type PackedIntQuantization,
} from "./checkpoint_quantization.ts";
import { dequantizePackedChunks, exactQuantizedRows, type PackedWeight } from "./packed_int.ts";
import { LoadProgress } from "./load_progress.ts";
import { product } from "./safetensors_header.ts";

/** Chunk size for streaming: peak host memory while loading stays near this (plus one row). */
export const LOAD_CHUNK_BYTES = 8 << 20;

/** Which `--quantization` would upload a GPTQ / AWQ checkpoint's own codes, for the load log. */
function keepingCodes(q: PackedIntQuantization): string {
  if (q.actOrder && q.groupSize !== null) {
    return "with act-order its groups interleave, so --quantization int8|int4 would quantize the values again";
  }
  if (q.bits === 8) {
    return q.symmetric
      ? "--quantization int8 keeps its codes and scales: half the bytes"
      : "its codes less their zero points span -255..255, so --quantization int8|int4 would quantize the values again";
  }
  return q.symmetric
    ? "--quantization int4 keeps its codes and scales: a quarter of the bytes"
    : "--quantization int8 keeps its codes and scales, half the bytes; int4 would quantize the values again, its zero points vary";
}

/** Loads named tensors of one checkpoint onto one device. */
export class WeightLoader {
  readonly ctx: GpuContext;
  readonly checkpoint: Checkpoint;
  readonly dtype: DType;
  readonly progress: LoadProgress;
  /** How projections are stored (`none`: in {@linkcode WeightLoader.dtype}). */
  readonly quantization: Quantization;
  /** Lines for the load log (e.g. a matrix left unquantized, and why). */
  readonly #notes: string[] = [];
  /** GPTQ / AWQ matrices uploaded as their codes, and those quantized again (the first why). */
  readonly #packed = { exact: 0, again: 0, firstWhy: "" };
  /** Weight bytes on the device so far, and what they would be unquantized (device dtype). */
  readonly bytes = { device: 0, unquantized: 0 };
  readonly #owned: { destroy(): void }[] = [];
  /** Canonical names of the weights loaded so far. */
  readonly #used = new Set<string>();

  constructor(
    ctx: GpuContext,
    checkpoint: Checkpoint,
    dtype: DType,
    showProgress?: boolean,
    quantization: Quantization = "none",
  ) {
    this.ctx = ctx;
    this.checkpoint = checkpoint;
    this.dtype = dtype;
    this.quantization = quantization;
    let total = 0;
    for (const t of checkpoint.tensors.values()) total += t.byteLength;
    this.progress = new LoadProgress(total, showProgress);
    const q = checkpoint.quantization;
    if (q !== null && !isPackedInt(q)) {
      this.#notes.push(
        `${describeCheckpointQuantization(q)}, dequantized while loading${
          quantization === "none" ? ` to ${dtype}` : ` and quantized again to ${quantization}`
        } (WebGPU has no FP8 arithmetic)`,
      );
    } else if (q !== null && quantization === "none") {
      this.#notes.push(
        `${describeCheckpointQuantization(q)}, dequantized while loading to ${dtype} (${
          keepingCodes(q)
        })`,
      );
    }
  }

  /** Lines for the load log (e.g. a matrix left unquantized, and why), once the load is done. */
  get notes(): string[] {
    const q = this.checkpoint.quantization;
    const { exact, again, firstWhy } = this.#packed;
    if (q === null || !isPackedInt(q) || exact + again === 0) return [...this.#notes];
    const what = describeCheckpointQuantization(q);
    const format = this.quantization;
    const line = again === 0
      ? `${what}: uploaded as their codes and scales in ${format}, exactly (${exact} weights)`
      : exact === 0
      ? `${what}: dequantized and quantized again to ${format} (${again} weights; ${format} cannot hold the codes as they are: ${firstWhy})`
      : `${what}: ${exact} of ${
        exact + again
      } weights uploaded as their codes and scales in ${format}, exactly; ${again} dequantized and quantized again (the first: ${firstWhy})`;
    return [line, ...this.#notes];
  }

  /**
   * A `[sum of rows, cols]` matrix made of the given `[rows, cols]` tensors stacked by rows, in
   * order (e.g. q, k, v projections into one fused projection). Quantized when the loader has a
   * quantization and `options.quantize` is not false (pass false for tables that are not
   * projections: an untied token embedding, position embeddings).
   */
  async matrix(
    label: string,
    parts: readonly { name: string; rows: number }[],
    cols: number,
    options: { quantize?: boolean } = {},
  ) {
    for (const p of parts) this.#expect(p.name, [p.rows, cols]);
    const rows = parts.reduce((n, p) => n + p.rows, 0);
    const quantized = this.#quantizedMatrix(label, rows, cols, options.quantize);
    const m = quantized?.matrix ??
      this.#own(GpuMatrix.create(this.ctx, label, rows, cols, this.dtype, { padColsTo: 8 }));
    const dtype = quantized === null ? this.dtype : "f32";
    let offset = 0;
    for (const p of parts) {
      // A packed weight, read once: its codes as they are, or its values quantized again.
      const packed = quantized === null ? null : await this.checkpoint.packedWeight(p.name);
      if (packed !== null && this.#uploadCodes(p.name, packed, offset, quantized!)) {
        offset += p.rows;
        continue;
      }
      const chunks = packed !== null
        ? dequantizePackedChunks(packed, dtype, LOAD_CHUNK_BYTES)
        : this.checkpoint.tensorChunks(p.name, dtype, LOAD_CHUNK_BYTES);
      for await (const chunk of chunks) {
        if (quantized === null) {
          m.writeRows(this.ctx.device.queue, offset + chunk.rowStart, chunk.data);
        } else quantized.write(offset + chunk.rowStart, chunk.data);
        this.progress.advance(chunk.data.length * this.#sourceBytes(p.name));
      }
      offset += p.rows;
    }
    quantized?.finish();
    return m;
  }

  /**
   * A `[out, in]` matrix from GPT-2 Conv1D tensors stored `[in, out]`, stacked by output rows
   * when several are given (quantized along `in` like {@linkcode WeightLoader.matrix}). The
   * transpose needs each whole tensor in host memory once.
   */
  async transposed(label: string, parts: readonly { name: string; cols: number }[], rows: number) {
    for (const p of parts) this.#expect(p.name, [rows, p.cols]);
    const total = parts.reduce((n, p) => n + p.cols, 0);
    const quantized = this.#quantizedMatrix(label, total, rows, true);
    const m = quantized?.matrix ??
      this.#own(GpuMatrix.create(this.ctx, label, total, rows, this.dtype, { padColsTo: 8 }));
    let offset = 0;
    for (const p of parts) {
      const src = await this.checkpoint.readTensor(p.name, "f32");
      const t = new Float32Array(src.length);
      for (let i = 0; i < rows; i++) {
        for (let o = 0; o < p.cols; o++) t[o * rows + i] = src[i * p.cols + o]!;
      }
      if (quantized === null) m.writeRows(this.ctx.device.queue, offset, t);
      else quantized.write(offset, t);
      this.progress.advance(src.length * this.#sourceBytes(p.name));
      offset += p.cols;
    }
    quantized?.finish();
    return m;
  }

  /**
   * Uploads packed weight `name` (read as `packed`) as its own codes and scales at row `offset`
   * of `target` when the format holds them exactly; false when it does not (then it loads as
   * the dequantized values, quantized again).
   */
  #uploadCodes(
    name: string,
    packed: PackedWeight,
    offset: number,
    target: { writeQuantized(rowStart: number, rows: QuantizedRows): void },
  ): boolean {
    if (this.quantization === "none") return false;
    const rows = exactQuantizedRows(packed, this.quantization);
    if (typeof rows === "string") {
      if (this.#packed.again++ === 0) this.#packed.firstWhy = `${name}: ${rows}`;
      return false;
    }
    target.writeQuantized(offset, rows);
    this.progress.advance(this.checkpoint.tensor(name).byteLength);
    this.#packed.exact++;
    return true;
  }

  /**
   * A quantized `[rows, cols]` matrix and its writer (words uploaded per chunk, scales kept on
   * the host until `finish`), or null when this matrix stays in the device dtype.
   */
  #quantizedMatrix(label: string, rows: number, cols: number, quantize: boolean | undefined) {
    const format = this.quantization;
    if (format === "none" || quantize === false) return null;
    if (!quantizable(cols)) {
      this.#notes.push(
        `${label} [${rows}, ${cols}] stays ${this.dtype}: ${cols} columns are not a multiple of ${GROUP}`,
      );
      return null;
    }
    const matrix = this.#own(GpuMatrix.createQuantized(this.ctx, label, rows, cols, format));
    const scales = new Float16Array((rows * cols) / GROUP);
    const queue = this.ctx.device.queue;
    return {
      matrix,
      writeQuantized(rowStart: number, q: QuantizedRows) {
        matrix.writeWords(queue, rowStart, q.words);
        scales.set(q.scales, (rowStart * cols) / GROUP);
      },
      write(rowStart: number, data: ArrayLike<number>) {
        this.writeQuantized(rowStart, quantizeRows(data, cols, format));
      },
      finish() {
        matrix.writeScales(queue, scales);
      },
    };
  }

  /** A `[1, cols]` matrix (norm weights) from a 1-D tensor. */
  async vector(name: string, cols: number): Promise<GpuMatrix> {
    this.#expect(name, [cols]);
    const data = await this.checkpoint.readTensor(name, "f32");
    this.progress.advance(cols * this.#sourceBytes(name));
    return this.#own(GpuMatrix.fromArray(this.ctx, name, data, 1, cols, this.dtype));
  }

  /** An f32 buffer holding 1-D tensors concatenated (biases; kept f32 for accuracy). */
  async bias(label: string, parts: readonly { name: string; size: number }[]): Promise<GPUBuffer> {
    for (const p of parts) this.#expect(p.name, [p.size]);
    const n = parts.reduce((s, p) => s + p.size, 0);
    const all = new Float32Array(n);
    let offset = 0;
    for (const p of parts) {
      all.set(await this.checkpoint.readTensor(p.name, "f32"), offset);
      this.progress.advance(p.size * this.#sourceBytes(p.name));
      offset += p.size;
    }
    const buffer = this.ctx.createBuffer(label, all.byteLength, STORAGE_RW);
    this.ctx.device.queue.writeBuffer(buffer, 0, all);
    this.#own(buffer);
    return buffer;
  }

  /**
   * The checkpoint's weights no load read, but a tied model's stored copy of its head
   * (`lm_head.weight`) and the all-zero biases GPTQ checkpoints carry beside their packed
   * weights (AutoGPTQ and GPTQ-for-LLaMa wrote a bias for every layer, zeros where the model has
   * none, e.g. TheBloke's Llama-2 GPTQ files; dropping zeros changes nothing, and the load log
   * says so). Non-empty means the checkpoint holds weights the config does not declare (e.g.
   * attention biases with `attention_bias` false): serving it would silently drop them, so the
   * runner refuses it.
   */
  async unusedWeights(tiedHead: boolean): Promise<string[]> {
    const unused = [...this.checkpoint.tensors.keys()].filter((n) =>
      !this.#used.has(n) && !(tiedHead && n === "lm_head.weight")
    );
    const zeros: string[] = [];
    for (const name of unused) {
      const weight = name.replace(/\.bias$/, ".weight");
      if (weight === name || !this.checkpoint.isPacked(weight)) continue;
      const values = await this.checkpoint.readTensor(name, "f32");
      if (values.every((v) => v === 0)) zeros.push(name);
    }
    if (zeros.length > 0) {
      this.#notes.push(
        `${zeros.length} all-zero bias tensor(s) beside packed weights left out (${
          zeros[0]
        }, ...): the config declares no such bias`,
      );
    }
    return unused.filter((n) => !zeros.includes(n));
  }

  #expect(name: string, shape: readonly number[]): void {
    this.checkpoint.expectTensor(name, shape);
    this.#used.add(name);
  }

  /** Every GPU object this loader created (released by {@linkcode WeightLoader.destroy}). */
  destroy(): void {
    for (const o of this.#owned) o.destroy();
    this.#owned.length = 0;
  }

  #own<T extends { destroy(): void }>(o: T): T {
    this.#owned.push(o);
    if (o instanceof GpuMatrix) {
      this.bytes.device += o.byteSize;
      // Unquantized: rows padded to 8 elements of the device dtype, as GpuMatrix.create does.
      this.bytes.unquantized += o.quant === null
        ? o.byteSize
        : o.rows * Math.ceil(o.cols / 8) * 8 * bytesPerElement(this.dtype);
    } else if (o instanceof GPUBuffer) {
      this.bytes.device += o.size;
      this.bytes.unquantized += o.size;
    }
    return o;
  }

  /** Bytes of the checkpoint per element of weight `name` (a packed weight's: all its parts'). */
  #sourceBytes(name: string): number {
    const t = this.checkpoint.tensor(name);
    return t.byteLength / product(t.shape);
  }
}
