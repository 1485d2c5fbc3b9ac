/**
 * A one-rule template for kernels whose register tile is written out line by line (see
 * `matmul_unrolled.wgsl`): WGSL has no loop-unrolling directive, and on lavapipe a tile kept in
 * arrays indexed by loop counters is several times slower than the same tile in named
 * variables.
 *
 * Rule: a line that contains `$i` is emitted once per `i < counts.i`, a line that contains `$r`
 * once per `r < counts.r`, one that contains `$c` once per `c < counts.c` (default 1), a line
 * with several of them once per combination (`i` outermost, then `r`, then `c`); every marker in
 * it is replaced by its number. Other lines pass through unchanged.
 *
 * @module
 */

/** Repetition counts of {@linkcode unrollTemplate}. */
export interface UnrollCounts {
  /** Copies of lines mentioning `$i`. */
  readonly i: number;
  /** Copies of lines mentioning `$r`. */
  readonly r: number;
  /** Copies of lines mentioning `$c` (default 1). */
  readonly c?: number;
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
  const nc = counts.c ?? 1;
  for (const line of source.split("\n")) {
    const hasI = line.includes("$i");
    const hasR = line.includes("$r");
    const hasC = line.includes("$c");
    if (!hasI && !hasR && !hasC) {
      out.push(line);
      continue;
    }
    for (let i = 0; i < (hasI ? counts.i : 1); i++) {
      for (let r = 0; r < (hasR ? counts.r : 1); r++) {
        for (let c = 0; c < (hasC ? nc : 1); c++) {
          out.push(
            line.replaceAll("$i", String(i)).replaceAll("$r", String(r)).replaceAll(
              "$c",
              String(c),
            ),
          );
        }
      }
    }
  }
  return out.join("\n");
}
