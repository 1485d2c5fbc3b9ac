/**
 * Plain-text and Markdown tables for the benchmarks' console output and reports.
 *
 * @module
 */

/** A fixed-width text table: columns padded to their widest cell, numbers right-aligned. */
export function textTable(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: readonly string[]) =>
    cells.map((c, i) => {
      const w = widths[i] ?? c.length;
      return /^[-+]?[\d.,]+(%|x)?$/.test(c) ? c.padStart(w) : c.padEnd(w);
    }).join("  ").trimEnd();
  return [line(header), widths.map((w) => "-".repeat(w)).join("  "), ...rows.map(line)].join("\n");
}

/** A GitHub-flavoured Markdown table. */
export function markdownTable(
  header: readonly string[],
  rows: readonly (readonly string[])[],
): string {
  const esc = (c: string) => c.replace(/\|/g, "\\|");
  return [
    `| ${header.map(esc).join(" | ")} |`,
    `| ${header.map(() => "---").join(" | ")} |`,
    ...rows.map((r) => `| ${r.map(esc).join(" | ")} |`),
  ].join("\n");
}

/** `v` with `digits` decimals, or "n/a" when not finite. */
export function fmt(v: number, digits = 1): string {
  return Number.isFinite(v) ? v.toFixed(digits) : "n/a";
}
