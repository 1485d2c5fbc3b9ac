/**
 * Float64 reference of the embedding gather.
 *
 * @module
 */

/**
 * `out[t] = base[t] + table[ids[t]]` for `[vocab, hidden]` `table` (row-major, no padding);
 * an id >= vocab contributes a zero row. `base` omitted means zeros (plain gather).
 */
export function embeddingRef(
  ids: ArrayLike<number>,
  table: ArrayLike<number>,
  vocab: number,
  hidden: number,
  base?: ArrayLike<number>,
): Float64Array {
  const out = new Float64Array(ids.length * hidden);
  for (let t = 0; t < ids.length; t++) {
    const id = ids[t]!;
    for (let c = 0; c < hidden; c++) {
      const v = id < vocab ? table[id * hidden + c]! : 0;
      out[t * hidden + c] = (base === undefined ? 0 : base[t * hidden + c]!) + v;
    }
  }
  return out;
}
