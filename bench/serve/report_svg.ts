/**
 * Hand-written SVG line charts (no dependencies) for the serving report: axes with "nice" ticks,
 * axis labels, a title, a legend, markers with optional point labels. The x axis is linear, or
 * log2 with ticks at the data's own x values (for concurrency sweeps 1, 2, 4, ...).
 *
 * @module
 */

import { CHART_FILES } from "./report_markdown.ts";
import type { BenchReport } from "./report.ts";

/** One point; `label` is drawn beside the marker. */
export interface ChartPoint {
  readonly x: number;
  readonly y: number;
  readonly label?: string;
}

/** One line of the chart. */
export interface ChartSeries {
  readonly name: string;
  readonly points: readonly ChartPoint[];
  /** Dashed line. */
  readonly dashed?: boolean;
}

/** What to draw. */
export interface ChartSpec {
  readonly title: string;
  readonly xLabel: string;
  readonly yLabel: string;
  readonly series: readonly ChartSeries[];
  /** log2 x axis with ticks at the data's x values (all x must be > 0). */
  readonly xLog?: boolean;
  readonly width?: number;
  readonly height?: number;
}

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

/** Escapes text for SVG content and attribute values. */
export function escapeXml(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&apos;");
}

/** About `count` round tick values (steps of 1, 2 or 5 x 10^k) covering [lo, hi]. */
export function niceTicks(lo: number, hi: number, count = 5): number[] {
  if (!(hi > lo)) hi = lo === 0 ? 1 : lo + Math.abs(lo);
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? 10 * mag;
  const first = Math.floor(lo / step) * step;
  const ticks: number[] = [];
  for (let v = first; v < hi + step * 0.999; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

function tickText(v: number): string {
  const a = Math.abs(v);
  if (a >= 1e6) return `${Number((v / 1e6).toPrecision(3))}M`;
  if (a >= 1e4) return `${Number((v / 1e3).toPrecision(3))}k`;
  return `${Number(v.toPrecision(4))}`;
}

const f = (v: number) => v.toFixed(1);

/** The chart as a standalone SVG document. */
export function lineChart(spec: ChartSpec): string {
  const W = spec.width ?? 760;
  const H = spec.height ?? 460;
  const m = { left: 80, right: 170, top: 50, bottom: 64 };
  const pw = W - m.left - m.right;
  const ph = H - m.top - m.bottom;
  const pts = spec.series.flatMap((s) => s.points).filter((p) =>
    Number.isFinite(p.x) && Number.isFinite(p.y) && (!spec.xLog || p.x > 0)
  );
  const xs = pts.map((p) => p.x);
  const ys = pts.map((p) => p.y);
  const yTicks = niceTicks(0, ys.length > 0 ? Math.max(...ys) : 1);
  const yMax = yTicks[yTicks.length - 1]!;
  let xTicks: number[];
  let tx: (x: number) => number;
  if (spec.xLog) {
    xTicks = [...new Set(xs)].sort((a, b) => a - b);
    if (xTicks.length === 0) xTicks = [1];
    let lo = Math.log2(xTicks[0]!);
    let hi = Math.log2(xTicks[xTicks.length - 1]!);
    if (hi === lo) {
      lo -= 1;
      hi += 1;
    }
    const pad = (hi - lo) * 0.05;
    tx = (x) => m.left + ((Math.log2(x) - lo + pad) / (hi - lo + 2 * pad)) * pw;
  } else {
    xTicks = niceTicks(0, xs.length > 0 ? Math.max(...xs) : 1);
    const xMax = xTicks[xTicks.length - 1]!;
    tx = (x) => m.left + (x / xMax) * pw;
  }
  const ty = (y: number) => m.top + ph - (y / yMax) * ph;
  const out: string[] = [];
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" ` +
      `viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`,
    `<rect x="0" y="0" width="${W}" height="${H}" fill="#ffffff"/>`,
    `<text x="${f(m.left + pw / 2)}" y="28" text-anchor="middle" font-size="16" ` +
      `font-weight="bold">${escapeXml(spec.title)}</text>`,
  );
  // Grid and ticks.
  for (const v of yTicks) {
    const y = f(ty(v));
    out.push(
      `<line x1="${m.left}" y1="${y}" x2="${m.left + pw}" y2="${y}" stroke="#e0e0e0"/>`,
      `<text x="${m.left - 8}" y="${y}" text-anchor="end" dominant-baseline="middle">` +
        `${tickText(v)}</text>`,
    );
  }
  for (const v of xTicks) {
    const x = f(tx(v));
    out.push(
      `<line x1="${x}" y1="${m.top}" x2="${x}" y2="${m.top + ph}" stroke="#f0f0f0"/>`,
      `<line x1="${x}" y1="${m.top + ph}" x2="${x}" y2="${m.top + ph + 5}" stroke="#333333"/>`,
      `<text x="${x}" y="${m.top + ph + 20}" text-anchor="middle">${tickText(v)}</text>`,
    );
  }
  // Axes and their labels.
  out.push(
    `<line x1="${m.left}" y1="${m.top + ph}" x2="${m.left + pw}" y2="${m.top + ph}" ` +
      `stroke="#333333"/>`,
    `<line x1="${m.left}" y1="${m.top}" x2="${m.left}" y2="${m.top + ph}" stroke="#333333"/>`,
    `<text x="${f(m.left + pw / 2)}" y="${H - 18}" text-anchor="middle" font-size="13">` +
      `${escapeXml(spec.xLabel)}</text>`,
    `<text x="18" y="${f(m.top + ph / 2)}" text-anchor="middle" font-size="13" ` +
      `transform="rotate(-90 18 ${f(m.top + ph / 2)})">${escapeXml(spec.yLabel)}</text>`,
  );
  if (pts.length === 0) {
    out.push(
      `<text x="${f(m.left + pw / 2)}" y="${f(m.top + ph / 2)}" text-anchor="middle" ` +
        `fill="#888888">no data (every request failed)</text>`,
    );
  }
  // Series.
  spec.series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length]!;
    const good = s.points.filter((p) =>
      Number.isFinite(p.x) && Number.isFinite(p.y) && (!spec.xLog || p.x > 0)
    );
    const dash = s.dashed ? ` stroke-dasharray="6 4"` : "";
    if (good.length > 1) {
      const d = good.map((p) => `${f(tx(p.x))},${f(ty(p.y))}`).join(" ");
      out.push(
        `<polyline points="${d}" fill="none" stroke="${color}" stroke-width="2"${dash}/>`,
      );
    }
    for (const p of good) {
      out.push(`<circle cx="${f(tx(p.x))}" cy="${f(ty(p.y))}" r="3.5" fill="${color}"/>`);
      if (p.label !== undefined) {
        out.push(
          `<text x="${f(tx(p.x) + 6)}" y="${f(ty(p.y) + 14)}" font-size="10" fill="${color}">` +
            `${escapeXml(p.label)}</text>`,
        );
      }
    }
    const ly = m.top + 10 + i * 22;
    const lx = m.left + pw + 16;
    out.push(
      `<line x1="${lx}" y1="${ly}" x2="${lx + 24}" y2="${ly}" stroke="${color}" ` +
        `stroke-width="2"${dash}/>`,
      `<circle cx="${lx + 12}" cy="${ly}" r="3.5" fill="${color}"/>`,
      `<text x="${lx + 30}" y="${ly}" dominant-baseline="middle">${escapeXml(s.name)}</text>`,
    );
  });
  out.push("</svg>", "");
  return out.join("\n");
}

/** The report's three charts, keyed by file name. */
export function reportCharts(report: BenchReport): Map<string, string> {
  const rate = report.config.mode === "rate";
  const levels = report.levels.filter((l) => l.metrics.successful > 0);
  const load = (l: (typeof levels)[number]) => (rate ? l.requestRate : l.concurrency) ?? NaN;
  const xLabel = rate ? "Request rate (req/s)" : "Concurrency (requests in flight)";
  const xs = levels.map(load).filter((x) => x > 0 && Number.isFinite(x));
  const xLog = xs.length > 1 && Math.max(...xs) / Math.min(...xs) >= 8;
  const where = rate ? "request rate" : "concurrency";
  const tag = (l: (typeof levels)[number]) => (rate ? `${l.requestRate}/s` : `c=${l.concurrency}`);
  const charts = new Map<string, string>();
  charts.set(
    CHART_FILES.throughput,
    lineChart({
      title: `Throughput vs ${where}`,
      xLabel,
      yLabel: "Throughput (tokens/s)",
      xLog,
      series: [
        {
          name: "output tok/s",
          points: levels.map((l) => ({ x: load(l), y: l.metrics.outputThroughput })),
        },
        {
          name: "total tok/s",
          dashed: true,
          points: levels.map((l) => ({ x: load(l), y: l.metrics.totalThroughput })),
        },
      ],
    }),
  );
  charts.set(
    CHART_FILES.ttft,
    lineChart({
      title: `Time to first token vs ${where}`,
      xLabel,
      yLabel: "TTFT (ms)",
      xLog,
      series: [
        {
          name: "TTFT p50",
          points: levels.map((l) => ({ x: load(l), y: l.metrics.ttftMs?.p50 ?? NaN })),
        },
        {
          name: "TTFT p95",
          dashed: true,
          points: levels.map((l) => ({ x: load(l), y: l.metrics.ttftMs?.p95 ?? NaN })),
        },
      ],
    }),
  );
  charts.set(
    CHART_FILES.latency,
    lineChart({
      title: "Latency vs throughput",
      xLabel: "Output throughput (tokens/s)",
      yLabel: "E2E latency (ms)",
      series: [
        {
          name: "E2E p50",
          points: levels.map((l) => ({
            x: l.metrics.outputThroughput,
            y: l.metrics.e2eMs?.p50 ?? NaN,
            label: tag(l),
          })),
        },
        {
          name: "E2E p95",
          dashed: true,
          points: levels.map((l) => ({
            x: l.metrics.outputThroughput,
            y: l.metrics.e2eMs?.p95 ?? NaN,
          })),
        },
      ],
    }),
  );
  return charts;
}
