/**
 * The weight side of the matmul kernels' WGSL (kernels/matmul_kernels.ts, via
 * kernels/matmul_bindings.ts): binding 1 as f32 vec4s, f16 pairs, or int8 / int4 words (in
 * buffers laid out in blocks of rows, or in a word texture) with their f16 group scales at binding
 * 5 (gpu/quant.ts), and the load functions each kernel's K loop calls (`load_w4`, `load_w8`,
 * `unrolled`'s whole-group steps), each as a WGSL string prepended to a kernel file.
 *
 * @module
 */

import type { DType } from "../gpu/dtype.ts";
import {
  type QuantFormat,
  TEXTURE_LAYER_ROWS,
  WORD_BLOCK_ROWS,
  type WordBlock,
  type WordLayout,
} from "../gpu/quant.ts";

/** What a matmul's weights are: plain f16 / f32, or a low-bit format (gpu/quant.ts). */
export type WeightFormat = DType | QuantFormat;

/**
 * WGSL `fn w_index(row: u32, unit: u32, per_group: u32) -> u32`: where unit `unit` of row `row`
 * (units of `per_group` per 32-weight group, rows of `k` weights, `k` a WGSL expression) sits
 * in a part whose words are laid out in blocks of `block` rows (gpu/quant.ts deviceWordIndex; a
 * unit is a whole number of words, at most a group).
 */
export function wordIndexFunction(block: WordBlock, k: string): string {
  const body = block === 1
    ? `  return row * (${k} / 32u) * per_group + unit;\n`
    : `  return ((row / ${block}u) * (${k} / 32u) + unit / per_group) * ${block}u * per_group +\n` +
      `    (row % ${block}u) * per_group + unit % per_group;\n`;
  return `fn w_index(row: u32, unit: u32, per_group: u32) -> u32 {\n${body}}\n`;
}

/**
 * WGSL: binding `binding` as the word texture `name` (gpu/quant.ts, gpu/word_texture.ts) and `fn
 * name_texel(row: u32, unit: u32) -> vec4<u32>`, unit `unit` (4 words) of the matrix's row `row`:
 * texel (16 unit + row % 16, b % H) of layer b / H, b = row / 16 the row's block, H =
 * TEXTURE_LAYER_ROWS / 16 (powers of two; a matrix of fewer blocks has one layer of them, where b
 * / H is 0 and b % H is b).
 */
export function wordTextureFunction(binding: number, name: string): string {
  const b = WORD_BLOCK_ROWS;
  const h = TEXTURE_LAYER_ROWS / b;
  return `@group(0) @binding(${binding}) var ${name}: texture_2d_array<u32>;\n` +
    `fn ${name}_texel(row: u32, unit: u32) -> vec4<u32> {\n` +
    `  let x = i32(unit * ${b}u + (row & ${b - 1}u));\n` +
    `  let y = i32((row >> ${Math.log2(b)}u) & ${h - 1}u);\n` +
    `  return textureLoad(${name}, vec2<i32>(x, y), i32(row >> ${
      Math.log2(TEXTURE_LAYER_ROWS)
    }u), 0);\n}\n`;
}

/**
 * Bindings 1 (words, laid out in blocks of `block` rows: `w_index`, {@linkcode wordIndexFunction};
 * as vec4s also `w_unit(row, unit, per_group)`, the unit's 16 bytes; or, layout `"texture"`,
 * {@linkcode wordTextureFunction} and `w_unit`) and 5 (f16 scales in blocks of 8 rows,
 * gpu/quant.ts) of a quantized weight, and `scale_at(row, grp)`, the scale of group `grp` of the
 * part's row `row` (`p.k / 32` groups per row). With
 * `scaleBlocks` the scales bind as `array<vec4<u32>>` and `scale_block(row8, grp)` reads group
 * `grp`'s scales of rows 8 row8 .. 8 row8 + 7 in one 16-byte load, `block_scale(b, r)` picking
 * row `r` (< 8) of such a block; otherwise as `array<u32>` pairs.
 */
function quantBindings(wordType: string, layout: WordLayout, scaleBlocks = false): string {
  // `w_unit(row, unit, per_group)`: the unit's 16 bytes (`per_group` is for `w_index`).
  const words = layout === "texture"
    ? wordTextureFunction(1, "w") +
      "fn w_unit(row: u32, unit: u32, per_group: u32) -> vec4<u32> {\n" +
      "  return w_texel(row, unit);\n}\n"
    : `@group(0) @binding(1) var<storage, read> w: array<${wordType}>;\n` +
      wordIndexFunction(layout, "p.k") +
      (wordType === "vec4<u32>"
        ? "fn w_unit(row: u32, unit: u32, per_group: u32) -> vec4<u32> {\n" +
          "  return w[w_index(row, unit, per_group)];\n}\n"
        : "");
  if (scaleBlocks) {
    return words +
      "@group(0) @binding(5) var<storage, read> w_scales: array<vec4<u32>>;\n" +
      "fn scale_block(row8: u32, grp: u32) -> vec4<u32> {\n" +
      "  return w_scales[row8 * (p.k / 32u) + grp];\n}\n" +
      "fn block_scale(b: vec4<u32>, r: u32) -> f32 {\n" +
      "  let pair = unpack2x16float(b[(r >> 1u) & 3u]);\n" +
      "  return select(pair.x, pair.y, (r & 1u) == 1u);\n}\n" +
      "fn scale_at(row: u32, grp: u32) -> f32 {\n" +
      "  return block_scale(scale_block(row >> 3u, grp), row & 7u);\n}\n";
  }
  return words +
    "@group(0) @binding(5) var<storage, read> w_scales: array<u32>;\n" +
    "fn scale_at(row: u32, grp: u32) -> f32 {\n" +
    "  let j = ((row >> 3u) * (p.k / 32u) + grp) * 8u + (row & 7u);\n" +
    "  let pair = unpack2x16float(w_scales[j >> 1u]);\n" +
    "  return select(pair.x, pair.y, (row & 1u) == 1u);\n}\n";
}

/** WGSL: the 4 signed values of `word`'s low 16 bits (int4) or of `word` (int8), as f32. */
const UNPACK4 = {
  int4: "fn unpack4(word: u32) -> vec4<f32> {\n" +
    "  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) << vec4<u32>(28u, 24u, 20u, 16u)) >> vec4<u32>(28u));\n}\n",
  int8: "fn unpack4(word: u32) -> vec4<f32> {\n" +
    "  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));\n}\n",
} as const;

/**
 * `load_w4(row, q)`: elements 4q..4q+3 of the part's row `row` (row stride `4 p.k4` elements; a
 * group is 8 such steps); quantized words laid out in blocks of `block` rows.
 */
export function weightBinding(format: WeightFormat, block: WordBlock = 1): string {
  switch (format) {
    case "f16":
      return "@group(0) @binding(1) var<storage, read> w: array<vec2<u32>>;\n" +
        "fn load_w4(row: u32, q: u32) -> vec4<f32> {\n" +
        "  let v = w[row * p.k4 + q];\n" +
        "  return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));\n}\n";
    case "f32":
      return "@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;\n" +
        "fn load_w4(row: u32, q: u32) -> vec4<f32> {\n  return w[row * p.k4 + q];\n}\n";
    case "int4":
      return quantBindings("u32", block) + UNPACK4.int4 +
        "fn load_w4(row: u32, q: u32) -> vec4<f32> {\n" +
        "  let word = w[w_index(row, q >> 1u, 4u)];\n" +
        "  return unpack4(word >> ((q & 1u) * 16u)) * scale_at(row, q >> 3u);\n}\n";
    case "int8":
      return quantBindings("u32", block) + UNPACK4.int8 +
        "fn load_w4(row: u32, q: u32) -> vec4<f32> {\n" +
        "  return unpack4(w[w_index(row, q, 8u)]) * scale_at(row, q >> 3u);\n}\n";
  }
}

/**
 * Weight binding of 8-element steps: `load_w8(row, q)`, elements 8q..8q+7 of the part's row
 * `row` (row stride `4 p.k4` elements, a multiple of 8); quantized words laid out in blocks of
 * `block` rows.
 */
export function weightBinding8(format: WeightFormat, block: WordBlock = 1): string {
  switch (format) {
    case "f16":
      return "@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;\n" +
        "fn load_w8(row: u32, q: u32) -> mat2x4<f32> {\n" +
        "  let v = w[row * (p.k4 / 2u) + q];\n" +
        "  return mat2x4<f32>(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)),\n" +
        "    vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));\n}\n";
    case "f32":
      return "@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;\n" +
        "fn load_w8(row: u32, q: u32) -> mat2x4<f32> {\n" +
        "  let i = row * (p.k4 / 2u) + q;\n" +
        "  return mat2x4<f32>(w[2u * i], w[2u * i + 1u]);\n}\n";
    case "int4":
      return quantBindings("u32", block) + UNPACK4.int4 +
        "fn load_w8(row: u32, q: u32) -> mat2x4<f32> {\n" +
        "  let v = w[w_index(row, q, 4u)];\n" +
        "  return mat2x4<f32>(unpack4(v), unpack4(v >> 16u)) * scale_at(row, q >> 2u);\n}\n";
    case "int8":
      return quantBindings("vec2<u32>", block) + UNPACK4.int8 +
        "fn load_w8(row: u32, q: u32) -> mat2x4<f32> {\n" +
        "  let v = w[w_index(row, q, 4u)];\n" +
        "  return mat2x4<f32>(unpack4(v.x), unpack4(v.y)) * scale_at(row, q >> 2u);\n}\n";
  }
}

/**
 * Per format, the WGSL of `unrolled`'s quantized k loop (matmul_unrolled_q.wgsl): the group type
 * `QGroup` and `load_group(row, grp)` (one or two 16-byte loads), and the step helpers. A step is 8
 * values (one int4 word, two int8 words) isolated in place by a mask, on the word with every
 * value's sign bit flipped but the top one's (so they read q + 8 / q + 128 and the top one q),
 * and converted as they sit: value j of a word becomes (q + offset) * B^j (B = 16 / 256; the
 * top one q * B^j), exact in f32. `q_prep` multiplies X by the matching B^-j (exact powers of
 * two), `q_offset` is -offset times the sum of the X values whose q carries the offset, and
 * `q_dot(q_prep(x), v, c) + q_offset(x)` is the sum of q * x over step c of group v.
 */
const QUANT_STEP = {
  int4: "alias QGroup = vec4<u32>;\n" +
    "fn load_group(row: u32, grp: u32) -> QGroup {\n  return w_unit(row, grp, 1u);\n}\n" +
    "fn q_prep(x: mat2x4<f32>) -> mat2x4<f32> {\n" +
    "  return mat2x4<f32>(x[0] * vec4<f32>(1.0, 0x1p-4, 0x1p-8, 0x1p-12),\n" +
    "    x[1] * vec4<f32>(0x1p-16, 0x1p-20, 0x1p-24, 0x1p-28));\n}\n" +
    "fn q_offset(x: mat2x4<f32>) -> f32 {\n" +
    "  return -8.0 * (x[0].x + x[0].y + x[0].z + x[0].w + x[1].x + x[1].y + x[1].z);\n}\n" +
    "fn q_dot(xs: mat2x4<f32>, v: QGroup, c: u32) -> f32 {\n" +
    "  let word = vec4<u32>(v[c] ^ 0x08888888u);\n" +
    "  let lo = vec4<f32>(bitcast<vec4<i32>>(word & vec4<u32>(0xFu, 0xF0u, 0xF00u, 0xF000u)));\n" +
    "  let hi = vec4<f32>(bitcast<vec4<i32>>(word &\n" +
    "    vec4<u32>(0xF0000u, 0xF00000u, 0xF000000u, 0xF0000000u)));\n" +
    "  return dot(xs[0], lo) + dot(xs[1], hi);\n}\n",
  int8: "struct QGroup { a: vec4<u32>, b: vec4<u32> }\n" +
    "fn load_group(row: u32, grp: u32) -> QGroup {\n" +
    "  return QGroup(w_unit(row, 2u * grp, 2u), w_unit(row, 2u * grp + 1u, 2u));\n}\n" +
    "const Q8_PLACES = vec4<f32>(1.0, 0x1p-8, 0x1p-16, 0x1p-24);\n" +
    "const Q8_MASKS = vec4<u32>(0xFFu, 0xFF00u, 0xFF0000u, 0xFF000000u);\n" +
    "fn q_prep(x: mat2x4<f32>) -> mat2x4<f32> {\n" +
    "  return mat2x4<f32>(x[0] * Q8_PLACES, x[1] * Q8_PLACES);\n}\n" +
    "fn q_offset(x: mat2x4<f32>) -> f32 {\n" +
    "  return -128.0 * (x[0].x + x[0].y + x[0].z + x[1].x + x[1].y + x[1].z);\n}\n" +
    "fn q_dot(xs: mat2x4<f32>, v: QGroup, c: u32) -> f32 {\n" +
    "  let half = select(v.a, v.b, c >= 2u);\n" +
    "  let pair = select(half.xy, half.zw, (c & 1u) == 1u) ^ vec2<u32>(0x00808080u);\n" +
    "  let lo = vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(pair.x) & Q8_MASKS));\n" +
    "  let hi = vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(pair.y) & Q8_MASKS));\n" +
    "  return dot(xs[0], lo) + dot(xs[1], hi);\n}\n",
} as const;

/**
 * Weight bindings of whole-group steps on quantized weights (`matmul_unrolled_q.wgsl`,
 * `matmul_gemv_q32.wgsl`): the words as `array<vec4<u32>>` (a group is one such for int4, two
 * for int8; laid out in blocks of `block` rows), the scales in 16-byte blocks (`scale_block`,
 * `block_scale`, `scale_at`; see `quantBindings`) and the step helpers of
 * {@linkcode QUANT_STEP}.
 */
export function quantWeightBinding8(format: QuantFormat, layout: WordLayout = 1): string {
  return quantBindings("vec4<u32>", layout, true) + QUANT_STEP[format];
}
