/**
 * The 8-bit and 4-bit weight formats (`--quantization int8|int4`), exactly: any implementation
 * following this text reproduces the bits.
 *
 * A weight `W[out][in]` is cut into groups of {@linkcode GROUP} = 32 consecutive elements along
 * `in` (`in` must be a multiple of 32). Per group, in f32 arithmetic:
 *
 * - scale `s = f16(max|w| / Q)`, `Q = 7` (int4) or `127` (int8), the quotient rounded to f32 and
 *   then to the nearest f16 (ties to even);
 * - `q = clamp(roundHalfEven(f32(w / s)), -8, 7)` (int4) or `clamp(..., -127, 127)` (int8);
 *   `q = 0` for the whole group where `s = 0`;
 * - the kernels use `w' = q * s`.
 *
 * Storage (little-endian u32 words): int4 packs 8 values per u32, value `i` of a group in bits
 * `4 * (i % 8) .. 4 * (i % 8) + 3` of the group's word `i / 8` (4 words per group), two's
 * complement; int8 packs 4 per u32, value `i` in bits `8 * (i % 4) ..` of word `i / 4` (8 words
 * per group). The kernels decode every code of those bits, int8's -128 too, which the quantizer
 * above never writes but a GPTQ checkpoint's codes may hold (engine/model/packed_int.ts). Groups follow each other along a row and rows follow each other, so the words of
 * a `[rows, in]` matrix are `rows * in / (32 / bits)` u32 with no padding. The scales are a
 * separate `[rows, in / 32]` array of f16 (row-major, no padding).
 *
 * On the device (gpu/tensor.ts) each part of a matrix holds its words as above and its scales in
 * blocks of {@linkcode SCALE_BLOCK_ROWS} = 8 rows: the scale of row `r`, group `g` (of `G = in /
 * 32` per row) is f16 number `(floor(r / 8) * G + g) * 8 + r % 8`, the last block padded with
 * zeros ({@linkcode deviceScaleIndex}), so one 16-byte load reads a group's scales for 8
 * consecutive rows. Kernels read them as u32 pairs (number `j` in the low half of word `j / 2`
 * when `j` is even, the high half when odd) or as vec4s of 8.
 *
 * The words of a part are laid out on the device in one of two ways, its word block `B`
 * ({@linkcode WordBlock}): `B = 1`, row after row as above (the gpu kernel profile: a GPU's
 * invocations reading one row side by side load neighbouring words); or `B = 16`
 * ({@linkcode WORD_BLOCK_ROWS}, the cpu kernel profile), blocks of 16 rows in which group `g` of
 * all 16 rows is stored together, row by row: with `U` words per group and `G` groups per row,
 * word `j` of row `r` is word `(floor(r / 16) * G + floor(j / U)) * 16 * U + (r % 16) * U + j %
 * U` ({@linkcode deviceWordIndex}), the last block padded with zero rows. An invocation of the
 * cpu profile's `unrolled` kernel reads one group of 16 rows at a time, so its loads walk one
 * contiguous stream instead of 16 (measured on lavapipe, 2 cores, 6144 x 1024, M = 1, 28
 * distinct weight buffers, 15 interleaved rounds, 2026-11-26: int4 0.88x, int8 0.89x the
 * row-major kernel time, medians of the per-round ratios; blocks of 128 rows: 0.95x, 0.90x).
 *
 * Or, the cpu kernel profile's choice where it fits ({@linkcode WordLayout} `"texture"`,
 * gpu/word_texture.ts), the words sit in an `rgba32uint` 2D-array texture, one texel per unit of
 * 4 words (16 bytes), in the same blocks of 16 rows: unit `u` of row `r` (word `4 u .. 4 u + 3`
 * of the row) is texel `(16 u + r % 16, b % H)` of layer `floor(b / H)`, `b = floor(r / 16)` the
 * row's block and `H` = {@linkcode TEXTURE_LAYER_ROWS} / 16 block rows per layer (the matrix's
 * block count if smaller); a texture row holds one block, unit after unit, the last block's
 * missing rows zero; one part holds the whole matrix. So the 16 rows' unit `u` of a block are
 * 16 neighbouring texels, and an invocation of `unrolled` reads its rows' groups as one stream.
 * Why (lavapipe, Mesa 22.3): a storage load runs as a per-lane loop with a branch and a bounds
 * check per component, a texel fetch as a gather; the cpu profile's `unrolled` int4 kernel at M
 * = 1 took 0.76-0.80x the time of the 16-row word blocks in a buffer with the texels row by row
 * (texel `(u, r)`; 6144 x 1024, 28 distinct weights, nine interleaved rounds, per-round medians,
 * 2026-11-27), int8 0.89x; the texels in blocks rather than row by row, where each of an
 * invocation's 16 rows was a stream of its own 512 bytes from the next (K = 1,024), took
 * 0.85-0.87x the time on the LM head's shape (151,936 x 1,024: 11.9-12.1 against 13.7-14.3 ms),
 * 0.90-0.95x on gate_up's (6,144 x 1,024) and about the same on down's (1,024 x 3,072, 8
 * workgroups) (int4, M = 1, scratch copies of the kernel, interleaved pairs, 2026-11-29). Only
 * `unrolled` and the embedding lookup read such matrices.
 *
 * @module
 */

/** A low-bit weight format. */
export type QuantFormat = "int8" | "int4";

/** `--quantization`: a format, or `none` (weights kept as loaded). */
export type Quantization = QuantFormat | "none";

/**
 * `--quantization` as serve, generate and info take it: a {@linkcode Quantization}, or `auto`
 * (the default: a pre-quantized integer checkpoint's own format, else none; resolved by
 * engine/model/checkpoint_quantization.ts `resolveQuantization`).
 */
export type QuantizationChoice = Quantization | "auto";

/** Elements per group (one scale each). */
export const GROUP = 32;

/** Bits per value of `format`. */
export function quantBits(format: QuantFormat): number {
  return format === "int4" ? 4 : 8;
}

/** Largest magnitude `Q` of `format` (`s = max|w| / Q`). */
export function quantMax(format: QuantFormat): number {
  return format === "int4" ? 7 : 127;
}

/** u32 words holding one group of `format`. */
export function wordsPerGroup(format: QuantFormat): number {
  return (GROUP * quantBits(format)) / 32;
}

/** Rows per block of a matrix part's scales on the device (see the module documentation). */
export const SCALE_BLOCK_ROWS = 8;

/** Where the scale of `row`, group `group` sits in a device scale array of `groups` per row. */
export function deviceScaleIndex(row: number, group: number, groups: number): number {
  return (Math.floor(row / SCALE_BLOCK_ROWS) * groups + group) * SCALE_BLOCK_ROWS +
    (row % SCALE_BLOCK_ROWS);
}

/** Bytes of the device scales of `rows` rows of `cols` weights (f16, whole blocks of 8 rows). */
export function deviceScaleBytes(rows: number, cols: number): number {
  return Math.ceil(rows / SCALE_BLOCK_ROWS) * SCALE_BLOCK_ROWS * (cols / GROUP) * 2;
}

/**
 * The device scale array of `rows` rows of `groups` scales each (row-major `scales`, as
 * {@linkcode quantizeRows} returns them): blocks of {@linkcode SCALE_BLOCK_ROWS} rows, the last
 * one padded with zeros.
 */
export function blockScales(scales: Float16Array, rows: number, groups: number): Float16Array {
  if (scales.length !== rows * groups) {
    throw new RangeError(`Cannot block ${scales.length} scales as ${rows} rows of ${groups}`);
  }
  const out = new Float16Array(Math.ceil(rows / SCALE_BLOCK_ROWS) * SCALE_BLOCK_ROWS * groups);
  for (let r = 0; r < rows; r++) {
    for (let g = 0; g < groups; g++) out[deviceScaleIndex(r, g, groups)] = scales[r * groups + g]!;
  }
  return out;
}

/**
 * Rows per block of a part's words on the device: 1 (row-major) or {@linkcode WORD_BLOCK_ROWS}
 * (see the module documentation).
 */
export type WordBlock = 1 | 16;

/** Rows per word block of the cpu kernel profile's quantized matrices (module documentation). */
export const WORD_BLOCK_ROWS = 16;

/** The word block of the quantized matrices of a kernel profile (module documentation). */
export function wordBlockFor(profile: "cpu" | "gpu"): WordBlock {
  return profile === "cpu" ? WORD_BLOCK_ROWS : 1;
}

/**
 * How a quantized matrix's words sit on the device: in a buffer, row by row or in blocks of 16
 * rows ({@linkcode WordBlock}), or in a texture (see the module documentation).
 */
export type WordLayout = WordBlock | "texture";

/** A pipeline-key suffix naming `layout`: none for row-major words, `b16`, or `tex`. */
export function wordLayoutTag(layout: WordLayout): string {
  return layout === 1 ? "" : layout === "texture" ? "tex" : `b${layout}`;
}

/** Where a quantized matrix keeps its words: a storage buffer, or a texture. */
export type WordStorage = "buffer" | "texture";

/** The word storage of the quantized matrices of a kernel profile (module documentation). */
export function wordStorageFor(profile: "cpu" | "gpu"): WordStorage {
  return profile === "cpu" ? "texture" : "buffer";
}

/**
 * Matrix rows per layer of a word texture (module documentation): 512 blocks of
 * {@linkcode WORD_BLOCK_ROWS}; a power of two.
 */
export const TEXTURE_LAYER_ROWS = 8192;

/** Texels (16-byte units of 4 words) per row of `cols` weights of `format` in a word texture. */
export function textureUnitsPerRow(cols: number, format: QuantFormat): number {
  return (cols * quantBits(format)) / 128;
}

/**
 * Where word `word` of row `row` (of `cols` weights of `format`) sits in a device part whose
 * word block is `block`.
 */
export function deviceWordIndex(
  row: number,
  word: number,
  cols: number,
  format: QuantFormat,
  block: WordBlock,
): number {
  const u = wordsPerGroup(format);
  const groups = cols / GROUP;
  return (Math.floor(row / block) * groups + Math.floor(word / u)) * block * u +
    (row % block) * u + (word % u);
}

/** Bytes of the device words of `rows` rows of `cols` weights of `format`, word block `block`. */
export function deviceWordBytes(
  rows: number,
  cols: number,
  format: QuantFormat,
  block: WordBlock,
): number {
  return Math.ceil(rows / block) * block * ((cols * quantBits(format)) / 8);
}

/** Parses a `--quantization` value (a benchmark's list item: no `auto`). */
export function parseQuantization(text: string): Quantization {
  if (text === "none" || text === "int8" || text === "int4") return text;
  throw new TypeError(`--quantization expects none, int8 or int4, got "${text}"`);
}

/** Parses a `--quantization` value of serve, generate or info (`auto` too). */
export function parseQuantizationChoice(text: string): QuantizationChoice {
  if (text === "auto") return text;
  if (text === "none" || text === "int8" || text === "int4") return text;
  throw new TypeError(`--quantization expects auto, none, int8 or int4, got "${text}"`);
}

/** Whether a matrix of `cols` columns can be quantized (whole groups along each row). */
export function quantizable(cols: number): boolean {
  return cols % GROUP === 0;
}

/** Rounds to the nearest integer, ties to even. */
function roundHalfEven(v: number): number {
  const r = Math.round(v);
  return Math.abs(v - Math.trunc(v)) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** The packed words and f16 scales of some rows of a quantized matrix. */
export interface QuantizedRows {
  /** `rows * cols / (32 / bits)` words (see the module documentation). */
  readonly words: Uint32Array;
  /** `rows * cols / 32` f16 scales. */
  readonly scales: Float16Array;
}

/**
 * Quantizes row-major `[rows, cols]` values (`cols` a multiple of 32) to `format`.
 *
 * @throws {RangeError} when `cols` is not a multiple of 32, or a scale overflows f16 (a weight
 *   of magnitude above ~65504 * Q).
 */
export function quantizeRows(
  values: ArrayLike<number>,
  cols: number,
  format: QuantFormat,
): QuantizedRows {
  if (!quantizable(cols) || values.length % cols !== 0) {
    throw new RangeError(
      `Cannot quantize ${values.length} values as rows of ${cols}: ${cols} is not a multiple of ${GROUP}`,
    );
  }
  const bits = quantBits(format);
  const q = quantMax(format);
  const lo = format === "int4" ? -8 : -127;
  const mask = (1 << bits) - 1;
  const perWord = 32 / bits;
  const groups = values.length / GROUP;
  const words = new Uint32Array(groups * wordsPerGroup(format));
  const scales = new Float16Array(groups);
  for (let g = 0; g < groups; g++) {
    const base = g * GROUP;
    let max = 0;
    for (let i = 0; i < GROUP; i++) {
      const a = Math.abs(Math.fround(values[base + i]!));
      if (a > max) max = a;
    }
    scales[g] = Math.fround(max / q);
    const s = scales[g]!;
    if (!Number.isFinite(s)) {
      throw new RangeError(
        `Cannot quantize: group ${g} has max |w| ${max}, its scale overflows f16`,
      );
    }
    if (s === 0) continue;
    for (let i = 0; i < GROUP; i++) {
      const v = Math.min(
        q,
        Math.max(lo, roundHalfEven(Math.fround(Math.fround(values[base + i]!) / s))),
      );
      const w = g * wordsPerGroup(format) + Math.floor(i / perWord);
      words[w] = (words[w]! | ((v & mask) << (bits * (i % perWord)))) >>> 0;
    }
  }
  return { words, scales };
}
