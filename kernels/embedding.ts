/**
 * `embedding`: `out[t] = table[ids[t]]` (or `out[t] += table[ids[t]]`) over a possibly split
 * `[vocab, hidden]` table. See `embedding.wgsl` for bindings and grid.
 *
 * @module
 */

import source from "./embedding.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import { weightPrelude } from "../gpu/dtype.ts";
import type { ParamArena, ParamSlot } from "../gpu/params.ts";
import { type GpuMatrix, partResource } from "../gpu/tensor.ts";
import { dispatch1d, groupsFor } from "./dispatch.ts";
import { wordIndexFunction, wordTextureFunction } from "./matmul_weight_bindings.ts";
import { wordLayoutTag } from "../gpu/quant.ts";

/**
 * The table binding and `table_at(row, c)` (element c of row `row` of a part, as f32) for
 * `table`'s format.
 */
function tablePrelude(table: GpuMatrix): string {
  if (table.quant === null) {
    return weightPrelude(table.dtype) +
      "@group(0) @binding(2) var<storage, read> table: array<WT>;\n" +
      "fn table_at(row: u32, c: u32) -> f32 {\n  return f32(table[row * p.row_stride + c]);\n}\n";
  }
  // Value c of a row sits in bits bits * (c % per) of the row's word c / per (gpu/quant.ts; the
  // words in the table's word layout: `table_word`); shifting it to the top and back (arithmetic
  // shift on i32) sign-extends it. The scales are in blocks of 8 rows (gpu/quant.ts
  // deviceScaleIndex).
  const [bits, per] = table.quant === "int4" ? [4, 8] : [8, 4];
  const layout = table.wordLayout;
  // Word j of row `row`: in a buffer through w_index; in a texture component j % 4 of unit j / 4
  // (wordTextureFunction).
  const words = layout === "texture"
    ? wordTextureFunction(2, "table") +
      "fn table_word(row: u32, j: u32) -> u32 {\n  return table_texel(row, j >> 2u)[j & 3u];\n}\n"
    : "@group(0) @binding(2) var<storage, read> table: array<u32>;\n" +
      wordIndexFunction(layout, "p.hidden") +
      "fn table_word(row: u32, j: u32) -> u32 {\n" +
      `  return table[w_index(row, j, ${32 / per}u)];\n}\n`;
  return words +
    "@group(0) @binding(4) var<storage, read> scales: array<u32>;\n" +
    "fn table_at(row: u32, c: u32) -> f32 {\n" +
    `  let word = table_word(row, c / ${per}u);\n` +
    `  let q = bitcast<i32>(word << (${32 - bits}u - ${bits}u * (c % ${per}u))) >> ${
      32 - bits
    }u;\n` +
    "  let j = ((row >> 3u) * (p.hidden / 32u) + c / 32u) * 8u + (row & 7u);\n" +
    "  let pair = unpack2x16float(scales[j >> 1u]);\n" +
    "  return f32(q) * select(pair.x, pair.y, (row & 1u) == 1u);\n}\n";
}

/** Buffers of one `embedding` call site; fixed for the op's lifetime. */
export interface EmbeddingBuffers {
  /** u32 `[tokens]`: row indices (token ids, or positions for position embeddings). */
  readonly ids: GPUBufferBinding;
  /** f16 / f32 or int8 / int4 `[vocab, hidden]`, in one or more parts. */
  readonly table: GpuMatrix;
  /** f32 `[tokens, hidden]`: the gathered rows. */
  readonly out: GPUBufferBinding;
}

/** Options of one `embedding` call site. */
export interface EmbeddingBindOptions {
  /**
   * Add the rows to `out` instead of overwriting it (GPT-2's learned position embeddings,
   * `ids` = positions). Ids >= vocab then leave `out` unchanged. Default false.
   */
  readonly accumulate?: boolean;
}

/** The `embedding` kernel; {@linkcode Embedding.bind} makes call sites. */
export class Embedding {
  readonly #ctx: GpuContext;

  /**
   * Pipelines are compiled through `ctx.pipeline` on the first bind of each table dtype and
   * mode (once per context), never per step.
   */
  constructor(ctx: GpuContext) {
    this.#ctx = ctx;
  }

  /**
   * Creates a call site: one bind group and parameter slot per table part, made once, here.
   */
  bind(
    arena: ParamArena,
    buffers: EmbeddingBuffers,
    options: EmbeddingBindOptions = {},
  ): EmbeddingOp {
    const { table } = buffers;
    const accumulate = options.accumulate ?? false;
    const mode = accumulate ? "accumulate" : "gather";
    const pipeline = this.#ctx.pipeline(
      `embedding/${mode}/${table.format}${wordLayoutTag(table.wordLayout)}`,
      () => tablePrelude(table) + source,
      { ACCUMULATE: accumulate ? 1 : 0 },
    );
    const parts = table.parts.map((part, index) => {
      const slot = arena.allocate();
      const bindGroup = this.#ctx.device.createBindGroup({
        label: `embedding/${mode} ${table.label} part ${index}`,
        layout: pipeline.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: slot.binding },
          { binding: 1, resource: buffers.ids },
          { binding: 2, resource: partResource(part) },
          { binding: 3, resource: buffers.out },
          ...(part.scales === null ? [] : [{ binding: 4, resource: { buffer: part.scales } }]),
        ],
      });
      return { slot, bindGroup, rowStart: part.rowStart, rows: part.rows };
    });
    return new EmbeddingOp(pipeline, parts, table, {
      ids: Math.floor(
        (buffers.ids.size ?? buffers.ids.buffer.size - (buffers.ids.offset ?? 0)) / 4,
      ),
      out: Math.floor(
        (buffers.out.size ?? buffers.out.buffer.size - (buffers.out.offset ?? 0)) / 4,
      ),
    });
  }
}

interface BoundPart {
  readonly slot: ParamSlot;
  readonly bindGroup: GPUBindGroup;
  readonly rowStart: number;
  readonly rows: number;
}

/** One `embedding` call site. */
export class EmbeddingOp {
  readonly #pipeline: GPUComputePipeline;
  readonly #parts: readonly BoundPart[];
  readonly #table: GpuMatrix;
  readonly #capacity: { readonly ids: number; readonly out: number };

  constructor(
    pipeline: GPUComputePipeline,
    parts: readonly BoundPart[],
    table: GpuMatrix,
    capacity: { readonly ids: number; readonly out: number },
  ) {
    this.#pipeline = pipeline;
    this.#parts = parts;
    this.#table = table;
    this.#capacity = capacity;
  }

  /**
   * Encodes the gather for `tokens` ids: one dispatch per table part.
   *
   * @throws {RangeError} when `ids` holds fewer than `tokens` ids or `out` fewer than
   *   `tokens * hidden` values.
   */
  encode(pass: GPUComputePassEncoder, tokens: number): void {
    const hidden = this.#table.cols;
    if (tokens > this.#capacity.ids || tokens * hidden > this.#capacity.out) {
      throw new RangeError(
        `Cannot encode embedding of ${tokens} tokens x ${hidden}: ids holds ${this.#capacity.ids}, out holds ${this.#capacity.out} values`,
      );
    }
    if (tokens <= 0) return;
    pass.setPipeline(this.#pipeline);
    const groups = tokens * groupsFor(hidden, 256);
    for (const [index, part] of this.#parts.entries()) {
      part.slot.setU32(
        0,
        tokens,
        hidden,
        this.#table.rowStride,
        part.rowStart,
        part.rows,
        this.#table.rows,
        index === 0 ? 1 : 0,
      );
      pass.setBindGroup(0, part.bindGroup);
      dispatch1d(pass, groups);
    }
  }
}
