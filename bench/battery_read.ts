/**
 * Reads the GPU battery's logs (`bench/gpu_battery.sh`: bench:model, the PyTorch peer,
 * bench:serve, bench/matmul_tune.ts, bench/attention_bench.ts, bench/dispatch_floor.ts, the
 * tests, its progress) into plain
 * figures, for bench/battery_summary.ts to set against the goals. A line a reader does not find
 * leaves its figure undefined ("not measured" there), never a guess.
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
  /** Preemptions the server reported during the level (bench:serve since 2026-11-30), or null. */
  readonly preempted: number | null;
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
  /** The same stage's down projection with X read as the SwiGLU of gate|up. */
  readonly kernelsSwiglu: KernelTimes;
  /** The `kernels-xscalar` stage's: `kernels-rms`'s gemv kernels with X in 4-byte loads. */
  readonly kernelsRmsScalar: KernelTimes;
  /**
   * bench/attention_bench.ts (the `attention` stage): per case ("context 160, batch 1", with
   * " (KV fp8_e4m3)" for an fp8 cache) each
   * path's median ms by its printed name ("direct, 64 wide", "split-K 16, 256 wide").
   */
  readonly attention: KernelTimes;
  readonly unfused: ModelRun;
  readonly torch: ModelRun;
  /** Per weight format ("int8", "int4"): its median ratios to f16 over the rounds. */
  readonly quant: ReadonlyMap<string, ReadonlyMap<string, number>>;
  readonly serve: ReadonlyMap<number, ServeLevel>;
  readonly tests: { readonly passed: number; readonly failed: number; readonly summary: string };
  /** Stages whose exit status was not 0 ("bench-model: rc 124"). */
  readonly stagesCut: readonly string[];
  /**
   * The GPU's memory as the engine read it: `main.ts info`'s "Memory:" line (the `info` stage)
   * and the start-up log's lines on a KV cache sized from it (the `kv-auto` stage), in order.
   */
  readonly memory: readonly string[];
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

/**
 * bench/attention_bench.ts's "  context 160, batch 1, split-K 16, 64 wide: 0.031 ms median", the
 * case "context 160, batch 1 (KV fp8_e4m3)" for an fp8 cache.
 */
const ATTENTION_LINE =
  /^ {2}(context \d+, batch \d+(?: \(KV \w+\))?), (.+?): ([0-9.]+) ms median/gm;

/**
 * Reads bench/attention_bench.ts's lines (other tools' lines in the same log are skipped); a path
 * timed twice (the direct path, once per partition size) keeps its faster median.
 */
export function readAttentionTimes(text: string): KernelTimes {
  const out = new Map<string, Map<string, number>>();
  for (const m of text.replace(ANSI, "").matchAll(ATTENTION_LINE)) {
    const times = out.get(m[1]!) ?? new Map<string, number>();
    out.set(m[1]!, times);
    const ms = Number(m[3]);
    times.set(m[2]!, Math.min(ms, times.get(m[2]!) ?? Infinity));
  }
  return out;
}

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
        String.raw`^concurrency (\d+): (\S+) ok, .*?${NUM} output tok/s, .*TPOT p50 ${NUM} ms(.*)$`,
        "gm",
      ),
    )
  ) {
    const preempted = /, (\d+) preemptions \(server \/metrics\)/.exec(m[5]!)?.[1];
    serve.set(num(m[1]!), {
      ok: m[2]!,
      outputTokPerS: num(m[3]!),
      tpotP50Ms: num(m[4]!),
      preempted: preempted === undefined ? null : Number(preempted),
    });
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
    kernelsSwiglu: readKernelTimes(f("kernels_swiglu.txt")),
    kernelsRmsScalar: readKernelTimes(f("kernels_rms_scalar.txt")),
    attention: readAttentionTimes(f("kernels.txt")),
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
    memory: [
      ...(info.match(/^Memory: .*$/gm) ?? []),
      ...(f("kv_auto.txt").match(/^(KV cache|GPU memory|Cannot apply|error:).*$/gm) ?? []),
    ],
  };
}
