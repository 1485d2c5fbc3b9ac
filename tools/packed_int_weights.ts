/**
 * Writes weights as GPTQ and AWQ checkpoints store them (the layouts of
 * engine/model/packed_int.ts), for test and benchmark checkpoints (tools/make_model.ts `--gptq`,
 * `--awq`). The codes are round-to-nearest per group, as the quantizers' own `Quantizer` /
 * `pseudo_quantize_tensor` compute them (the GPTQ and AWQ algorithms only choose better values
 * to round; the stored format is the same):
 *
 * - symmetric (GPTQ `sym`): `m = max|w|` over the group, `scale = 2 m / (2^bits - 1)`, zero
 *   `2^(bits - 1)`;
 * - with zero points (GPTQ `sym: false`, AWQ): `scale = (max(w, 0) - min(w, 0)) / (2^bits - 1)`,
 *   zero `round(-min(w, 0) / scale)`;
 *
 * the scale rounded to an f16 (1 for an all-zero group) and `code = clamp(round(w / scale) +
 * zero, 0, 2^bits - 1)`. GPTQ's act-order (`desc_act`) is imitated by a seeded permutation of
 * the inputs: group `g` holds the inputs at positions `g * group_size ..` of that order, and
 * `g_idx` says so.
 *
 * @module
 */

/** How make-model writes a packed-integer checkpoint. */
export interface PackedIntLayout {
  readonly method: "gptq" | "awq";
  readonly bits: 4 | 8;
  /** Inputs per group; -1: one group per row. */
  readonly groupSize: number;
  /** GPTQ only: symmetric codes (default), or zero points per group. */
  readonly symmetric?: boolean;
  /** GPTQ only: permuted groups with a `g_idx` (`desc_act: true`). */
  readonly actOrder?: boolean;
  /** GPTQ only: `gptq_v2` zero points (as they are) instead of `gptq`'s `zero - 1`. */
  readonly v2?: boolean;
}

/** `config.json`'s `quantization_config` for `layout`, as transformers writes it. */
export function packedIntQuantizationConfig(layout: PackedIntLayout): Record<string, unknown> {
  if (layout.method === "awq") {
    return {
      quant_method: "awq",
      bits: layout.bits,
      group_size: layout.groupSize,
      zero_point: true,
      version: "gemm",
      modules_to_not_convert: null,
    };
  }
  return {
    quant_method: "gptq",
    bits: layout.bits,
    group_size: layout.groupSize,
    desc_act: layout.actOrder ?? false,
    sym: layout.symmetric ?? true,
    checkpoint_format: layout.v2 ? "gptq_v2" : "gptq",
    damp_percent: 0.01,
    true_sequential: true,
    use_exllama: true,
  };
}

/** The stored tensors of one packed weight (int32 words as bytes, f16 scales as bytes). */
export interface PackedIntTensors {
  readonly qweight: { shape: number[]; data: Uint32Array };
  readonly qzeros: { shape: number[]; data: Uint32Array };
  readonly scales: { shape: number[]; data: Float16Array };
  /** GPTQ only. */
  readonly g_idx?: { shape: number[]; data: Int32Array };
}

/** A seeded xorshift permutation of `0 .. n - 1`. */
function permutation(n: number, seed: number): Int32Array {
  const order = Int32Array.from({ length: n }, (_, i) => i);
  let s = (seed ^ 0x9e3779b9) >>> 0 || 1;
  for (let i = n - 1; i > 0; i--) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    const j = (s >>> 0) % (i + 1);
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  return order;
}

/**
 * Quantizes row-major `[rows, cols]` values (`rows` a multiple of `32 / bits`) in `layout`,
 * `seed` choosing the act-order permutation.
 */
export function quantizePackedInt(
  values: Float32Array,
  rows: number,
  cols: number,
  layout: PackedIntLayout,
  seed = 0,
): PackedIntTensors {
  const { method, bits } = layout;
  const per = 32 / bits;
  const maxq = (1 << bits) - 1;
  const size = layout.groupSize === -1 ? cols : layout.groupSize;
  const groups = Math.ceil(cols / size);
  const symmetric = method === "gptq" && (layout.symmetric ?? true);
  const order = method === "gptq" && layout.actOrder
    ? permutation(cols, seed)
    : Int32Array.from({ length: cols }, (_, i) => i);
  const gIdx = new Int32Array(cols);
  order.forEach((input, k) => gIdx[input] = Math.floor(k / size));

  const scales = new Float16Array(groups * rows);
  const zeros = new Int32Array(groups * rows);
  const codes = new Int32Array(rows * cols);
  for (let o = 0; o < rows; o++) {
    for (let g = 0; g < groups; g++) {
      const members = order.subarray(g * size, Math.min(cols, (g + 1) * size));
      let lo = 0;
      let hi = 0;
      for (const i of members) {
        lo = Math.min(lo, values[o * cols + i]!);
        hi = Math.max(hi, values[o * cols + i]!);
      }
      if (symmetric) hi = Math.max(hi, -lo), lo = -hi;
      let scale = Math.f16round((hi - lo) / maxq);
      if (scale === 0) scale = 1;
      const zero = symmetric ? (maxq + 1) / 2 : Math.min(maxq, Math.round(-lo / scale));
      scales[g * rows + o] = scale;
      zeros[g * rows + o] = zero;
      for (const i of members) {
        codes[o * cols + i] = Math.min(
          maxq,
          Math.max(0, Math.round(values[o * cols + i]! / scale) + zero),
        );
      }
    }
  }

  // Zero points, packed along the outputs (AWQ's interleaved order for AWQ).
  const position = (o: number) => method === "awq" ? [0, 4, 1, 5, 2, 6, 3, 7][o % per]! : o % per;
  const offset = method === "gptq" && !layout.v2 ? 1 : 0;
  const qzeros = new Uint32Array(groups * (rows / per));
  for (let g = 0; g < groups; g++) {
    for (let o = 0; o < rows; o++) {
      const at = g * (rows / per) + Math.floor(o / per);
      qzeros[at] =
        (qzeros[at]! | ((zeros[g * rows + o]! - offset) & maxq) << (bits * position(o))) >>>
        0;
    }
  }
  if (method === "gptq") {
    const qweight = new Uint32Array((cols / per) * rows);
    for (let i = 0; i < cols; i++) {
      for (let o = 0; o < rows; o++) {
        const at = Math.floor(i / per) * rows + o;
        qweight[at] = (qweight[at]! | (codes[o * cols + i]! << (bits * (i % per)))) >>> 0;
      }
    }
    return {
      qweight: { shape: [cols / per, rows], data: qweight },
      qzeros: { shape: [groups, rows / per], data: qzeros },
      scales: { shape: [groups, rows], data: scales },
      g_idx: { shape: [cols], data: gIdx },
    };
  }
  const qweight = new Uint32Array(cols * (rows / per));
  for (let i = 0; i < cols; i++) {
    for (let o = 0; o < rows; o++) {
      const at = i * (rows / per) + Math.floor(o / per);
      qweight[at] = (qweight[at]! | (codes[o * cols + i]! << (bits * position(o)))) >>> 0;
    }
  }
  return {
    qweight: { shape: [cols, rows / per], data: qweight },
    qzeros: { shape: [groups, rows / per], data: qzeros },
    scales: { shape: [groups, rows], data: scales },
  };
}
