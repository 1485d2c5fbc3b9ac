/**
 * The GPU battery's figures set against the goals of issue 18 (point 3 to 5) and issue 20 (point
 * 5), read from the logs `bench/gpu_battery.sh` writes (bench/battery_read.ts), so that a session
 * with a GPU sees at once what held and what fell short. The battery runs it last (`summary.md` in
 * its output folder); by hand:
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

import { type BatteryFigures, type ModelRun, readBattery } from "./battery_read.ts";

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

/** A kernel's table cell, "name (ms)", or "-". */
function cell(k: { name: string; ms: number } | undefined): string {
  return k === undefined ? "-" : `${k.name} (${show(k.ms, 4)} ms)`;
}

/**
 * Markdown rows of the matmul kernels in isolation: per case of the `kernels` stage (and of
 * `kernels-rms`), the fastest kernel, the fastest single-buffered, double-buffered and split-K
 * tiles (a split tile counts as split only), and the fastest kernel reading X as the engine's
 * call sites do (qkv and gate_up: normed, `rms_residual`; down: the SwiGLU of gate|up) against
 * plain X.
 */
function kernelRows(b: BatteryFigures): string[] {
  const cases = [
    ...new Set([...b.kernels.keys(), ...b.kernelsRms.keys(), ...b.kernelsSwiglu.keys()]),
  ];
  if (cases.length === 0) return ["- not measured"];
  const kind = (name: string) =>
    / sk\d+$/.test(name) ? "split" : name.endsWith(" db") ? "db" : "single";
  const tiled = (k: string) => (name: string) => name.startsWith("tiled ") && kind(name) === k;
  return [
    "| case | fastest, plain X | fastest single-buffered tile | fastest db tile | fastest " +
    "split-K tile | fastest, the engine's X (rms_residual; down: swiglu) | that / plain |",
    "| --- | --- | --- | --- | --- | --- | --- |",
    ...cases.map((c) => {
      const plain = b.kernels.get(c);
      const engineX = fastest(b.kernelsRms.get(c) ?? b.kernelsSwiglu.get(c));
      return `| ${c} | ${cell(fastest(plain))} | ${cell(fastest(plain, tiled("single")))} | ` +
        `${cell(fastest(plain, tiled("db")))} | ${cell(fastest(plain, tiled("split")))} | ` +
        `${cell(engineX)} | ` +
        `${show(ratio(engineX?.ms, fastest(plain)?.ms), 2, "x")} |`;
    }),
  ];
}

/**
 * Markdown rows of the decode attention in isolation (the `attention` stage): per context and
 * batch, the fastest path 64 invocations wide and the fastest wider (kernels/decode_split.ts
 * DECODE_WIDTHS), and their ratio: whether the wider kernel can replace a split and its merge.
 */
function attentionRows(b: BatteryFigures): string[] {
  if (b.attention.size === 0) return ["- not measured"];
  const at64 = (name: string) => name.endsWith(", 64 wide");
  return [
    "| case | fastest, 64 wide | fastest, wider | wider / 64 |",
    "| --- | --- | --- | --- |",
    ...[...b.attention].map(([c, times]) => {
      const narrow = fastest(times, at64);
      const wider = fastest(times, (name) => !at64(name));
      return `| ${c} | ${cell(narrow)} | ${cell(wider)} | ${
        show(ratio(wider?.ms, narrow?.ms), 2, "x")
      } |`;
    }),
  ];
}

/**
 * Markdown rows of the `gemv` kernels' X loads: per case of the `kernels-xscalar` stage, the
 * fastest gemv reading X in 4-byte loads against the fastest reading it as vec4s (`kernels-rms`,
 * same X form and M).
 */
function xLoadRows(b: BatteryFigures): string[] {
  if (b.kernelsRmsScalar.size === 0) return ["- not measured"];
  const gemv = (name: string) => name.startsWith("gemv");
  return [
    "| case | fastest gemv, vec4 X | fastest gemv, scalar X | vec4 / scalar |",
    "| --- | --- | --- | --- |",
    ...[...b.kernelsRmsScalar].map(([c, times]) => {
      const vec4 = fastest(b.kernelsRms.get(c), gemv);
      const scalar = fastest(times, gemv);
      return `| ${c} | ${cell(vec4)} | ${cell(scalar)} | ${
        show(ratio(vec4?.ms, scalar?.ms), 2, "x")
      } |`;
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
  for (const tokens of [128, 256, 512]) {
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
      `serve, concurrency ${c}: output tok/s (${level?.ok ?? "-"} ok` +
        (level?.preempted == null ? ")" : `, ${level.preempted} preemptions)`),
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
  for (const tokens of [128, 512]) {
    row(
      `prefill ${tokens}: tuned / defaults (--kernel-tuning off)`,
      show(ratio(p(b.model, tokens)?.tokPerS, p(b.untuned, tokens)?.tokPerS), 2, "x"),
    );
  }
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
    "GPU memory and the KV cache sized from it (info, kv-auto):",
    ...(b.memory.length === 0 ? ["- not measured"] : b.memory.map((l) => `- ${l}`)),
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
    "",
    "Decode attention in isolation (bench/attention_bench.ts; stage attention):",
    "",
    ...attentionRows(b),
    "",
    "gemv X loads, normed residual X (stages kernels-rms, kernels-xscalar):",
    "",
    ...xLoadRows(b),
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
