/**
 * The words of a quantized matrix in a texture (gpu/quant.ts, word layout `"texture"`): an
 * `rgba32uint` 2D-array texture whose texel `(u, r % L)` of layer `floor(r / L)` is unit `u` (4
 * words, 16 bytes) of row `r`, `L` the layer's rows ({@linkcode TEXTURE_LAYER_ROWS}, or the
 * matrix's rows if fewer). Kernels bind it as `texture_2d_array<u32>`.
 *
 * @module
 */

import type { GpuContext } from "./context.ts";
import { quantBits, type QuantFormat, TEXTURE_LAYER_ROWS, textureUnitsPerRow } from "./quant.ts";

/** Bytes per texel (`rgba32uint`). */
const TEXEL_BYTES = 16;

/** The texture holding a quantized matrix's words. */
export class WordTexture {
  readonly texture: GPUTexture;
  /** The view kernels bind (`texture_2d_array<u32>`). */
  readonly view: GPUTextureView;
  /** Texels per row of the matrix. */
  readonly unitsPerRow: number;
  /** Matrix rows per layer (the texture's height). */
  readonly layerRows: number;
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
    const layerRows = Math.min(rows, TEXTURE_LAYER_ROWS);
    const dim = ctx.limits.maxTextureDimension2D;
    return Number.isInteger(units) && units <= dim && layerRows <= dim &&
      Math.ceil(rows / layerRows) <= ctx.limits.maxTextureArrayLayers;
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
    this.layerRows = Math.min(rows, TEXTURE_LAYER_ROWS);
    this.layers = Math.ceil(rows / this.layerRows);
    this.#rows = rows;
    this.#wordsPerRow = (cols * quantBits(format)) / 32;
    this.texture = ctx.device.createTexture({
      label,
      size: [this.unitsPerRow, this.layerRows, this.layers],
      format: "rgba32uint",
      usage: GPUTextureUsage.TEXTURE_BINDING | GPUTextureUsage.COPY_DST |
        GPUTextureUsage.COPY_SRC,
    });
    this.view = this.texture.createView({ dimension: "2d-array" });
  }

  /** Bytes the texture occupies (the last layer's unused rows included). */
  get byteSize(): number {
    return this.unitsPerRow * this.layerRows * this.layers * TEXEL_BYTES;
  }

  /**
   * Writes the words of whole rows starting at `rowStart` (`words` row by row, as
   * gpu/quant.ts `quantizeRows` makes them): one texture write per layer they touch.
   */
  write(queue: GPUQueue, rowStart: number, words: Uint32Array): void {
    const count = words.length / this.#wordsPerRow;
    if (!Number.isInteger(count) || rowStart < 0 || rowStart + count > this.#rows) {
      throw new RangeError(
        `Cannot write ${words.length} words at row ${rowStart} of ${this.texture.label}: ` +
          `${this.#rows} rows of ${this.#wordsPerRow} words`,
      );
    }
    for (let r = rowStart; r < rowStart + count;) {
      const layer = Math.floor(r / this.layerRows);
      const n = Math.min(rowStart + count, (layer + 1) * this.layerRows) - r;
      const at = (r - rowStart) * this.#wordsPerRow;
      const data = words.subarray(at, at + n * this.#wordsPerRow);
      queue.writeTexture(
        { texture: this.texture, origin: [0, r - layer * this.layerRows, layer] },
        data.buffer as ArrayBuffer,
        { offset: data.byteOffset, bytesPerRow: this.unitsPerRow * TEXEL_BYTES },
        [this.unitsPerRow, n, 1],
      );
      r += n;
    }
  }

  /** Releases the texture. */
  destroy(): void {
    this.texture.destroy();
  }
}
