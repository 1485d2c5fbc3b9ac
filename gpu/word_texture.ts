/**
 * The words of a quantized matrix in a texture (gpu/quant.ts, word layout `"texture"`): an
 * `rgba32uint` 2D-array texture holding the matrix in blocks of 16 rows, one block per texture
 * row: unit `u` (4 words, 16 bytes) of row `r` is texel `(16 u + r % 16, b % H)` of layer
 * `floor(b / H)`, `b = floor(r / 16)`, `H` the layer's block rows ({@linkcode TEXTURE_LAYER_ROWS}
 * / 16, or the matrix's blocks if fewer). Kernels bind it as `texture_2d_array<u32>`.
 *
 * @module
 */

import type { GpuContext } from "./context.ts";
import {
  quantBits,
  type QuantFormat,
  TEXTURE_LAYER_ROWS,
  textureUnitsPerRow,
  WORD_BLOCK_ROWS,
} from "./quant.ts";

/** Bytes per texel (`rgba32uint`). */
const TEXEL_BYTES = 16;
/** Rows per block (one texture row). */
const B = WORD_BLOCK_ROWS;

/** The texture's shape for `rows` rows of `units` texels: width, block rows per layer, layers. */
function textureShape(rows: number, units: number) {
  const blocks = Math.ceil(rows / B);
  const height = Math.min(blocks, TEXTURE_LAYER_ROWS / B);
  return { width: units * B, height, layers: Math.ceil(blocks / height) };
}

/** The texture holding a quantized matrix's words. */
export class WordTexture {
  readonly texture: GPUTexture;
  /** The view kernels bind (`texture_2d_array<u32>`). */
  readonly view: GPUTextureView;
  /** Texels per row of the matrix. */
  readonly unitsPerRow: number;
  /** The texture's width: texels per block of 16 rows (16 per unit). */
  readonly width: number;
  /** Blocks of 16 rows per layer (the texture's height). */
  readonly height: number;
  /** Layers of the texture. */
  readonly layers: number;
  readonly #rows: number;
  readonly #wordsPerRow: number;

  /**
   * Whether `ctx` can hold `rows` rows of `cols` weights of `format` in one such texture (its
   * width, height and layer limits).
   */
  static fits(ctx: GpuContext, rows: number, cols: number, format: QuantFormat): boolean {
    const units = textureUnitsPerRow(cols, format);
    if (!Number.isInteger(units) || rows < 1) return false;
    const { width, height, layers } = textureShape(rows, units);
    const dim = ctx.limits.maxTextureDimension2D;
    return width <= dim && height <= dim && layers <= ctx.limits.maxTextureArrayLayers;
  }

  /**
   * Allocates the texture of `rows` rows of `cols` weights of `format` (contents zero).
   *
   * @throws {RangeError} when it does not fit the device ({@linkcode WordTexture.fits}).
   */
  constructor(ctx: GpuContext, label: string, rows: number, cols: number, format: QuantFormat) {
    if (!WordTexture.fits(ctx, rows, cols, format)) {
      throw new RangeError(
        `Cannot hold the words of ${label} (${rows} x ${cols} ${format}) in a texture: ` +
          `the device allows ${ctx.limits.maxTextureDimension2D} texels per side and ` +
          `${ctx.limits.maxTextureArrayLayers} layers`,
      );
    }
    this.unitsPerRow = textureUnitsPerRow(cols, format);
    const shape = textureShape(rows, this.unitsPerRow);
    this.width = shape.width;
    this.height = shape.height;
    this.layers = shape.layers;
    this.#rows = rows;
    this.#wordsPerRow = (cols * quantBits(format)) / 32;
    this.texture = ctx.device.createTexture({
      label,
      size: [this.width, this.height, this.layers],
      format: "rgba32uint",
      usage: GPUTextureUsage.TEXTURE_BINDING | GPUTextureUsage.COPY_DST |
        GPUTextureUsage.COPY_SRC,
    });
    this.view = this.texture.createView({ dimension: "2d-array" });
  }

  /** Bytes the texture occupies (the last layer's unused block rows included). */
  get byteSize(): number {
    return this.width * this.height * this.layers * TEXEL_BYTES;
  }

  /**
   * Writes the words of whole rows starting at `rowStart` (`words` row by row, as
   * gpu/quant.ts `quantizeRows` makes them), rearranged into blocks: one texture write per run of
   * blocks the rows cover whole in a layer (the matrix's last block whole when they reach its
   * last row), and one per unit for a block they cover in part (its other rows keep their
   * words).
   */
  write(queue: GPUQueue, rowStart: number, words: Uint32Array): void {
    const count = words.length / this.#wordsPerRow;
    if (!Number.isInteger(count) || rowStart < 0 || rowStart + count > this.#rows) {
      throw new RangeError(
        `Cannot write ${words.length} words at row ${rowStart} of ${this.texture.label}: ` +
          `${this.#rows} rows of ${this.#wordsPerRow} words`,
      );
    }
    const end = rowStart + count;
    const units = this.unitsPerRow;
    // Whether the rows cover block b whole (its rows that exist).
    const whole = (b: number) => b * B >= rowStart && Math.min((b + 1) * B, this.#rows) <= end;
    const origin = (b: number, x: number) => [x, b % this.height, Math.floor(b / this.height)];
    const put = (b: number, x: number, data: Uint32Array, texels: number, blocks: number) =>
      queue.writeTexture(
        { texture: this.texture, origin: origin(b, x) },
        data.buffer as ArrayBuffer,
        { offset: data.byteOffset, bytesPerRow: texels * TEXEL_BYTES, rowsPerImage: blocks },
        [texels, blocks, 1],
      );
    for (let b = Math.floor(rowStart / B); b * B < end;) {
      if (whole(b)) {
        // A run of whole blocks in one layer, staged block by block, unit by unit.
        let last = b;
        while (
          (last + 1) * B < end && whole(last + 1) &&
          Math.floor((last + 1) / this.height) === Math.floor(b / this.height)
        ) last++;
        const blocks = last - b + 1;
        const staged = new Uint32Array(blocks * this.width * 4);
        for (let r = b * B; r < Math.min((last + 1) * B, end); r++) {
          const at = (Math.floor(r / B) - b) * this.width + (r % B);
          for (let u = 0; u < units; u++) {
            const from = (r - rowStart) * this.#wordsPerRow + 4 * u;
            staged.set(words.subarray(from, from + 4), 4 * (at + B * u));
          }
        }
        put(b, 0, staged, this.width, blocks);
        b = last + 1;
        continue;
      }
      // Rows [lo, hi) of block b: for each unit, hi - lo neighbouring texels.
      const lo = Math.max(b * B, rowStart);
      const hi = Math.min((b + 1) * B, end);
      const staged = new Uint32Array(units * (hi - lo) * 4);
      for (let u = 0; u < units; u++) {
        for (let r = lo; r < hi; r++) {
          const from = (r - rowStart) * this.#wordsPerRow + 4 * u;
          staged.set(words.subarray(from, from + 4), 4 * (u * (hi - lo) + r - lo));
        }
      }
      for (let u = 0; u < units; u++) {
        const data = staged.subarray(4 * u * (hi - lo), 4 * (u + 1) * (hi - lo));
        put(b, B * u + (lo % B), data, hi - lo, 1);
      }
      b++;
    }
  }

  /** Releases the texture. */
  destroy(): void {
    this.texture.destroy();
  }
}
