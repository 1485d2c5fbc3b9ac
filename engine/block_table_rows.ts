/**
 * The step's block tables as the attention kernels read them in the indexed layout
 * (kernels/block_table_stride.ts `INDEXED_ROWS`), kept on the GPU across steps so a step uploads
 * only what changed: a header of one row offset per sequence of the step, and the entries a
 * sequence's table gained since its row was last written (one block per `block_size` tokens),
 * never the whole table again. So the host's work per step does not grow with the sequences'
 * lengths (vLLM v1 keeps its block tables on the worker the same way and is sent new block ids).
 *
 * Buffer layout, u32: `[maxSeqs]` header (entry s: the offset of sequence s's row), then
 * `numRows = 2 * maxSeqs` rows of `maxBlocksPerSeq` entries. Rows are a cache keyed by the table
 * array: the scheduler hands over its own array for a sequence (scheduler/step_commit.ts), only
 * appends to it while the sequence keeps its blocks, and gives a rebuilt table (after a
 * preemption or a swap) a new array; a caller that builds new arrays every step (tests, benches)
 * gets its rows rewritten, correct and as costly as before. A row not used by this step is
 * reused for a new table in least-recently-used order; an earlier step still in flight read it
 * before this step's copies run (queue order). As a guard against a table changed in place, the
 * last entry uploaded is compared each step and the row rewritten on a mismatch.
 *
 * @module
 */

import type { StagedWrites } from "../gpu/staged_writes.ts";

/** u32 entries of the block-table buffer for `maxSeqs` sequences of `maxBlocksPerSeq` blocks. */
export function blockTableEntries(maxSeqs: number, maxBlocksPerSeq: number): number {
  return maxSeqs + 2 * maxSeqs * maxBlocksPerSeq;
}

/** The GPU block-table rows of a runner (see the module documentation). */
export class BlockTableRows {
  readonly maxSeqs: number;
  readonly maxBlocksPerSeq: number;
  readonly numRows: number;
  /** The table each row holds, or null. */
  readonly #tables: (readonly number[] | null)[];
  readonly #rowOf = new Map<readonly number[], number>();
  /** Per row: entries uploaded, the last of them, and the step that last used it. */
  readonly #uploaded: Int32Array;
  readonly #last: Float64Array;
  readonly #used: Float64Array;
  readonly #header: Uint32Array<ArrayBuffer>;
  readonly #scratch: Uint32Array<ArrayBuffer>;
  #step = 0;
  /** Entries staged by the last {@linkcode stage} (header included), for tests and benches. */
  lastStagedEntries = 0;

  constructor(maxSeqs: number, maxBlocksPerSeq: number) {
    this.maxSeqs = maxSeqs;
    this.maxBlocksPerSeq = maxBlocksPerSeq;
    this.numRows = 2 * maxSeqs;
    this.#tables = new Array(this.numRows).fill(null);
    this.#uploaded = new Int32Array(this.numRows);
    this.#last = new Float64Array(this.numRows);
    this.#used = new Float64Array(this.numRows);
    this.#header = new Uint32Array(maxSeqs);
    this.#scratch = new Uint32Array(maxBlocksPerSeq);
  }

  /**
   * Stages the writes that make `target` hold `tables` (one per sequence of the step, in order)
   * in the indexed layout: the header, and each row's entries past those it already holds.
   *
   * @throws {RangeError} when there are more tables than `maxSeqs` or a table is longer than
   *   `maxBlocksPerSeq`.
   */
  stage(tables: readonly (readonly number[])[], writes: StagedWrites, target: GPUBuffer): void {
    if (tables.length > this.maxSeqs) {
      throw new RangeError(`Cannot stage ${tables.length} block tables: room for ${this.maxSeqs}`);
    }
    const step = ++this.#step;
    let staged = tables.length;
    for (let s = 0; s < tables.length; s++) {
      const table = tables[s]!;
      const len = table.length;
      if (len > this.maxBlocksPerSeq) {
        throw new RangeError(
          `Cannot stage a block table of ${len} blocks: rows hold ${this.maxBlocksPerSeq}`,
        );
      }
      let row = this.#rowOf.get(table);
      if (row === undefined) row = this.#assign(table, step);
      this.#used[row] = step;
      const base = this.maxSeqs + row * this.maxBlocksPerSeq;
      this.#header[s] = base;
      let from = this.#uploaded[row]!;
      if (from > len || (from > 0 && table[from - 1] !== this.#last[row])) from = 0;
      if (len > from) {
        for (let i = from; i < len; i++) this.#scratch[i - from] = table[i]!;
        writes.write(target, this.#scratch, len - from, 4 * (base + from));
        staged += len - from;
        this.#uploaded[row] = len;
        this.#last[row] = table[len - 1]!;
      }
    }
    writes.write(target, this.#header, tables.length);
    this.lastStagedEntries = staged;
  }

  /** A row for a table not held: the least recently used one not used by this step. */
  #assign(table: readonly number[], step: number): number {
    let row = -1;
    for (let r = 0; r < this.numRows; r++) {
      if (this.#used[r]! < step && (row < 0 || this.#used[r]! < this.#used[row]!)) row = r;
    }
    // numRows = 2 * maxSeqs > the step's tables, so a row is always free.
    const old = this.#tables[row];
    if (old !== null && old !== undefined) this.#rowOf.delete(old);
    this.#tables[row] = table;
    this.#rowOf.set(table, row);
    this.#uploaded[row] = 0;
    return row;
  }
}
