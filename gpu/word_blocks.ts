/**
 * Writing a quantized matrix part's words into its buffer in the part's word block (gpu/quant.ts:
 * row by row, or blocks of 16 rows in which each group of the block's rows is stored together).
 *
 * @module
 */

import {
  deviceWordIndex,
  GROUP,
  quantBits,
  type QuantFormat,
  type WordBlock,
  wordsPerGroup,
} from "./quant.ts";

/** The shape of a part's words: `cols` weights per row of `quant`, in blocks of `block` rows. */
export interface WordBlockLayout {
  readonly cols: number;
  readonly quant: QuantFormat;
  readonly block: WordBlock;
}

/**
 * Writes `words` (whole rows, row by row) at row `first` of a part of `partRows` rows held in
 * `buffer`: one write row-major; in word blocks, one write for the whole blocks among the rows
 * and one per group for the rows of a block they cover in part (that block's other rows keep
 * their words).
 */
export function writePartWords(
  queue: GPUQueue,
  buffer: GPUBuffer,
  partRows: number,
  layout: WordBlockLayout,
  first: number,
  words: Uint32Array,
): void {
  const write = (byteOffset: number, data: Uint32Array) =>
    queue.writeBuffer(
      buffer,
      byteOffset,
      data.buffer as ArrayBuffer,
      data.byteOffset,
      data.byteLength,
    );
  const { cols, quant, block } = layout;
  const wordsPerRow = (cols * quantBits(quant)) / 32;
  const count = words.length / wordsPerRow;
  if (block === 1) {
    write(first * wordsPerRow * 4, words);
    return;
  }
  const u = wordsPerGroup(quant);
  const groups = cols / GROUP;
  const end = first + count;
  // The u words of group g of the part's row r (first <= r < end).
  const group = (r: number, g: number) => {
    const at = (r - first) * wordsPerRow + g * u;
    return words.subarray(at, at + u);
  };
  // Whole blocks: [wholeLo, wholeHi), also the part's last block when the rows reach its end.
  const wholeLo = Math.ceil(first / block) * block;
  const wholeHi = end === partRows ? Math.max(wholeLo, end) : Math.floor(end / block) * block;
  if (wholeHi > wholeLo) {
    const staged = new Uint32Array(Math.ceil((wholeHi - wholeLo) / block) * block * wordsPerRow);
    for (let r = wholeLo; r < wholeHi; r++) {
      for (let g = 0; g < groups; g++) {
        staged.set(group(r, g), deviceWordIndex(r - wholeLo, g * u, cols, quant, block));
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
        write(deviceWordIndex(b, g * u, cols, quant, block) * 4, staged);
      }
    }
  }
}
