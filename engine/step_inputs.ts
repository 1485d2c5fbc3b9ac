/**
 * A step's inputs on their way to the GPU: the batch's token ids, positions, KV slots, context
 * lengths and query offsets packed into host arrays and staged into the step's one upload
 * (gpu/staged_writes.ts), and the block tables' changes since the rows the GPU keeps
 * (engine/block_table_rows.ts). The model runner owns one; the arrays are sized once for its
 * largest step, so a step allocates nothing here.
 *
 * @module
 */

import type { StagedWrites } from "../gpu/staged_writes.ts";
import { BlockTableRows } from "./block_table_rows.ts";
import type { ForwardBatch } from "./forward_batch.ts";
import type { StepBuffers } from "./step_buffers.ts";

/** What the step's kernels are told about its shape, from the staged batch. */
export interface StagedShape {
  /** Every sequence of the step has one new token. */
  readonly allDecode: boolean;
  /** The longest context of the step's sequences, in tokens. */
  readonly maxContextLen: number;
}

/** The host side of a runner's step inputs (see the module documentation). */
export class StepInputs {
  readonly #bufs: StepBuffers;
  readonly #tableRows: BlockTableRows;
  /** u32 `[maxSeqs + 1]`: where each sequence's tokens start in the step, then the total. */
  readonly #cuQLens: Uint32Array<ArrayBuffer>;
  /** u32 `[maxSeqs]`: each sequence's context length after the step. */
  readonly #contextLens: Uint32Array<ArrayBuffer>;
  /** u32 `[maxTokens]` each: the tokens' ids, positions and KV-cache slots. */
  readonly #ids: Uint32Array<ArrayBuffer>;
  readonly #positions: Uint32Array<ArrayBuffer>;
  readonly #slots: Uint32Array<ArrayBuffer>;

  /** Host arrays for the steps `bufs` holds (its `capacity`). */
  constructor(bufs: StepBuffers) {
    const { maxTokens: T, maxSeqs: S, maxBlocksPerSeq } = bufs.capacity;
    this.#bufs = bufs;
    this.#tableRows = new BlockTableRows(S, maxBlocksPerSeq);
    this.#cuQLens = new Uint32Array(S + 1);
    this.#contextLens = new Uint32Array(S);
    this.#ids = new Uint32Array(T);
    this.#positions = new Uint32Array(T);
    this.#slots = new Uint32Array(T);
  }

  /**
   * Block-table entries the last {@linkcode stage} staged (a header of one per sequence, and the
   * entries its tables gained).
   */
  get stagedBlockTableEntries(): number {
    return this.#tableRows.lastStagedEntries;
  }

  /**
   * Packs `batch` (already validated against the buffers' capacity) and stages its writes to the
   * step buffers into `writes`.
   */
  stage(batch: ForwardBatch, writes: StagedWrites): StagedShape {
    const T = batch.inputIds.length;
    const S = batch.seqs.length;
    let tokens = 0;
    let maxContextLen = 0;
    let allDecode = true;
    this.#cuQLens[0] = 0;
    for (let s = 0; s < S; s++) {
      const seq = batch.seqs[s]!;
      tokens += seq.queryLen;
      this.#cuQLens[s + 1] = tokens;
      this.#contextLens[s] = seq.contextLen;
      maxContextLen = Math.max(maxContextLen, seq.contextLen);
      if (seq.queryLen !== 1) allDecode = false;
    }
    this.#ids.set(batch.inputIds);
    this.#positions.set(batch.positions);
    this.#slots.set(batch.slotMapping);
    const bufs = this.#bufs;
    writes.write(bufs.hostIds, this.#ids, T);
    writes.write(bufs.positions, this.#positions, T);
    writes.write(bufs.slotMapping, this.#slots, T);
    this.#tableRows.stage(batch.seqs.map((seq) => seq.blockTable), writes, bufs.blockTables);
    writes.write(bufs.contextLens, this.#contextLens, S);
    writes.write(bufs.cuQLens, this.#cuQLens, S + 1);
    return { allDecode, maxContextLen };
  }
}
