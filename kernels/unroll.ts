/**
 * A one-rule template for kernels whose register tile is written out line by line (see
 * `matmul_unrolled.wgsl`): WGSL has no loop-unrolling directive, and on lavapipe a tile kept in
 * arrays indexed by loop counters is several times slower than the same tile in named
 * variables.
 *
 * Rule: a line that contains `$i` is emitted once per `i < counts.i`, a line that contains `$r`
 * once per `r < counts.r`, one that contains `$c` once per `c < counts.c` (default 1), one that
 * contains `$w` once per `w < counts.w` (default 1), a line with several of them once per
 * combination (`i` outermost, then `r`, `c`, `w`); every marker in it is replaced by its number.
 * Other lines pass through unchanged.
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
  /** Copies of lines mentioning `$w` (default 1). */
  readonly w?: number;
}

/** The markers, outermost first. */
const MARKERS = ["i", "r", "c", "w"] as const;

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
    // The markers this line mentions, outermost first, with their counts.
    const used = MARKERS.filter((m) => line.includes(`$${m}`)).map((m) => ({
      m,
      n: counts[m] ?? 1,
    }));
    const emit = (k: number, text: string): void => {
      if (k === used.length) {
        out.push(text);
        return;
      }
      const { m, n } = used[k]!;
      for (let v = 0; v < n; v++) emit(k + 1, text.replaceAll(`$${m}`, String(v)));
    };
    emit(0, line);
  }
  return out.join("\n");
}
