/**
 * Streams checkpoint tensors to the GPU in bounded chunks, converting to the device's weight
 * dtype on the way, fusing tensors that the engine multiplies together (q/k/v, gate/up) into one
 * matrix, and transposing GPT-2's Conv1D `[in, out]` weights to the `[out, in]` layout the
 * kernels use. Shapes are checked against the config before anything is uploaded.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../../gpu/context.ts";
import type { DType } from "../../gpu/dtype.ts";
import { GpuMatrix } from "../../gpu/tensor.ts";
import type { Checkpoint } from "./checkpoint.ts";
import { LoadProgress } from "./load_progress.ts";

/** Chunk size for streaming: peak host memory while loading stays near this (plus one row). */
export const LOAD_CHUNK_BYTES = 8 << 20;

/** Loads named tensors of one checkpoint onto one device. */
export class WeightLoader {
  readonly ctx: GpuContext;
  readonly checkpoint: Checkpoint;
  readonly dtype: DType;
  readonly progress: LoadProgress;
  readonly #owned: { destroy(): void }[] = [];
  /** Canonical names of the weights loaded so far. */
  readonly #used = new Set<string>();

  constructor(ctx: GpuContext, checkpoint: Checkpoint, dtype: DType, showProgress?: boolean) {
    this.ctx = ctx;
    this.checkpoint = checkpoint;
    this.dtype = dtype;
    let total = 0;
    for (const t of checkpoint.tensors.values()) total += t.byteLength;
    this.progress = new LoadProgress(total, showProgress);
  }

  /**
   * A `[sum of rows, cols]` matrix made of the given `[rows, cols]` tensors stacked by rows, in
   * order (e.g. q, k, v projections into one fused projection).
   */
  async matrix(label: string, parts: readonly { name: string; rows: number }[], cols: number) {
    for (const p of parts) this.#expect(p.name, [p.rows, cols]);
    const rows = parts.reduce((n, p) => n + p.rows, 0);
    const m = this.#own(
      GpuMatrix.create(this.ctx, label, rows, cols, this.dtype, { padColsTo: 8 }),
    );
    let offset = 0;
    for (const p of parts) {
      for await (
        const chunk of this.checkpoint.tensorChunks(p.name, this.dtype, LOAD_CHUNK_BYTES)
      ) {
        m.writeRows(this.ctx.device.queue, offset + chunk.rowStart, chunk.data);
        this.progress.advance(chunk.data.length * this.#sourceBytes(p.name));
      }
      offset += p.rows;
    }
    return m;
  }

  /**
   * A `[out, in]` matrix from GPT-2 Conv1D tensors stored `[in, out]`, stacked by output rows
   * when several are given. The transpose needs each whole tensor in host memory once.
   */
  async transposed(label: string, parts: readonly { name: string; cols: number }[], rows: number) {
    for (const p of parts) this.#expect(p.name, [rows, p.cols]);
    const total = parts.reduce((n, p) => n + p.cols, 0);
    const m = this.#own(
      GpuMatrix.create(this.ctx, label, total, rows, this.dtype, { padColsTo: 8 }),
    );
    let offset = 0;
    for (const p of parts) {
      const src = await this.checkpoint.readTensor(p.name, "f32");
      const t = new Float32Array(src.length);
      for (let i = 0; i < rows; i++) {
        for (let o = 0; o < p.cols; o++) t[o * rows + i] = src[i * p.cols + o]!;
      }
      m.writeRows(this.ctx.device.queue, offset, t);
      this.progress.advance(src.length * this.#sourceBytes(p.name));
      offset += p.cols;
    }
    return m;
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
   * (`lm_head.weight`). Non-empty means the checkpoint holds weights the config does not
   * declare (e.g. attention biases with `attention_bias` false): serving it would silently drop
   * them, so the runner refuses it.
   */
  unusedWeights(tiedHead: boolean): string[] {
    return [...this.checkpoint.tensors.keys()].filter((n) =>
      !this.#used.has(n) && !(tiedHead && n === "lm_head.weight")
    );
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
    return o;
  }

  #sourceBytes(name: string): number {
    const dtype = this.checkpoint.tensor(name).dtype;
    return dtype === "F32" ? 4 : 2;
  }
}
