/**
 * Renders a {@linkcode BenchReport} as Markdown: a header (command, date, server, workload), a
 * section per level with its totals and a Min / Mean / P50 / P95 / P99 / Max table, then an
 * analysis table across levels with the rule-based observations, and links to the SVG charts.
 *
 * @module
 */

import type { Summary } from "./metrics.ts";
import { type BenchReport, type LevelReport, num } from "./report.ts";
import { CHART_FILES } from "./report_svg.ts";
import type { IntRange } from "./workload.ts";

function range(r: IntRange): string {
  return r.min === r.max ? `${r.min}` : `${r.min}-${r.max} (uniform)`;
}

function cell(s: string): string {
  return s.replace(/\|/g, "\\|").replace(/\n/g, " ");
}

function table(head: string[], rows: string[][]): string {
  const lines = [
    `| ${head.join(" | ")} |`,
    `|${head.map(() => "---").join("|")}|`,
    ...rows.map((r) => `| ${r.map(cell).join(" | ")} |`),
  ];
  return lines.join("\n");
}

function summaryRow(name: string, s: Summary | null, integer = false): string[] {
  const f = (v: number) => (integer && Number.isInteger(v) ? `${v}` : num(v));
  if (s === null) return [name, "-", "-", "-", "-", "-", "-"];
  return [name, f(s.min), f(s.mean), f(s.p50), f(s.p95), f(s.p99), f(s.max)];
}

function levelTitle(l: LevelReport): string {
  if (l.requestRate === null) return `Concurrency Level: ${l.concurrency}`;
  const cap = l.concurrency === null ? "" : ` (max concurrency ${l.concurrency})`;
  const rate = Number.isFinite(l.requestRate) ? `${l.requestRate} req/s` : "inf (all at once)";
  return `Request Rate: ${rate}${cap}`;
}

function levelSection(l: LevelReport): string {
  const m = l.metrics;
  const bullets = [
    `**Total Requests:** ${m.totalRequests} (successful ${m.successful}, failed ${m.failed})`,
    `**Total Time:** ${m.durationS.toFixed(2)} s`,
    `**Request Throughput:** ${num(m.requestThroughput)} req/s`,
    `**Output Throughput:** ${num(m.outputThroughput)} tokens/s`,
    `**Total Throughput:** ${num(m.totalThroughput)} tokens/s`,
    `**Tokens:** ${m.totalInputTokens} input, ${m.totalOutputTokens} output`,
    `**Preemptions (server /metrics):** ${l.preemptions ?? "not reported"}`,
  ];
  if (m.goodput !== null) {
    bullets.push(
      `**Goodput:** ${num(m.goodput)} req/s (${m.goodRequests} of ${m.totalRequests} within SLO)`,
    );
  }
  const parts = [
    `## ${levelTitle(l)}`,
    bullets.map((b) => `*   ${b}`).join("\n"),
    table(["Metric", "Min", "Mean", "P50", "P95", "P99", "Max"], [
      summaryRow("TTFT (ms)", m.ttftMs),
      summaryRow("TPOT (ms)", m.tpotMs),
      summaryRow("ITL (ms)", m.itlMs),
      summaryRow("E2E Latency (ms)", m.e2eMs),
      summaryRow("Output Tokens", m.outputTokens, true),
    ]),
  ];
  if (m.errors.length > 0) {
    parts.push(
      "**Errors:**\n\n" + m.errors.map((e) => `- ${e.count}x ${cell(e.message)}`).join("\n"),
    );
  }
  parts.push("-".repeat(40));
  return parts.join("\n\n");
}

/** The header table: the command, the server and the workload. */
function settingsTable(report: BenchReport): string {
  const c = report.config;
  const slo = [
    c.slo.ttftMs !== undefined ? `TTFT <= ${c.slo.ttftMs} ms` : "",
    c.slo.tpotMs !== undefined ? `TPOT <= ${c.slo.tpotMs} ms` : "",
  ].filter((s) => s !== "").join(", ");
  const prompt = c.promptKind === "tokens"
    ? `token ids uniform in ${c.vocab.min}-${c.vocab.max}`
    : "random English words (about one token each)";
  const load = c.mode === "concurrency"
    ? `closed loop, concurrency ${c.concurrency.join(", ")}`
    : `open loop, request rate ${c.requestRates.join(", ")} req/s, burstiness ${c.burstiness}` +
      (c.concurrency.length > 0 ? `, max concurrency ${c.concurrency[0]}` : "");
  return table(["Setting", "Value"], [
    ["Command", `\`${report.command}\``],
    ["Date", report.date],
    [
      "Server",
      report.url + (report.modelDir === null ? "" : ` (started with --model ${report.modelDir})`),
    ],
    ["Server model", report.serverModels.join(", ") || "-"],
    ["Server header", report.serverHeader ?? "-"],
    ["Requested model", report.servedModelName],
    ["Load", load],
    ["Requests per level", c.requestsPerLevel.join(", ")],
    ["Input length (tokens)", `${range(c.inputLen)}; ${prompt}`],
    [
      "Output length (tokens)",
      `${range(c.outputLen)}; ignore_eos ${c.ignoreEos}, temperature ${c.temperature}`,
    ],
    ["Seed", `${c.seed}`],
    ["SLO (goodput)", slo || "none (goodput not computed)"],
    ["Per-request timeout", `${c.timeoutS} s`],
    ["Warm-up requests", `${c.warmupRequests} (not counted)`],
  ]);
}

/** The analysis table: one row of headline figures per level. */
function analysisTable(levels: readonly LevelReport[]): string {
  const first = levels[0];
  const loadHead = first?.requestRate !== null && first !== undefined
    ? "Rate (req/s)"
    : "Concurrency";
  const rows = levels.map((l) => {
    const m = l.metrics;
    return [
      l.requestRate === null ? `${l.concurrency}` : `${l.requestRate}`,
      `${m.successful}/${m.totalRequests}`,
      num(m.requestThroughput),
      num(m.outputThroughput),
      num(m.totalThroughput),
      num(m.ttftMs?.p50),
      num(m.ttftMs?.p95),
      num(m.tpotMs?.p50),
      num(m.itlMs?.p95),
      num(m.e2eMs?.p50),
      num(m.e2eMs?.p95),
      m.goodput === null ? "-" : num(m.goodput),
    ];
  });
  return table([
    loadHead,
    "OK/Total",
    "QPS",
    "Output tok/s",
    "Total tok/s",
    "TTFT p50 (ms)",
    "TTFT p95 (ms)",
    "TPOT p50 (ms)",
    "ITL p95 (ms)",
    "E2E p50 (ms)",
    "E2E p95 (ms)",
    "Goodput (req/s)",
  ], rows);
}

/** How every metric of the report is defined. */
const DEFINITIONS = [
  "- TTFT: send to the first streamed chunk carrying a choice (client side; its text may be empty, as in `vllm bench serve`).",
  "- TPOT: (E2E - TTFT) / (output tokens - 1), per request; 1-token requests have none.",
  "- ITL: every gap between consecutive chunks carrying a choice, pooled over the level's requests.",
  "- E2E: send to the end of the stream (`data: [DONE]`), client side.",
  "- Throughputs count successful requests only, over the level's wall time (first send " +
  "to last completion).",
  "- Goodput: successful requests meeting every SLO given, per second.",
  "- Percentiles interpolate linearly between order statistics (numpy's default).",
].join("\n");

/** The Markdown report. */
export function renderMarkdown(report: BenchReport): string {
  const observations = report.observations.map((o, i) => `${i + 1}. ${o}`).join("\n");
  return [
    `# Serving benchmark: ${report.servedModelName}`,
    settingsTable(report),
    ...report.levels.map(levelSection),
    "# Analysis",
    analysisTable(report.levels),
    "### Observations",
    observations || "(no levels ran)",
    "### Charts",
    [
      `![Throughput vs concurrency](${CHART_FILES.throughput})`,
      `![TTFT vs concurrency](${CHART_FILES.ttft})`,
      `![Latency vs throughput](${CHART_FILES.latency})`,
    ].join("\n\n"),
    "### Definitions",
    DEFINITIONS,
    "",
  ].join("\n\n");
}
