/**
 * The GPU battery's figures set against the goals of issue 18 (point 3 to 5) and issue 20 (point
 * 5), read from the logs `bench/gpu_battery.sh` writes, so that a session with a GPU sees at once
 * what held and what fell short. The battery runs it last (`summary.md` in its output folder); by
 * hand:
 *
 *   deno run -A bench/battery_summary.ts DIR      # DIR: the battery's output folder
 *
 * Every figure is copied from a log line; a figure whose stage was cut short or failed is printed
 * as "not measured", never estimated. The goals are issue 18's for the Qwen3-0.6B preset on an
 * H100 and issue 20's for its int4 weights; on any other preset or adapter the comparison is
 * printed all the same and says so in its header.
 *
 * @module
 */

/** One rate line of `bench:model` (decode at a batch size, or a prefill). */
export interface StepFigure {
  readonly tokPerS: number;
  readonly msPerStep: number;
  /** Host time to prepare, encode and submit one decode step, ms (decode only). */
  readonly hostMs?: number;
  /** Dispatches per decode step and per layer (decode only). */
  readonly dispatches?: number;
  readonly dispatchesPerLayer?: number;
  /** GPU idle time between decode steps, ms (decode only, with timestamps). */
  readonly gpuIdleMs?: number;
  /**
   * Tokens per second of the prefill's compute pass alone (prefill only, with timestamps): no
   * host encoding or readback wait in it.
   */
  readonly gpuPassTokPerS?: number;
}

/** `bench:model`'s figures of one run: decode by batch size, prefill by token count. */
export interface ModelRun {
  readonly adapter: string | null;
  readonly decode: ReadonlyMap<number, StepFigure>;
  readonly prefill: ReadonlyMap<number, StepFigure>;
}

/** `bench:serve`'s figures of one concurrency level. */
export interface ServeLevel {
  readonly outputTokPerS: number;
  readonly tpotP50Ms: number;
  readonly ok: string;
}

/**
 * bench/matmul_tune.ts's times: per case ("qkv M 64", in the log's order) each kernel's median
 * ms by its printed name ("tiled 16x16 bk16 db", "gemv mb1 rb4", ...).
 */
export type KernelTimes = ReadonlyMap<string, ReadonlyMap<string, number>>;

/** Everything {@linkcode summaryLines} compares, read by {@linkcode readBattery}. */
export interface BatteryFigures {
  readonly gpu: string | null;
  readonly commit: string | null;
  readonly model: ModelRun;
  readonly untuned: ModelRun;
  /** A second start-up that measured its own tuning (the `retune` stage). */
  readonly retuned: ModelRun;
  /** Readbacks 6 at a time, 11 steps in flight (the `readback` stage). */
  readonly readback: ModelRun;
  /** The "Kernel tuning: ..." lines of the first and the second start-up, in order. */
  readonly tunings: { readonly first: readonly string[]; readonly second: readonly string[] };
  /** bench/dispatch_floor.ts: us a further dispatch adds, by "dependent, 528 workgroups". */
  readonly dispatchUs: ReadonlyMap<string, number>;
  /** The `kernels` stage's matmul times (f16 weights, plain X). */
  readonly kernels: KernelTimes;
  /** The `kernels-rms` stage's (X read as the normed residual stream). */
  readonly kernelsRms: KernelTimes;
  readonly unfused: ModelRun;
  readonly torch: ModelRun;
  /** Per weight format ("int8", "int4"): its median ratios to f16 over the rounds. */
  readonly quant: ReadonlyMap<string, ReadonlyMap<string, number>>;
  readonly serve: ReadonlyMap<number, ServeLevel>;
  readonly tests: { readonly passed: number; readonly failed: number; readonly summary: string };
  /** Stages whose exit status was not 0 ("bench-model: rc 124"). */
  readonly stagesCut: readonly string[];
}

// deno-lint-ignore no-control-regex
const ANSI = /\x1b\[[0-9;]*m/g;
const NUM = String.raw`([0-9][0-9,]*(?:\.[0-9]+)?)`;

/** bench:model's "decode batch 1: 77.44 tok/s, 12.9 ms/step (...)"; the peer's "decode batch 1:
 * 18.10 tok/s (55 ms/step, ...)". */
const DECODE_LINE = new RegExp(String.raw`^decode batch (\d+): ${NUM} tok/s,? \(?${NUM} ms/step`);
/** The line after a bench:model decode line: dispatches, per layer, host ms per step. */
const HOST_LINE = new RegExp(
  String.raw`host per step: (\d+) dispatches \(${NUM} per layer.*?\), ${NUM} ms to prepare`,
);
/** The line after that, where the adapter has timestamps: the GPU's idle ms between steps. */
const GPU_LINE = new RegExp(String.raw`ms computing, ${NUM} ms idle`);
/** bench:model's "prefill 512 tokens: 172 ms, 2970.4 tok/s"; the peer's "prefill 512 tokens:
 * 23492.00 tok/s (22 ms)". */
const PREFILL_LINE = new RegExp(
  String.raw`^prefill (\d+) tokens: ${NUM} (ms|tok/s),? \(?${NUM} (?:ms|tok/s)`,
);
/** The end of bench:model's prefill line with timestamps: "; GPU pass 51.2 ms, 10000.0 tok/s)". */
const PREFILL_GPU = new RegExp(String.raw`; GPU pass ${NUM} ms, ${NUM} tok/s\)`);

/** bench/dispatch_floor.ts's "dependent, 528 workgroups of 256: ...; 5.12 us per further
 * dispatch". */
const DISPATCH_LINE = new RegExp(
  String.raw`^(dependent|independent), (\d+) workgroups of 256: .*; (-?[0-9.]+) us per further`,
  "gm",
);

/** bench/matmul_tune.ts's case header, "qkv N 4096 K 1024, M 64:". */
const KERNEL_CASE = /^(\w+) N \d+ K \d+, M (\d+):$/;
/** One of its kernel lines, "  tiled 16x16 bk16 db     0.0931 ms     5770 GFLOP/s ...". */
const KERNEL_TIME = /^ {2}(\S.*?)\s+([0-9.]+) ms /;

/** Reads bench/matmul_tune.ts's output (other tools' lines in the same log are skipped). */
export function readKernelTimes(text: string): KernelTimes {
  const out = new Map<string, Map<string, number>>();
  let current: Map<string, number> | undefined;
  for (const line of text.replace(ANSI, "").split("\n")) {
    const c = KERNEL_CASE.exec(line);
    if (c !== null) {
      current = new Map();
      out.set(`${c[1]} M ${c[2]}`, current);
      continue;
    }
    const t = current === undefined ? null : KERNEL_TIME.exec(line);
    if (t === null) {
      current = undefined;
      continue;
    }
    current!.set(t[1]!, Number(t[2]));
  }
  return out;
}

/** The "Kernel tuning: measured ..." lines of a bench:model log, without the timing prefix. */
function tuningLines(text: string): string[] {
  return [...text.replace(ANSI, "").matchAll(/^Kernel tuning: (.*)$/gm)].map((m) => m[1]!);
}

function num(s: string): number {
  return Number(s.replaceAll(",", ""));
}

/**
 * Reads a `bench:model` (or `bench/torch_reference.py`) log: the decode and prefill rate lines,
 * each decode line's host and GPU lines after it. Only the first line of a batch size or prefill
 * length counts.
 */
export function readModelRun(text: string): ModelRun {
  const decode = new Map<number, StepFigure>();
  const prefill = new Map<number, StepFigure>();
  const adapter = /adapter: ([^;\n]+)/.exec(text)?.[1]?.trim() ?? null;
  const lines = text.replace(ANSI, "").split("\n");
  lines.forEach((line, i) => {
    const d = DECODE_LINE.exec(line);
    if (d !== null && !decode.has(num(d[1]!))) {
      const host = HOST_LINE.exec(lines[i + 1] ?? "");
      const gpu = GPU_LINE.exec(lines[i + 2] ?? "");
      decode.set(num(d[1]!), {
        tokPerS: num(d[2]!),
        msPerStep: num(d[3]!),
        ...(host === null ? {} : {
          dispatches: num(host[1]!),
          dispatchesPerLayer: num(host[2]!),
          hostMs: num(host[3]!),
        }),
        ...(gpu === null ? {} : { gpuIdleMs: num(gpu[1]!) }),
      });
    }
    const p = PREFILL_LINE.exec(line);
    if (p !== null && !prefill.has(num(p[1]!))) {
      const [first, second] = [num(p[2]!), num(p[4]!)];
      const msFirst = p[3] === "ms";
      const gpu = PREFILL_GPU.exec(line);
      prefill.set(num(p[1]!), {
        msPerStep: msFirst ? first : second,
        tokPerS: msFirst ? second : first,
        ...(gpu === null ? {} : { gpuPassTokPerS: num(gpu[2]!) }),
      });
    }
  });
  return { adapter, decode, prefill };
}

/** Reads the battery's logs, keyed by file name (`model.txt`, ...); absent files are empty. */
export function readBattery(files: Readonly<Record<string, string>>): BatteryFigures {
  const f = (name: string) => (files[name] ?? "").replace(ANSI, "");
  const info = f("info.txt");
  const gpuCsv = /^name, driver_version.*\n(.+)$/m.exec(info)?.[1] ?? null;
  const quant = new Map<string, Map<string, number>>();
  const medians = f("quant.txt").split("ratios to none, median of")[1] ?? "";
  for (const m of medians.matchAll(/^ {2}(int[48]): (.+)$/gm)) {
    const ratios = new Map<string, number>();
    for (const r of m[2]!.matchAll(/(weight bytes|batch \d+|prefill \d+) ([0-9.]+)x/g)) {
      ratios.set(r[1]!, Number(r[2]));
    }
    quant.set(m[1]!, ratios);
  }
  const serve = new Map<number, ServeLevel>();
  for (
    const m of f("serve.txt").matchAll(
      new RegExp(
        String.raw`^concurrency (\d+): (\S+) ok, .*?${NUM} output tok/s, .*TPOT p50 ${NUM} ms`,
        "gm",
      ),
    )
  ) {
    serve.set(num(m[1]!), { ok: m[2]!, outputTokPerS: num(m[3]!), tpotP50Ms: num(m[4]!) });
  }
  const tests = f("tests.txt");
  const summary = /^(ok|FAILED) \| .*$/m.exec(tests)?.[0] ?? "";
  return {
    gpu: gpuCsv,
    commit: /^commit (\S+)/m.exec(info)?.[1] ?? null,
    model: readModelRun(f("model.txt")),
    untuned: readModelRun(f("model_untuned.txt")),
    retuned: readModelRun(f("model_retuned.txt")),
    readback: readModelRun(f("model_readback.txt")),
    tunings: { first: tuningLines(f("model.txt")), second: tuningLines(f("model_retuned.txt")) },
    dispatchUs: new Map(
      [...f("kernels.txt").matchAll(DISPATCH_LINE)].map((
        m,
      ) => [`${m[1]}, ${m[2]} workgroups`, num(m[3]!)]),
    ),
    kernels: readKernelTimes(f("kernels.txt")),
    kernelsRms: readKernelTimes(f("kernels_rms.txt")),
    unfused: readModelRun(f("model_unfused.txt")),
    torch: readModelRun(f("torch.txt")),
    quant,
    serve,
    tests: {
      passed: num(
        /(\d+) passed/.exec(summary)?.[1] ?? `${(tests.match(/ \.\.\. ok /g) ?? []).length}`,
      ),
      failed: num(
        /(\d+) failed/.exec(summary)?.[1] ?? `${(tests.match(/ \.\.\. FAILED/g) ?? []).length}`,
      ),
      summary,
    },
    stagesCut: [...f("progress.txt").matchAll(/\] (\S+): rc ([1-9]\d*)/g)].map((m) =>
      `${m[1]} (rc ${m[2]})`
    ),
  };
}

/** A figure, or "not measured" when its stage did not print it. */
function show(v: number | undefined, digits = 1, unit = ""): string {
  if (v === undefined) return "not measured";
  return `${v.toLocaleString("en-US", { maximumFractionDigits: digits })}${unit}`;
}

/** "met" / "short" against a goal, or nothing to say. */
function verdict(v: number | undefined, goal: number, atLeast: boolean): string {
  if (v === undefined) return "-";
  return (atLeast ? v >= goal : v <= goal) ? "met" : "short";
}

function ratio(a: number | undefined, b: number | undefined): number | undefined {
  return a === undefined || b === undefined || b === 0 ? undefined : a / b;
}

/** The fastest of `times` whose name `pick` accepts: "name (ms)", or undefined. */
function fastest(
  times: ReadonlyMap<string, number> | undefined,
  pick: (name: string) => boolean = () => true,
): { name: string; ms: number } | undefined {
  let best: { name: string; ms: number } | undefined;
  for (const [name, ms] of times ?? []) {
    if (pick(name) && (best === undefined || ms < best.ms)) best = { name, ms };
  }
  return best;
}

/**
 * Markdown rows of the matmul kernels in isolation: per case of the `kernels` stage (and of
 * `kernels-rms`), the fastest kernel, the fastest single-buffered, double-buffered and split-K
 * tiles (a split tile counts as split only), and the fastest kernel reading X normed against
 * plain X.
 */
function kernelRows(b: BatteryFigures): string[] {
  const cases = [...new Set([...b.kernels.keys(), ...b.kernelsRms.keys()])];
  if (cases.length === 0) return ["- not measured"];
  const cell = (k: { name: string; ms: number } | undefined) =>
    k === undefined ? "-" : `${k.name} (${show(k.ms, 4)} ms)`;
  const kind = (name: string) =>
    / sk\d+$/.test(name) ? "split" : name.endsWith(" db") ? "db" : "single";
  const tiled = (k: string) => (name: string) => name.startsWith("tiled ") && kind(name) === k;
  return [
    "| case | fastest, plain X | fastest single-buffered tile | fastest db tile | fastest " +
    "split-K tile | fastest, normed X (rms_residual) | normed / plain |",
    "| --- | --- | --- | --- | --- | --- | --- |",
    ...cases.map((c) => {
      const plain = b.kernels.get(c);
      const normed = fastest(b.kernelsRms.get(c));
      return `| ${c} | ${cell(fastest(plain))} | ${cell(fastest(plain, tiled("single")))} | ` +
        `${cell(fastest(plain, tiled("db")))} | ${cell(fastest(plain, tiled("split")))} | ` +
        `${cell(normed)} | ` +
        `${show(ratio(normed?.ms, fastest(plain)?.ms), 2, "x")} |`;
    }),
  ];
}

/** The summary as Markdown lines: the header, then one table row per figure. */
export function summaryLines(b: BatteryFigures): string[] {
  const d = (run: ModelRun, batch: number) => run.decode.get(batch);
  const p = (run: ModelRun, tokens: number) => run.prefill.get(tokens);
  const int4 = b.quant.get("int4");
  const int8 = b.quant.get("int8");
  const rows: [string, string, string, string][] = [];
  const row = (what: string, value: string, goal = "", met = "-") =>
    rows.push([what, value, goal, met]);
  for (const batch of [1, 8, 64]) {
    const v = d(b.model, batch)?.tokPerS;
    const goal = batch === 1 ? 400 : batch === 64 ? 8000 : undefined;
    row(
      `decode batch ${batch}, tok/s (PyTorch peer: ${show(d(b.torch, batch)?.tokPerS)})`,
      show(v),
      goal === undefined ? "" : `>= ${goal.toLocaleString("en-US")}`,
      goal === undefined ? "-" : verdict(v, goal, true),
    );
  }
  for (const tokens of [128, 512]) {
    const v = p(b.model, tokens)?.tokPerS;
    const pass = p(b.model, tokens)?.gpuPassTokPerS;
    row(
      `prefill ${tokens}, tok/s (PyTorch peer: ${show(p(b.torch, tokens)?.tokPerS, 0)})`,
      show(v, 0) + (pass === undefined ? "" : ` (GPU pass alone: ${show(pass, 0)})`),
      tokens === 512 ? ">= 20,000" : "",
      tokens === 512 ? verdict(v, 20000, true) : "-",
    );
  }
  for (const [batch, goal] of [[1, 0.5], [64, 1]] as const) {
    const s = d(b.model, batch);
    row(
      `host ms per decode step, batch ${batch} (${show(s?.dispatches, 0)} dispatches)`,
      show(s?.hostMs, 2),
      `<= ${goal} (on the project's 2-core machine)`,
    );
    row(`GPU idle between decode steps, batch ${batch}, ms`, show(s?.gpuIdleMs, 3), "0");
  }
  row(
    "dispatches per layer (decode)",
    show(d(b.model, 1)?.dispatchesPerLayer),
    "<= 8",
    verdict(d(b.model, 1)?.dispatchesPerLayer, 8, false),
  );
  const c64 = b.serve.get(64)?.outputTokPerS;
  for (const c of [1, 16, 64]) {
    const level = b.serve.get(c);
    row(
      `serve, concurrency ${c}: output tok/s (${level?.ok ?? "-"} ok)`,
      show(level?.outputTokPerS),
      c === 64 ? ">= 4,000" : "",
      c === 64 ? verdict(c64, 4000, true) : "-",
    );
  }
  for (const c of [1, 64]) {
    const r = ratio(b.serve.get(c)?.tpotP50Ms, d(b.model, c)?.msPerStep);
    row(
      `serve TPOT p50 / bench:model step, batch ${c}`,
      show(r, 2, "x"),
      "<= 1.15",
      verdict(r, 1.15, false),
    );
  }
  for (const batch of [1, 64]) {
    const tuned = d(b.model, batch)?.tokPerS;
    row(
      `decode batch ${batch}: tuned / defaults (--kernel-tuning off)`,
      show(ratio(tuned, d(b.untuned, batch)?.tokPerS), 2, "x"),
    );
    row(
      `decode batch ${batch}: fused / unfused decode attention (--fused-decode off)`,
      show(ratio(tuned, d(b.unfused, batch)?.tokPerS), 2, "x"),
    );
  }
  row(
    "prefill 512: tuned / defaults (--kernel-tuning off)",
    show(ratio(p(b.model, 512)?.tokPerS, p(b.untuned, 512)?.tokPerS), 2, "x"),
  );
  for (const batch of [1, 64]) {
    row(
      `decode batch ${batch}: second start-up / first, each with its own tuning`,
      show(ratio(d(b.retuned, batch)?.tokPerS, d(b.model, batch)?.tokPerS), 2, "x"),
    );
  }
  row(
    "prefill 512: second start-up / first, each with its own tuning",
    show(ratio(p(b.retuned, 512)?.tokPerS, p(b.model, 512)?.tokPerS), 2, "x"),
  );
  for (const batch of [1, 64]) {
    const six = d(b.readback, batch);
    row(
      `decode batch ${batch}: readbacks 6 at a time (11 in flight) / 3 (7); GPU idle ms ` +
        `${show(six?.gpuIdleMs, 3)} against ${show(d(b.model, batch)?.gpuIdleMs, 3)}`,
      show(ratio(six?.tokPerS, d(b.model, batch)?.tokPerS), 2, "x"),
    );
  }
  for (const size of [1, 528]) {
    row(
      `GPU time a dispatch adds after a barrier, ${size} workgroups, us`,
      show(b.dispatchUs.get(`dependent, ${size} workgroups`), 2),
    );
  }
  row(
    "int4: device weight bytes / f16",
    show(int4?.get("weight bytes"), 3, "x"),
    "<= 0.30",
    verdict(int4?.get("weight bytes"), 0.3, false),
  );
  row(
    "int8: device weight bytes / f16",
    show(int8?.get("weight bytes"), 3, "x"),
    "<= 0.55",
    verdict(int8?.get("weight bytes"), 0.55, false),
  );
  row(
    "int4: decode batch 1 / f16 (median of rounds)",
    show(int4?.get("batch 1"), 2, "x"),
    ">= 1.8 (NVIDIA)",
    verdict(int4?.get("batch 1"), 1.8, true),
  );
  row("int8: decode batch 1 / f16 (median of rounds)", show(int8?.get("batch 1"), 2, "x"));
  row("int4: prefill 512 / f16 (median of rounds)", show(int4?.get("prefill 512"), 2, "x"));
  row(
    "tests on the GPU",
    b.tests.summary !== ""
      ? b.tests.summary
      : b.tests.passed + b.tests.failed === 0
      ? "not measured"
      : `${b.tests.passed} passed, ${b.tests.failed} failed (stage cut before its summary)`,
    "0 failed",
    b.tests.summary === "" ? "-" : b.tests.failed === 0 ? "met" : "short",
  );
  return [
    `# GPU battery summary`,
    "",
    `GPU: ${b.gpu ?? "not reported (no nvidia-smi)"}; adapter: ${
      b.model.adapter ?? "not reported"
    }; ` +
    `commit ${b.commit ?? "unknown"}. Goals: issue 18 points 3-5 and issue 20 point 5, set for ` +
    `the Qwen3-0.6B preset on an H100 (other presets and adapters are compared all the same).`,
    `Stages cut short or failed: ${b.stagesCut.length === 0 ? "none" : b.stagesCut.join(", ")}.`,
    "",
    "| figure | measured | goal | |",
    "| --- | --- | --- | --- |",
    ...rows.map((r) => `| ${r.map((cell) => cell.replaceAll("|", "\\|")).join(" | ")} |`),
    "",
    "Kernel tuning, first start-up (bench-model):",
    ...(b.tunings.first.length === 0 ? ["- not measured"] : b.tunings.first.map((t) => `- ${t}`)),
    "",
    "Kernel tuning, second start-up (retune):",
    ...(b.tunings.second.length === 0 ? ["- not measured"] : b.tunings.second.map((t) => `- ${t}`)),
    "",
    "Matmul kernels in isolation (bench/matmul_tune.ts, f16 weights; stages kernels, kernels-rms):",
    "",
    ...kernelRows(b),
  ];
}

if (import.meta.main) {
  const dir = Deno.args[0];
  if (dir === undefined || Deno.args.length > 1) {
    console.error("usage: deno run -A bench/battery_summary.ts DIR (the battery's output folder)");
    Deno.exit(2);
  }
  const files: Record<string, string> = {};
  try {
    for (const entry of Deno.readDirSync(dir)) {
      if (entry.isFile && entry.name.endsWith(".txt")) {
        files[entry.name] = Deno.readTextFileSync(`${dir}/${entry.name}`);
      }
    }
  } catch (e) {
    console.error(`error: Cannot read the battery's logs in ${dir}: ${(e as Error).message}`);
    Deno.exit(1);
  }
  console.log(summaryLines(readBattery(files)).join("\n"));
}
