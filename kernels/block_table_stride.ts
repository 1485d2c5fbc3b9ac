/**
 * How the paged attention kernels find a sequence's row of `block_tables` (their io files'
 * `table_row`): packed rows `stride` entries apart (row s at `s * stride`), or, with stride
 * {@linkcode INDEXED_ROWS}, rows anywhere in the buffer, row s starting at the offset held in
 * entry s (a header of one offset per sequence of the step: the runner's rows kept across steps,
 * engine/block_table_rows.ts).
 *
 * @module
 */

/** The stride that makes entry s of `block_tables` the offset of sequence s's row. */
export const INDEXED_ROWS = 0;

/**
 * Checks a block-table stride for the attention parameters: {@linkcode INDEXED_ROWS}, or an
 * integer from 1 to the stride the call site was bound with.
 *
 * @throws {RangeError} otherwise.
 */
export function checkBlockTableStride(stride: number, maxBtStride: number): number {
  if (!Number.isInteger(stride) || stride < INDEXED_ROWS || stride > maxBtStride) {
    throw new RangeError(
      `Cannot use a block-table stride of ${stride}: ${INDEXED_ROWS} (indexed rows) or between 1 ` +
        `and ${maxBtStride}`,
    );
  }
  return stride;
}
