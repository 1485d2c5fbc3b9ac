/**
 * The WGSL the kernels over rows of logits share (`sample`, `top_logprobs`, `logits_process`):
 * the `logit_row.wgsl` prelude (sentinels, `order_key`, `mix32`) and the row scan, a one-rule
 * template for the loop that visits every logit of a row with 4 loads in flight.
 *
 * Rule: a line `ROW_SCAN(<statement>);` is replaced by a block in which the workgroup's WG
 * invocations stride `logits[base + i]` for `i < vocab` (`i` from `lid`, 4 elements per step,
 * then the tail one by one), running `<statement>` for each element with `$logit` replaced by
 * the element and `$index` by its `i`. The kernel must have `logits`, `base`, `vocab`, `lid`
 * and `WG` in scope there. An unexpanded line does not compile (`$` is not WGSL).
 *
 * @module
 */

import prelude from "./logit_row.wgsl" with { type: "text" };

const MARKER = /^( *)ROW_SCAN\((.*)\);$/gm;

/** The loop that runs `visit` (with `$logit` / `$index` placeholders) over a row, at `indent`. */
function rowScan(indent: string, visit: string): string {
  const at = (logit: string, index: string) =>
    visit.replaceAll("$logit", logit).replaceAll("$index", index);
  const offsets = ["", " + WG", " + 2u * WG", " + 3u * WG"];
  const lines = [
    "{",
    "  var scan_i = lid;",
    "  for (; scan_i + 3u * WG < vocab; scan_i += 4u * WG) {",
    ...offsets.map((o, j) => `    let scan_l${j} = logits[base + scan_i${o}];`),
    ...offsets.map((o, j) => `    ${at(`scan_l${j}`, `scan_i${o}`)};`),
    "  }",
    "  for (; scan_i < vocab; scan_i += WG) {",
    `    ${at("logits[base + scan_i]", "scan_i")};`,
    "  }",
    "}",
  ];
  return lines.map((l) => indent + l).join("\n");
}

/** Expands the `ROW_SCAN(...)` lines of `source` by the rule in the module documentation. */
export function expandRowScans(source: string): string {
  return source.replace(MARKER, (_, indent: string, visit: string) => rowScan(indent, visit));
}

/** `source` with its row scans expanded, after the `logit_row.wgsl` prelude. */
export function logitRowSource(source: string): string {
  return prelude + expandRowScans(source);
}
