/**
 * The call site of `PagedAttentionPrefill` (kernels/paged_attention_prefill.ts): its
 * bind group and parameter slot, made once by `PagedAttentionPrefill.bind`, and the encode of one
 * step's prefill attention.
 *
 * @module
 */

import type { ParamSlot } from "../gpu/params.ts";
import { checkBlockTableStride } from "./block_table_stride.ts";
import { dispatch1d } from "./dispatch.ts";

/** One `paged_attention_prefill` call site. */
export class PagedAttentionPrefillOp {
  /** Made by `PagedAttentionPrefill.bind`, which validated the layout. */
  constructor(
    private readonly pipeline: GPUComputePipeline,
    private readonly bindGroup: GPUBindGroup,
    private readonly slot: ParamSlot,
    private readonly tileQueries: number,
    private readonly numKvHeads: number,
    /** The block-table row stride bound (the most entries a row of the buffer holds). */
    private readonly maxBtStride: number,
  ) {}

  /**
   * Sets the block-table layout of the next encodes (see
   * `PagedAttentionDecodeOp.setBlockTableStride`).
   *
   * @throws {RangeError} when `stride` is neither 0 (`INDEXED_ROWS`, kernels/block_table_stride.ts)
   *   nor an integer in [1, the bound stride].
   */
  setBlockTableStride(stride: number): void {
    this.slot.setU32(5, checkBlockTableStride(stride, this.maxBtStride));
  }

  /**
   * Encodes attention for `numSeqs` sequences holding `numTokens` new query tokens in all.
   * `tiles` is the exact tile count (`PagedAttentionPrefill.countTiles`); without it
   * the bound `ceil(numTokens / tileQueries) + numSeqs - 1` is dispatched (extra workgroups
   * exit at once). `cuQLens`, `contextLens` and `blockTables` must already hold this step's
   * values for the first `numSeqs` sequences.
   */
  encode(
    pass: GPUComputePassEncoder,
    numSeqs: number,
    numTokens: number,
    tiles?: number,
  ): void {
    if (numSeqs <= 0 || numTokens <= 0) return;
    const bound = Math.ceil(numTokens / this.tileQueries) + numSeqs - 1;
    const numTiles = tiles === undefined ? bound : Math.min(tiles, bound);
    this.slot.setU32(0, numSeqs);
    this.slot.setU32(7, numTiles);
    pass.setPipeline(this.pipeline);
    pass.setBindGroup(0, this.bindGroup);
    dispatch1d(pass, numTiles * this.numKvHeads);
  }
}
