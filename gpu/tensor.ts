/**
 * GPU matrices whose storage may span several buffers.
 *
 * A storage binding is limited to `maxStorageBufferBindingSize` (128 MiB on lavapipe), less than
 * the 151936 x 1024 embedding / LM head of Qwen3-0.6B (311 MB in f16). A {@linkcode GpuMatrix}
 * therefore holds its rows in one or more parts, each part a buffer of whole rows that fits one
 * binding. Kernels that read such a matrix dispatch once per part (see `kernels/`), so the split
 * is invisible to callers.
 *
 * Layout of each part: row-major, `rowStride` elements per row (`rowStride >= cols`, the padding
 * is zero; f16 rows always have an even stride so rows start on 4-byte boundaries), `rows` rows,
 * element type `dtype`.
 *
 * A quantized matrix ({@linkcode GpuMatrix.createQuantized}, `quant` int8 or int4, gpu/quant.ts)
 * holds in each part the packed words of its rows (`rowStride = cols`, no padding), row by row or
 * in blocks of 16 rows, or all of them in one part's texture (its `wordLayout`, gpu/quant.ts; by
 * default the kernel profile's), and, in the part's `scales` buffer, their f16 scales in blocks
 * of 8 rows (gpu/quant.ts, `cols / 32` per row, the part's rows rounded up to a multiple of 8);
 * its `dtype` is f16, the type of the scales.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "./context.ts";
import { bytesPerElement, type DType, toDType } from "./dtype.ts";
import {
  blockScales,
  deviceScaleBytes,
  deviceWordBytes,
  GROUP,
  quantBits,
  type QuantFormat,
  quantizable,
  type QuantizedRows,
  type WordBlock,
  wordBlockFor,
  type WordLayout,
  type WordStorage,
  wordStorageFor,
} from "./quant.ts";
import { WordTexture } from "./word_texture.ts";
import { writePartWords } from "./word_blocks.ts";

/** One binding's worth of rows `[rowStart, rowStart + rows)` of a {@linkcode GpuMatrix}. */
export interface MatrixPart {
  /**
   * The rows' values, or a quantized matrix's words when they are in a buffer.
   * @throws {TypeError} on reading it where the words are in a texture (`texture`).
   */
  readonly buffer: GPUBuffer;
  /** The words of a quantized matrix of word layout `"texture"` (gpu/quant.ts); else null. */
  readonly texture: WordTexture | null;
  readonly rowStart: number;
  readonly rows: number;
  /** f16 scales of a quantized matrix's rows (u32 pairs); null otherwise. */
  readonly scales: GPUBuffer | null;
}

/** Options for {@linkcode GpuMatrix.create}. */
export interface GpuMatrixOptions {
  /** Pad each row to a multiple of this many elements (e.g. 4 for vec4 loads); default 1. */
  padColsTo?: number;
  /** Largest part in bytes; default and maximum `ctx.maxBindingBytes`. */
  maxPartBytes?: number;
}

/** Options for {@linkcode GpuMatrix.createQuantized}. */
export interface QuantizedMatrixOptions extends Pick<GpuMatrixOptions, "maxPartBytes"> {
  /**
   * Where the words go (gpu/quant.ts): default the kernel profile's ({@linkcode wordStorageFor}),
   * a buffer where a texture would not fit the device (or its scales one binding) or where
   * `wordBlock` is given.
   */
  wordStorage?: WordStorage;
  /**
   * Rows per block of the words in a buffer (gpu/quant.ts); default the kernel profile's, or 1
   * where one block of rows would exceed a part.
   */
  wordBlock?: WordBlock;
}

/** The binding resource of a part's words or values: its texture's view, else its buffer. */
export function partResource(part: MatrixPart): GPUBindingResource {
  return part.texture === null ? { buffer: part.buffer } : part.texture.view;
}

/** The one part of a matrix whose words are in `texture`. */
function texturePart(texture: WordTexture, rows: number, scales: GPUBuffer): MatrixPart {
  return {
    get buffer(): GPUBuffer {
      throw new TypeError(
        `Cannot bind the words of ${texture.texture.label} as a buffer: they are in a texture`,
      );
    },
    texture,
    rowStart: 0,
    rows,
    scales,
  };
}

/** A `[rows, cols]` matrix of `dtype` on the GPU, split by rows across bindings when large. */
export class GpuMatrix {
  readonly rows: number;
  readonly cols: number;
  readonly dtype: DType;
  /** Elements from the start of one row to the next (>= cols). */
  readonly rowStride: number;
  readonly parts: readonly MatrixPart[];
  readonly label: string;
  /** The low-bit format of a quantized matrix; null for plain f16 / f32. */
  readonly quant: QuantFormat | null;
  /** How a quantized matrix's words sit on the device (gpu/quant.ts); 1 otherwise. */
  readonly wordLayout: WordLayout;

  private constructor(
    label: string,
    rows: number,
    cols: number,
    dtype: DType,
    rowStride: number,
    parts: MatrixPart[],
    quant: QuantFormat | null = null,
    wordLayout: WordLayout = 1,
  ) {
    this.wordLayout = wordLayout;
    this.label = label;
    this.rows = rows;
    this.cols = cols;
    this.dtype = dtype;
    this.rowStride = rowStride;
    this.parts = parts;
    this.quant = quant;
  }

  /** The weight format kernels specialise on: the quantization, else the dtype. */
  get format(): DType | QuantFormat {
    return this.quant ?? this.dtype;
  }

  /**
   * Allocates a quantized `[rows, cols]` matrix (`cols` a multiple of 32; contents zero): its
   * words in a texture (one part), or in buffers split by rows so that each part's words fit one
   * binding (parts of whole word blocks).
   *
   * @throws {RangeError} when the shape is not whole groups, a part cannot hold one block, or
   *   `wordStorage` "texture" does not fit the device (its size limits; the scales one binding).
   * @throws {TypeError} when `wordStorage` "texture" comes with a `wordBlock`.
   */
  static createQuantized(
    ctx: GpuContext,
    label: string,
    rows: number,
    cols: number,
    quant: QuantFormat,
    options: QuantizedMatrixOptions = {},
  ): GpuMatrix {
    if (!Number.isInteger(rows) || rows < 1 || !quantizable(cols)) {
      throw new RangeError(
        `Cannot create ${quant} matrix ${label}: shape [${rows}, ${cols}] needs columns in groups of ${GROUP}`,
      );
    }
    const rowBytes = (cols * quantBits(quant)) / 8;
    const maxPart = Math.min(options.maxPartBytes ?? ctx.maxBindingBytes, ctx.maxBindingBytes);
    const scaleBytes = deviceScaleBytes(rows, cols);
    const storage = options.wordStorage ??
      (options.wordBlock === undefined && wordStorageFor(ctx.profile) === "texture" &&
          WordTexture.fits(ctx, rows, cols, quant) && scaleBytes <= maxPart
        ? "texture"
        : "buffer");
    if (storage === "texture") {
      if (options.wordBlock !== undefined) {
        throw new TypeError(`Cannot create ${label}: word blocks are for words in a buffer`);
      }
      if (scaleBytes > maxPart) {
        throw new RangeError(
          `Cannot create ${label} with its words in a texture: its ${scaleBytes} bytes of scales exceed the binding limit of ${maxPart}`,
        );
      }
      const texture = new WordTexture(ctx, label, rows, cols, quant);
      const scales = ctx.createBuffer(`${label} scales`, scaleBytes, STORAGE_RW);
      const parts = [texturePart(texture, rows, scales)];
      return new GpuMatrix(label, rows, cols, "f16", cols, parts, quant, "texture");
    }
    // The profile's word block, unless one block of rows would not fit a binding.
    const profileBlock = wordBlockFor(ctx.profile);
    const block = options.wordBlock ?? (profileBlock * rowBytes <= maxPart ? profileBlock : 1);
    const blocksPerPart = Math.floor(maxPart / (rowBytes * block));
    if (blocksPerPart < 1) {
      throw new RangeError(
        `Cannot create matrix ${label}: ${block} row(s) of ${rowBytes} bytes exceed the binding limit of ${maxPart}`,
      );
    }
    const rowsPerPart = Math.min(rows, blocksPerPart * block);
    const parts: MatrixPart[] = [];
    for (let rowStart = 0; rowStart < rows; rowStart += rowsPerPart) {
      const n = Math.min(rowsPerPart, rows - rowStart);
      const range = `${label}[${rowStart}..${rowStart + n})`;
      const words = deviceWordBytes(n, cols, quant, block);
      const buffer = ctx.createBuffer(range, words, STORAGE_RW);
      const scales = ctx.createBuffer(`${range} scales`, deviceScaleBytes(n, cols), STORAGE_RW);
      parts.push({ buffer, texture: null, rowStart, rows: n, scales });
    }
    return new GpuMatrix(label, rows, cols, "f16", cols, parts, quant, block);
  }

  /** Allocates an uninitialised matrix (contents are zero per WebGPU). */
  static create(
    ctx: GpuContext,
    label: string,
    rows: number,
    cols: number,
    dtype: DType,
    options: GpuMatrixOptions = {},
  ): GpuMatrix {
    if (!Number.isInteger(rows) || !Number.isInteger(cols) || rows < 1 || cols < 1) {
      throw new RangeError(`Cannot create matrix ${label}: invalid shape [${rows}, ${cols}]`);
    }
    // f16 rows are padded to an even length so every row starts on a 4-byte boundary.
    const requested = options.padColsTo ?? 1;
    const pad = dtype === "f16" && requested % 2 === 1 ? requested * 2 : requested;
    const rowStride = Math.ceil(cols / pad) * pad;
    const rowBytes = rowStride * bytesPerElement(dtype);
    const maxPart = Math.min(options.maxPartBytes ?? ctx.maxBindingBytes, ctx.maxBindingBytes);
    let rowsPerPart = Math.floor(maxPart / rowBytes);
    if (rowsPerPart < 1) {
      throw new RangeError(
        `Cannot create matrix ${label}: one row of ${rowBytes} bytes exceeds the binding limit of ${maxPart}`,
      );
    }
    rowsPerPart = Math.min(rowsPerPart, rows);
    const parts: MatrixPart[] = [];
    for (let rowStart = 0; rowStart < rows; rowStart += rowsPerPart) {
      const n = Math.min(rowsPerPart, rows - rowStart);
      const buffer = ctx.createBuffer(
        `${label}[${rowStart}..${rowStart + n})`,
        n * rowBytes,
        STORAGE_RW,
      );
      parts.push({ buffer, texture: null, rowStart, rows: n, scales: null });
    }
    return new GpuMatrix(label, rows, cols, dtype, rowStride, parts);
  }

  /** Allocates a matrix and uploads `data` (row-major `[rows, cols]`, converted to `dtype`). */
  static fromArray(
    ctx: GpuContext,
    label: string,
    data: ArrayLike<number>,
    rows: number,
    cols: number,
    dtype: DType,
    options: GpuMatrixOptions = {},
  ): GpuMatrix {
    const m = GpuMatrix.create(ctx, label, rows, cols, dtype, options);
    m.writeRows(ctx.device.queue, 0, data);
    return m;
  }

  /** Total bytes on the GPU, padding (and a quantized matrix's scales) included. */
  get byteSize(): number {
    if (this.quant === null) return this.rows * this.rowStride * bytesPerElement(this.dtype);
    return this.parts.reduce(
      (n, p) => n + (p.texture?.byteSize ?? p.buffer.size) + p.scales!.size,
      0,
    );
  }

  /**
   * Writes rows starting at `rowStart` from `data` (row-major, `cols` per row, any length that is
   * a whole number of rows). Used to stream weights to the GPU in bounded chunks.
   */
  writeRows(queue: GPUQueue, rowStart: number, data: ArrayLike<number>): void {
    if (data.length % this.cols !== 0) {
      throw new RangeError(
        `Cannot write ${data.length} values to ${this.label}: not a whole number of ${this.cols}-wide rows`,
      );
    }
    const count = data.length / this.cols;
    if (rowStart < 0 || rowStart + count > this.rows) {
      throw new RangeError(
        `Cannot write rows [${rowStart}, ${
          rowStart + count
        }) of ${this.label}: it has ${this.rows} rows`,
      );
    }
    const esize = bytesPerElement(this.dtype);
    for (const part of this.parts) {
      const lo = Math.max(rowStart, part.rowStart);
      const hi = Math.min(rowStart + count, part.rowStart + part.rows);
      if (lo >= hi) continue;
      const n = hi - lo;
      let src: ArrayLike<number> = data;
      if (
        src instanceof Float32Array || src instanceof Float16Array || src instanceof Float64Array
      ) {
        src = src.subarray((lo - rowStart) * this.cols, (hi - rowStart) * this.cols);
      } else {
        src = Array.prototype.slice.call(
          data,
          (lo - rowStart) * this.cols,
          (hi - rowStart) * this.cols,
        );
      }
      let typed = toDType(src, this.dtype);
      if (this.rowStride !== this.cols) {
        const padded = this.dtype === "f16"
          ? new Float16Array(n * this.rowStride)
          : new Float32Array(n * this.rowStride);
        for (let r = 0; r < n; r++) {
          padded.set(typed.subarray(r * this.cols, (r + 1) * this.cols), r * this.rowStride);
        }
        typed = padded;
      }
      queue.writeBuffer(
        part.buffer,
        (lo - part.rowStart) * this.rowStride * esize,
        typed.buffer as ArrayBuffer,
        typed.byteOffset,
        typed.byteLength,
      );
    }
  }

  /**
   * Writes the packed words of whole rows starting at `rowStart` (a quantized matrix only;
   * `words` as {@linkcode quantizeRows} makes them, row by row: laid out here in the matrix's
   * word layout). Scales go separately, all at once ({@linkcode GpuMatrix.writeScales}).
   */
  writeWords(queue: GPUQueue, rowStart: number, words: Uint32Array): void {
    const quant = this.#quantOnly("words");
    const wordsPerRow = (this.cols * quantBits(quant)) / 32;
    const count = words.length / wordsPerRow;
    if (!Number.isInteger(count) || rowStart < 0 || rowStart + count > this.rows) {
      throw new RangeError(
        `Cannot write ${words.length} words at row ${rowStart} of ${this.label}: ` +
          `${this.rows} rows of ${wordsPerRow} words`,
      );
    }
    for (const part of this.parts) {
      const lo = Math.max(rowStart, part.rowStart);
      const hi = Math.min(rowStart + count, part.rowStart + part.rows);
      if (lo >= hi) continue;
      if (part.texture !== null) {
        part.texture.write(queue, rowStart, words);
        continue;
      }
      const slice = words.subarray((lo - rowStart) * wordsPerRow, (hi - rowStart) * wordsPerRow);
      const layout = { cols: this.cols, quant, block: this.wordLayout as WordBlock };
      writePartWords(queue, part.buffer, part.rows, layout, lo - part.rowStart, slice);
    }
  }

  /**
   * Writes every scale of a quantized matrix (`rows * cols / 32` f16, row-major; each part stores
   * them in blocks of 8 rows, gpu/quant.ts).
   */
  writeScales(queue: GPUQueue, scales: Float16Array): void {
    this.#quantOnly("scales");
    const groupsPerRow = this.cols / GROUP;
    if (scales.length !== this.rows * groupsPerRow) {
      throw new RangeError(
        `Cannot write ${scales.length} scales to ${this.label}: it has ${this.rows * groupsPerRow}`,
      );
    }
    for (const part of this.parts) {
      const first = part.rowStart * groupsPerRow;
      const rows = scales.subarray(first, first + part.rows * groupsPerRow);
      const staged = blockScales(rows, part.rows, groupsPerRow);
      queue.writeBuffer(part.scales!, 0, staged.buffer as ArrayBuffer, 0, staged.byteLength);
    }
  }

  /** Allocates a quantized matrix and uploads `data` ({@linkcode quantizeRows}'s output). */
  static fromQuantized(
    ctx: GpuContext,
    label: string,
    rows: number,
    cols: number,
    quant: QuantFormat,
    data: QuantizedRows,
    options: QuantizedMatrixOptions = {},
  ): GpuMatrix {
    const m = GpuMatrix.createQuantized(ctx, label, rows, cols, quant, options);
    m.writeWords(ctx.device.queue, 0, data.words);
    m.writeScales(ctx.device.queue, data.scales);
    return m;
  }

  #quantOnly(what: string): QuantFormat {
    if (this.quant === null) {
      throw new TypeError(
        `Cannot write ${what} to ${this.label}: it is ${this.dtype}, not quantized`,
      );
    }
    return this.quant;
  }

  /** Releases the GPU buffers (and texture). */
  destroy(): void {
    for (const part of this.parts) {
      if (part.texture === null) part.buffer.destroy();
      else part.texture.destroy();
      part.scales?.destroy();
    }
  }
}
