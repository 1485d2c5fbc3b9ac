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
 * in blocks of 16 rows (its `wordBlock`, gpu/quant.ts; by default the kernel profile's), and, in
 * the part's `scales` buffer, their f16 scales in blocks of 8 rows (gpu/quant.ts, `cols / 32`
 * per row, the part's rows rounded up to a multiple of 8); its `dtype` is f16, the type of the
 * scales.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "./context.ts";
import { bytesPerElement, type DType, toDType } from "./dtype.ts";
import {
  blockScales,
  deviceScaleBytes,
  deviceWordBytes,
  deviceWordIndex,
  GROUP,
  quantBits,
  type QuantFormat,
  quantizable,
  type QuantizedRows,
  type WordBlock,
  wordBlockFor,
  wordsPerGroup,
} from "./quant.ts";

/** One buffer holding rows `[rowStart, rowStart + rows)` of a {@linkcode GpuMatrix}. */
export interface MatrixPart {
  readonly buffer: GPUBuffer;
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
   * Rows per block of the words on the device (gpu/quant.ts); default the kernel profile's, or 1
   * where one block of rows would exceed a part.
   */
  wordBlock?: WordBlock;
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
  /** Rows per block of a quantized matrix's words on the device (gpu/quant.ts); 1 otherwise. */
  readonly wordBlock: WordBlock;

  private constructor(
    label: string,
    rows: number,
    cols: number,
    dtype: DType,
    rowStride: number,
    parts: MatrixPart[],
    quant: QuantFormat | null = null,
    wordBlock: WordBlock = 1,
  ) {
    this.wordBlock = wordBlock;
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
   * Allocates a quantized `[rows, cols]` matrix (`cols` a multiple of 32; contents zero), split
   * by rows so that each part's words fit one binding (parts of whole word blocks).
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
      parts.push({ buffer, rowStart, rows: n, scales });
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
      parts.push({ buffer, rowStart, rows: n, scales: null });
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
    return this.parts.reduce((n, p) => n + p.buffer.size + p.scales!.size, 0);
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
   * word blocks). Scales go separately, all at once ({@linkcode GpuMatrix.writeScales}).
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
      const slice = words.subarray((lo - rowStart) * wordsPerRow, (hi - rowStart) * wordsPerRow);
      this.#writePartWords(queue, part, lo - part.rowStart, slice);
    }
  }

  /**
   * Writes `words` (whole rows, row by row) at row `first` of `part`: one write row-major; in
   * word blocks, one write for the whole blocks among the rows and one per group for the rows of
   * a block they cover in part (that block's other rows keep their words).
   */
  #writePartWords(queue: GPUQueue, part: MatrixPart, first: number, words: Uint32Array): void {
    const write = (byteOffset: number, data: Uint32Array) =>
      queue.writeBuffer(
        part.buffer,
        byteOffset,
        data.buffer as ArrayBuffer,
        data.byteOffset,
        data.byteLength,
      );
    const quant = this.quant!;
    const wordsPerRow = (this.cols * quantBits(quant)) / 32;
    const block = this.wordBlock;
    const count = words.length / wordsPerRow;
    if (block === 1) {
      write(first * wordsPerRow * 4, words);
      return;
    }
    const u = wordsPerGroup(quant);
    const groups = this.cols / GROUP;
    const end = first + count;
    // The u words of group g of the part's row r (first <= r < end).
    const group = (r: number, g: number) => {
      const at = (r - first) * wordsPerRow + g * u;
      return words.subarray(at, at + u);
    };
    // Whole blocks: [wholeLo, wholeHi), also the part's last block when the rows reach its end.
    const wholeLo = Math.ceil(first / block) * block;
    const wholeHi = end === part.rows ? Math.max(wholeLo, end) : Math.floor(end / block) * block;
    if (wholeHi > wholeLo) {
      const staged = new Uint32Array(Math.ceil((wholeHi - wholeLo) / block) * block * wordsPerRow);
      for (let r = wholeLo; r < wholeHi; r++) {
        for (let g = 0; g < groups; g++) {
          staged.set(group(r, g), deviceWordIndex(r - wholeLo, g * u, this.cols, quant, block));
        }
      }
      write(wholeLo * wordsPerRow * 4, staged);
    }
    // Rows in blocks covered in part: per block and group, their words are contiguous.
    const partial: [number, number][] = wholeHi > wholeLo
      ? [[first, wholeLo], [wholeHi, end]]
      : [[first, end]];
    for (const [lo, hi] of partial) {
      for (let b = lo; b < hi; b = (Math.floor(b / block) + 1) * block) {
        const stop = Math.min(hi, (Math.floor(b / block) + 1) * block);
        for (let g = 0; g < groups; g++) {
          const staged = new Uint32Array((stop - b) * u);
          for (let r = b; r < stop; r++) staged.set(group(r, g), (r - b) * u);
          write(deviceWordIndex(b, g * u, this.cols, quant, block) * 4, staged);
        }
      }
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

  /** Releases the GPU buffers. */
  destroy(): void {
    for (const part of this.parts) {
      part.buffer.destroy();
      part.scales?.destroy();
    }
  }
}
