/**
 * The model bench's printed lines and JSON report: the header, each runner's load, prefill and
 * decode figures, the ratios between weight formats, and the per-kernel breakdown table.
 *
 * @module
 */

import type { Quantization } from "../../gpu/quant.ts";
import type { WeightBytes } from "../../engine/model_runner.ts";
import type { Group } from "./breakdown.ts";
import type { DecodeResult } from "./workload.ts";
import { median } from "../lib/step_cost.ts";

/** The JSON report (`--json`), filled as the bench goes. */
export interface ModelBenchReport {
  machine: string;
  date: string;
  command: string;
  model: string;
  weightDtype: string;
  /** The KV cache's dtype (the weights', or fp8_e4m3). */
  kvCacheDtype: string;
  lpNumThreads: string;
  matmulVariant: string;
  /** Kernel profile, and whether decode steps overlap the host's encoding of the next. */
  kernelProfile: string;
  overlap: boolean | "serial";
  /** Overlapped decode steps: deferred readbacks started together. */
  readbackBatch: number;
  /** Steps the runner keeps in flight. */
  maxInFlight: number;
  copyBandwidthGBs?: number;
  runs?: RunResult[];
  /** The matmul tuning's log line (the last runner's). */
  kernelTuning?: string;
  breakdown?: Record<string, Group[]>;
}

/** One prefill's figures. */
export interface PrefillResult {
  readonly tokens: number;
  /** Wall time: the host's encoding, the GPU's pass and the readback wait. */
  readonly ms: number;
  readonly tokensPerS: number;
  readonly cpuS: number;
  /** The GPU's time for the step's compute pass (`timestamp-query`), else null. */
  readonly gpuMs: number | null;
  /**
   * With `--prefill-repeats` N > 1: N, and the least and most wall ms of the N timed prefills
   * (`ms`, `cpuS` and `gpuMs` are then their medians).
   */
  readonly repeats?: { readonly n: number; readonly minMs: number; readonly maxMs: number };
}

/** One runner's (one weight format's) figures. */
export interface RunResult {
  readonly quantization: Quantization;
  readonly weightBytes: number;
  readonly unquantizedWeightBytes: number;
  readonly prefill: PrefillResult[];
  readonly decode: DecodeResult[];
}

/** The header: machine, command, model. */
export function headerLines(r: ModelBenchReport): string[] {
  return [
    `model_bench: ${r.machine}`,
    `command: ${r.command}; date ${r.date}; LP_NUM_THREADS ${r.lpNumThreads}; ` +
    `matmul kernel ${r.matmulVariant}; kernel profile ${r.kernelProfile}; decode steps ` +
    (r.overlap === "serial"
      ? "run one at a time (each awaited before the next is encoded: the host's cost with the device idle)"
      : r.overlap
      ? `overlapped (readbacks start ${r.readbackBatch} at a time, at a later submit; up to ` +
        `${r.maxInFlight} steps in flight)`
      : "not overlapped"),
    `model: ${r.model} (weights ${r.weightDtype}, KV cache ${r.kvCacheDtype})`,
  ];
}

/** The load time and weight bytes of a runner. */
export function loadLine(
  seconds: number,
  quantization: Quantization,
  weights: WeightBytes,
  dtype: string,
): string {
  return `loaded in ${seconds.toFixed(1)} s; weights ${quantization}: ` +
    `${(weights.device / 2 ** 20).toFixed(1)} MiB on the device` +
    (quantization === "none"
      ? ""
      : ` (${(weights.device / weights.unquantized).toFixed(3)}x of ${dtype})`);
}

/** One prefill's time and rate. */
export function prefillLine(r: PrefillResult): string {
  const gpu = r.gpuMs === null
    ? ""
    : `; GPU pass ${r.gpuMs.toFixed(1)} ms, ${(r.tokens / (r.gpuMs / 1000)).toFixed(1)} tok/s`;
  const repeats = r.repeats === undefined ? "" : `; median of ${r.repeats.n} after an untimed ` +
    `one, ${r.repeats.minMs.toFixed(0)}-${r.repeats.maxMs.toFixed(0)} ms`;
  return `prefill ${r.tokens} tokens: ${r.ms.toFixed(0)} ms, ${r.tokensPerS.toFixed(1)} tok/s ` +
    `(CPU ${r.cpuS.toFixed(1)} s${repeats}${gpu})`;
}

/** A batch size's decode rate, and its host cost per step. */
export function decodeLines(r: DecodeResult, stepWeightBytes: number, layers: number): string[] {
  const msPerStep = r.wallMs / r.steps;
  const k = r.cost;
  return [
    `decode batch ${r.batch}: ${r.tokensPerS.toFixed(2)} tok/s, ${msPerStep.toFixed(1)} ms/step ` +
    `(${r.steps} steps, CPU ${(r.cpuS / r.steps * 1000).toFixed(0)} ms/step), weights ` +
    `${(stepWeightBytes / (msPerStep * 1e6)).toFixed(2)} GB/s`,
    `  host per step: ${k.dispatchesPerCall.toFixed(0)} dispatches ` +
    `(${(k.dispatchesPerCall / layers).toFixed(1)} per layer, fixed ones included), ` +
    `${k.hostMsPerCall.toFixed(2)} ms to prepare, encode and submit (prepare ` +
    `${k.phases.prepare.toFixed(2)}, record ${k.phases.encode.toFixed(2)}, finish ` +
    `${k.phases.finish.toFixed(2)}, rest ${k.phases.rest.toFixed(2)}); blocked in WebGPU: ` +
    `${k.submitMsPerCall.toFixed(1)} ms in queue.submit, ${k.mapAsyncMsPerCall.toFixed(1)} ms ` +
    `in mapAsync (Deno waits there for the GPU to finish the steps submitted so far)`,
    ...(r.gpu === null ? [] : [
      `  GPU per step (timestamps): ${r.gpu.busyMsPerStep.toFixed(2)} ms computing, ` +
      `${r.gpu.idleMsPerStep.toFixed(3)} ms idle between steps (waiting for the host)`,
    ]),
  ];
}

/** Each weight format's figures as ratios to the first one's (nothing for one format). */
export function ratioLines(runs: readonly RunResult[]): string[] {
  const [base, ...rest] = runs;
  if (base === undefined || rest.length === 0) return [];
  return [
    `ratios to ${base.quantization} (same run):`,
    ...rest.map((r) =>
      `  ${r.quantization}: weight bytes ${(r.weightBytes / base.weightBytes).toFixed(3)}x; ` +
      ratios(base, r).map(({ label, ratio }) => `${label} ${ratio.toFixed(2)}x`).join(", ")
    ),
  ];
}

/** Each decode batch's and prefill's rate in `r` over the same figure in `base`. */
function ratios(base: RunResult, r: RunResult): { label: string; ratio: number }[] {
  return [
    ...r.decode.map((d, j) => ({
      label: `batch ${d.batch}`,
      ratio: d.tokensPerS / base.decode[j]!.tokensPerS,
    })),
    ...r.prefill.map((p, j) => ({
      label: `prefill ${p.tokens}`,
      ratio: p.tokensPerS / base.prefill[j]!.tokensPerS,
    })),
  ];
}

/**
 * The ratios of {@linkcode ratioLines} over several rounds (each a run of every format, in the
 * same order): per format and figure, the median of the rounds' ratios (the upper one of an
 * even count) and their range.
 */
export function medianRatioLines(rounds: readonly (readonly RunResult[])[]): string[] {
  const first = rounds[0];
  if (first === undefined || first.length < 2) return [];
  const base = first[0]!;
  const lines = [`ratios to ${base.quantization}, median of ${rounds.length} rounds (range):`];
  for (let i = 1; i < first.length; i++) {
    const perRound = rounds.map((runs) => ratios(runs[0]!, runs[i]!));
    const cells = perRound[0]!.map(({ label }, j) => {
      const values = perRound.map((rs) => rs[j]!.ratio);
      return `${label} ${median(values).toFixed(2)}x (${Math.min(...values).toFixed(2)}-${
        Math.max(...values).toFixed(2)
      })`;
    });
    const r = first[i]!;
    lines.push(
      `  ${r.quantization}: weight bytes ${(r.weightBytes / base.weightBytes).toFixed(3)}x; ` +
        cells.join(", "),
    );
  }
  return lines;
}

/**
 * A group's achieved rates, when its call sites reported their work: GFLOP/s, and GB/s of
 * weights (matmuls) or of K and V rows (decode attention), each read once: the bandwidth the
 * kernels need at the least.
 */
function workRates(g: Group): string {
  if (g.work === undefined || g.ms <= 0) return "";
  const rate = (v: number) => v.toFixed(v < 100 ? 1 : 0).padStart(8);
  return `  ${rate(g.work.flops / (g.ms * 1e6))} GFLOP/s ${
    rate(g.work.bytes / (g.ms * 1e6))
  } GB/s read`;
}

/**
 * The breakdown table of one step, a decode step of `batch` sequences or the prefill of `batch`
 * tokens (`kind`): groups by time, their share, and the sum. `method` says how groups were timed;
 * `quantization` is named unless it is "none".
 */
export function breakdownLines(
  batch: number,
  groups: readonly Group[],
  method: string,
  quantization: Quantization,
  kind: "decode" | "prefill" = "decode",
): string[] {
  const total = groups.reduce((s, g) => s + g.ms, 0);
  const weights = quantization === "none" ? "" : `, weights ${quantization}`;
  const step = kind === "decode"
    ? `decode step breakdown, batch ${batch}`
    : `prefill breakdown, ${batch} tokens of one sequence`;
  return [
    `${step}${weights} (${method}, one pass per group):`,
    ...[...groups].sort((a, b) => b.ms - a.ms).map((g) =>
      `  ${g.name.padEnd(40)} ${g.ms.toFixed(2).padStart(8)} ms ` +
      `${((100 * g.ms) / total).toFixed(1).padStart(5)}%${workRates(g)}`
    ),
    `  ${"sum".padEnd(40)} ${total.toFixed(2).padStart(8)} ms`,
  ];
}
