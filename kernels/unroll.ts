/**
 * A one-rule template for kernels whose register tile is written out line by line (see
 * `matmul_unrolled.wgsl`): WGSL has no loop-unrolling directive, and on lavapipe a tile kept in
 * arrays indexed by loop counters is several times slower than the same tile in named
 * variables.
 *
 * Rule: a line that contains `$i` is emitted once per `i < counts.i`, a line that contains `$r`
 * once per `r < counts.r`, a line with both `counts.i x counts.r` times (`i` outer); every `$i`
 * / `$r` in it is replaced by the number. Other lines pass through unchanged.
 *
 * @module
 */

/** Repetition counts of {@linkcode unrollTemplate}. */
export interface UnrollCounts {
  /** Copies of lines mentioning `$i`. */
  readonly i: number;
  /** Copies of lines mentioning `$r`. */
  readonly r: number;
}

/**
 * Expands `source` by the rule in the module documentation.
 *
 * @throws {RangeError} when a count is not a positive integer.
 */
export function unrollTemplate(source: string, counts: UnrollCounts): string {
  for (const [name, n] of Object.entries(counts)) {
    if (!Number.isInteger(n) || n < 1) {
      throw new RangeError(
        `Cannot unroll template: count ${name} = ${n} is not a positive integer`,
      );
    }
  }
  const out: string[] = [];
  for (const line of source.split("\n")) {
    const hasI = line.includes("$i");
    const hasR = line.includes("$r");
    if (!hasI && !hasR) {
      out.push(line);
      continue;
    }
    for (let i = 0; i < (hasI ? counts.i : 1); i++) {
      for (let r = 0; r < (hasR ? counts.r : 1); r++) {
        out.push(line.replaceAll("$i", String(i)).replaceAll("$r", String(r)));
      }
    }
  }
  return out.join("\n");
}
