/**
 * Hand-written SVG line charts (no dependencies), shared by the benchmarks' reports: axes with
 * "nice" ticks, axis labels, a title, a legend, markers with optional point labels. The x axis
 * is linear, or log2 with ticks at the data's own x values (for concurrency sweeps 1, 2, 4, ...).
 *
 * @module
 */

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

/** Where the plot area lies in the picture, px. */
interface Plot {
  readonly width: number;
  readonly height: number;
  readonly left: number;
  readonly top: number;
  /** Plot area width and height. */
  readonly pw: number;
  readonly ph: number;
}

/** Tick values and the maps from data to picture coordinates. */
interface Axes {
  readonly xTicks: readonly number[];
  readonly yTicks: readonly number[];
  readonly tx: (x: number) => number;
  readonly ty: (y: number) => number;
}

function plotOf(spec: ChartSpec): Plot {
  const width = spec.width ?? 760;
  const height = spec.height ?? 460;
  const m = { left: 80, right: 170, top: 50, bottom: 64 };
  return {
    width,
    height,
    left: m.left,
    top: m.top,
    pw: width - m.left - m.right,
    ph: height - m.top - m.bottom,
  };
}

/** The points of `points` that can be drawn (finite, and x > 0 on a log axis). */
function drawable(points: readonly ChartPoint[], xLog: boolean | undefined): ChartPoint[] {
  return points.filter((p) => Number.isFinite(p.x) && Number.isFinite(p.y) && (!xLog || p.x > 0));
}

/** Ticks and scales for the drawable points `pts`: y from 0, x linear from 0 or log2. */
function axesOf(spec: ChartSpec, plot: Plot, pts: readonly ChartPoint[]): Axes {
  const xs = pts.map((p) => p.x);
  const ys = pts.map((p) => p.y);
  const yTicks = niceTicks(0, ys.length > 0 ? Math.max(...ys) : 1);
  const yMax = yTicks[yTicks.length - 1]!;
  const ty = (y: number) => plot.top + plot.ph - (y / yMax) * plot.ph;
  if (spec.xLog) {
    let xTicks = [...new Set(xs)].sort((a, b) => a - b);
    if (xTicks.length === 0) xTicks = [1];
    let lo = Math.log2(xTicks[0]!);
    let hi = Math.log2(xTicks[xTicks.length - 1]!);
    if (hi === lo) {
      lo -= 1;
      hi += 1;
    }
    const pad = (hi - lo) * 0.05;
    const tx = (x: number) =>
      plot.left + ((Math.log2(x) - lo + pad) / (hi - lo + 2 * pad)) * plot.pw;
    return { xTicks, yTicks, tx, ty };
  }
  const xTicks = niceTicks(0, xs.length > 0 ? Math.max(...xs) : 1);
  const xMax = xTicks[xTicks.length - 1]!;
  return { xTicks, yTicks, tx: (x) => plot.left + (x / xMax) * plot.pw, ty };
}

/** The background, title, grid, ticks, axes and axis labels (and "no data" when empty). */
function frame(spec: ChartSpec, plot: Plot, axes: Axes, empty: boolean): string[] {
  const { width: W, height: H, left, top, pw, ph } = plot;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" ` +
    `viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`,
    `<rect x="0" y="0" width="${W}" height="${H}" fill="#ffffff"/>`,
    `<text x="${f(left + pw / 2)}" y="28" text-anchor="middle" font-size="16" ` +
    `font-weight="bold">${escapeXml(spec.title)}</text>`,
  ];
  // Grid and ticks.
  for (const v of axes.yTicks) {
    const y = f(axes.ty(v));
    out.push(
      `<line x1="${left}" y1="${y}" x2="${left + pw}" y2="${y}" stroke="#e0e0e0"/>`,
      `<text x="${left - 8}" y="${y}" text-anchor="end" dominant-baseline="middle">` +
        `${tickText(v)}</text>`,
    );
  }
  for (const v of axes.xTicks) {
    const x = f(axes.tx(v));
    out.push(
      `<line x1="${x}" y1="${top}" x2="${x}" y2="${top + ph}" stroke="#f0f0f0"/>`,
      `<line x1="${x}" y1="${top + ph}" x2="${x}" y2="${top + ph + 5}" stroke="#333333"/>`,
      `<text x="${x}" y="${top + ph + 20}" text-anchor="middle">${tickText(v)}</text>`,
    );
  }
  // Axes and their labels.
  out.push(
    `<line x1="${left}" y1="${top + ph}" x2="${left + pw}" y2="${top + ph}" ` +
      `stroke="#333333"/>`,
    `<line x1="${left}" y1="${top}" x2="${left}" y2="${top + ph}" stroke="#333333"/>`,
    `<text x="${f(left + pw / 2)}" y="${H - 18}" text-anchor="middle" font-size="13">` +
      `${escapeXml(spec.xLabel)}</text>`,
    `<text x="18" y="${f(top + ph / 2)}" text-anchor="middle" font-size="13" ` +
      `transform="rotate(-90 18 ${f(top + ph / 2)})">${escapeXml(spec.yLabel)}</text>`,
  );
  if (empty) {
    out.push(
      `<text x="${f(left + pw / 2)}" y="${f(top + ph / 2)}" text-anchor="middle" ` +
        `fill="#888888">no data (every request failed)</text>`,
    );
  }
  return out;
}

/** Series `i`: its line, markers and point labels, and its legend entry. */
function seriesLines(s: ChartSeries, i: number, spec: ChartSpec, plot: Plot, axes: Axes): string[] {
  const { tx, ty } = axes;
  const color = COLORS[i % COLORS.length]!;
  const good = drawable(s.points, spec.xLog);
  const dash = s.dashed ? ` stroke-dasharray="6 4"` : "";
  const out: string[] = [];
  if (good.length > 1) {
    const d = good.map((p) => `${f(tx(p.x))},${f(ty(p.y))}`).join(" ");
    out.push(`<polyline points="${d}" fill="none" stroke="${color}" stroke-width="2"${dash}/>`);
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
  const ly = plot.top + 10 + i * 22;
  const lx = plot.left + plot.pw + 16;
  out.push(
    `<line x1="${lx}" y1="${ly}" x2="${lx + 24}" y2="${ly}" stroke="${color}" ` +
      `stroke-width="2"${dash}/>`,
    `<circle cx="${lx + 12}" cy="${ly}" r="3.5" fill="${color}"/>`,
    `<text x="${lx + 30}" y="${ly}" dominant-baseline="middle">${escapeXml(s.name)}</text>`,
  );
  return out;
}

/** The chart as a standalone SVG document. */
export function lineChart(spec: ChartSpec): string {
  const plot = plotOf(spec);
  const pts = drawable(spec.series.flatMap((s) => s.points), spec.xLog);
  const axes = axesOf(spec, plot, pts);
  return [
    ...frame(spec, plot, axes, pts.length === 0),
    ...spec.series.flatMap((s, i) => seriesLines(s, i, spec, plot, axes)),
    "</svg>",
    "",
  ].join("\n");
}
