/**
 * Prometheus text exposition (format 0.0.4): a tiny registry of counters, gauges and histograms.
 *
 * Exposition follows the Python `prometheus_client` that vLLM uses: a counter registered as
 * `vllm:prompt_tokens` is written `vllm:prompt_tokens_total` (in its HELP / TYPE lines too),
 * values are written like Python floats (`3.0`, `0.25`, `+Inf`), a histogram's `le` label comes
 * after the others, and its series are `_bucket` (cumulative), `_count` and `_sum`.
 *
 * @module
 */

/** Label values of one series, in the metric's label-name order. */
export type LabelValues = readonly string[];

/** A number as Python's `prometheus_client` writes it: `1.0`, `0.001`, `+Inf`, `NaN`. */
export function formatValue(v: number): string {
  if (Number.isNaN(v)) return "NaN";
  if (v === Infinity) return "+Inf";
  if (v === -Infinity) return "-Inf";
  if (Number.isInteger(v) && Math.abs(v) < 1e16) return `${v}.0`;
  return String(v);
}

function escapeLabel(value: string): string {
  return value.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("\n", "\\n");
}

function escapeHelp(value: string): string {
  return value.replaceAll("\\", "\\\\").replaceAll("\n", "\\n");
}

function labelText(names: readonly string[], values: LabelValues, extra = ""): string {
  const parts = names.map((n, i) => `${n}="${escapeLabel(values[i] ?? "")}"`);
  if (extra !== "") parts.push(extra);
  return parts.length === 0 ? "" : `{${parts.join(",")}}`;
}

const NAME_RE = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_RE = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/** Shared bookkeeping of the three metric kinds: name, help, label names, series by key. */
abstract class Metric<S> {
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly string[];
  protected readonly series = new Map<string, { values: LabelValues; state: S }>();

  constructor(name: string, help: string, labelNames: readonly string[]) {
    if (!NAME_RE.test(name)) throw new RangeError(`Invalid metric name "${name}"`);
    for (const l of labelNames) {
      if (!LABEL_RE.test(l) || l === "le") throw new RangeError(`Invalid label name "${l}"`);
    }
    this.name = name;
    this.help = help;
    this.labelNames = [...labelNames];
  }

  protected abstract initial(): S;

  /** The series for `values` (created, at zero, on first use). */
  protected at(values: LabelValues): S {
    if (values.length !== this.labelNames.length) {
      throw new RangeError(
        `Metric ${this.name} has ${this.labelNames.length} labels, got ${values.length} values`,
      );
    }
    const key = JSON.stringify(values);
    let s = this.series.get(key);
    if (s === undefined) {
      s = { values: [...values], state: this.initial() };
      this.series.set(key, s);
    }
    return s.state;
  }

  /** Creates the series for `values` at zero so it is exported before its first update. */
  touch(values: LabelValues): void {
    this.at(values);
  }

  /** The exposition lines of this metric (HELP, TYPE, samples). */
  abstract lines(): string[];
}

/** A monotonically increasing count. Exposed as `<name>_total`. */
export class Counter extends Metric<{ value: number }> {
  protected initial(): { value: number } {
    return { value: 0 };
  }

  /** Adds `amount` (>= 0). */
  inc(values: LabelValues = [], amount = 1): void {
    if (!(amount >= 0)) throw new RangeError(`Counter ${this.name}: cannot add ${amount}`);
    this.at(values).value += amount;
  }

  /** Sets the count from a cumulative source (the engine's own counters). */
  set(values: LabelValues, value: number): void {
    this.at(values).value = value;
  }

  /** Current value (0 for a series never touched). */
  get(values: LabelValues = []): number {
    return this.series.get(JSON.stringify(values))?.state.value ?? 0;
  }

  lines(): string[] {
    const name = `${this.name}_total`;
    const out = [`# HELP ${name} ${escapeHelp(this.help)}`, `# TYPE ${name} counter`];
    for (const { values, state } of this.series.values()) {
      out.push(`${name}${labelText(this.labelNames, values)} ${formatValue(state.value)}`);
    }
    return out;
  }
}

/** A value that goes up and down. */
export class Gauge extends Metric<{ value: number }> {
  protected initial(): { value: number } {
    return { value: 0 };
  }

  set(values: LabelValues, value: number): void {
    this.at(values).value = value;
  }

  get(values: LabelValues = []): number {
    return this.series.get(JSON.stringify(values))?.state.value ?? 0;
  }

  lines(): string[] {
    const out = [`# HELP ${this.name} ${escapeHelp(this.help)}`, `# TYPE ${this.name} gauge`];
    for (const { values, state } of this.series.values()) {
      out.push(`${this.name}${labelText(this.labelNames, values)} ${formatValue(state.value)}`);
    }
    return out;
  }
}

interface HistogramState {
  /** Non-cumulative count per bucket; the last entry is +Inf. */
  counts: number[];
  sum: number;
  count: number;
}

/** Observations counted into fixed buckets (upper bounds, inclusive). */
export class Histogram extends Metric<HistogramState> {
  /** Finite upper bounds, increasing (+Inf is implicit). */
  readonly buckets: readonly number[];

  constructor(name: string, help: string, labelNames: readonly string[], buckets: number[]) {
    super(name, help, labelNames);
    const finite = buckets.filter((b) => b !== Infinity);
    for (let i = 0; i < finite.length; i++) {
      const b = finite[i]!;
      if (!Number.isFinite(b) || (i > 0 && b <= finite[i - 1]!)) {
        throw new RangeError(`Histogram ${name}: buckets must be finite and increasing`);
      }
    }
    this.buckets = finite;
  }

  protected initial(): HistogramState {
    return { counts: new Array<number>(this.buckets.length + 1).fill(0), sum: 0, count: 0 };
  }

  observe(values: LabelValues, v: number): void {
    const s = this.at(values);
    let i = 0;
    while (i < this.buckets.length && v > this.buckets[i]!) i++;
    s.counts[i]! += 1;
    s.sum += v;
    s.count += 1;
  }

  /** Number of observations of a series. */
  count(values: LabelValues = []): number {
    return this.series.get(JSON.stringify(values))?.state.count ?? 0;
  }

  lines(): string[] {
    const n = this.name;
    const out = [`# HELP ${n} ${escapeHelp(this.help)}`, `# TYPE ${n} histogram`];
    for (const { values, state } of this.series.values()) {
      let acc = 0;
      for (let i = 0; i <= this.buckets.length; i++) {
        acc += state.counts[i]!;
        const le = `le="${formatValue(this.buckets[i] ?? Infinity)}"`;
        out.push(`${n}_bucket${labelText(this.labelNames, values, le)} ${formatValue(acc)}`);
      }
      out.push(`${n}_count${labelText(this.labelNames, values)} ${formatValue(state.count)}`);
      out.push(`${n}_sum${labelText(this.labelNames, values)} ${formatValue(state.sum)}`);
    }
    return out;
  }
}

/** An ordered set of metrics written together. */
export class Registry {
  readonly #metrics: Metric<unknown>[] = [];
  readonly #names = new Set<string>();

  #add<M extends Metric<unknown>>(m: M): M {
    if (this.#names.has(m.name)) throw new RangeError(`Metric ${m.name} is already registered`);
    this.#names.add(m.name);
    this.#metrics.push(m);
    return m;
  }

  counter(name: string, help: string, labelNames: readonly string[] = []): Counter {
    return this.#add(new Counter(name, help, labelNames));
  }

  gauge(name: string, help: string, labelNames: readonly string[] = []): Gauge {
    return this.#add(new Gauge(name, help, labelNames));
  }

  histogram(
    name: string,
    help: string,
    labelNames: readonly string[],
    buckets: number[],
  ): Histogram {
    return this.#add(new Histogram(name, help, labelNames, buckets));
  }

  /** The text exposition (format 0.0.4), one metric after another, ending with a newline. */
  format(): string {
    const lines: string[] = [];
    for (const m of this.#metrics) lines.push(...m.lines());
    return lines.length === 0 ? "" : lines.join("\n") + "\n";
  }
}

/** Content-Type of the text exposition format. */
export const PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";
