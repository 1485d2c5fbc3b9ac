/**
 * The model bench's ratio lines (bench/model_bench/report.ts): one round's ratios to the first
 * weight format, and over several rounds the median ratio and its range.
 */

import { deepEqual as assertEqual } from "node:assert/strict";
import type { Quantization } from "../gpu/quant.ts";
import {
  medianRatioLines,
  prefillLine,
  ratioLines,
  type RunResult,
} from "../bench/model_bench/report.ts";
import type { DecodeResult } from "../bench/model_bench/workload.ts";

/** A run of `quantization` with these decode rates (batches 1, 8) and one prefill rate. */
function run(
  quantization: Quantization,
  bytes: number,
  decode: readonly [number, number],
  prefill: number,
): RunResult {
  return {
    quantization,
    weightBytes: bytes,
    unquantizedWeightBytes: 1000,
    prefill: [{ tokens: 512, ms: 1, tokensPerS: prefill, cpuS: 0, gpuMs: null }],
    decode: decode.map((tokensPerS, i) => ({ batch: [1, 8][i]!, tokensPerS }) as DecodeResult),
  };
}

Deno.test("ratioLines() divides each figure by the first format's", () => {
  assertEqual(
    ratioLines([run("none", 1000, [10, 40], 20), run("int4", 281, [25, 50], 10)]),
    [
      "ratios to none (same run):",
      "  int4: weight bytes 0.281x; batch 1 2.50x, batch 8 1.25x, prefill 512 0.50x",
    ],
  );
  assertEqual(ratioLines([run("none", 1000, [10, 40], 20)]), []);
});

Deno.test("medianRatioLines() gives each figure's median ratio over the rounds and its range", () => {
  const rounds = [
    [
      run("none", 1000, [10, 40], 20),
      run("int8", 531, [14, 40], 20),
      run("int4", 281, [20, 44], 18),
    ],
    [
      run("none", 1000, [20, 40], 20),
      run("int8", 531, [30, 44], 22),
      run("int4", 281, [50, 40], 20),
    ],
    [run("none", 1000, [5, 40], 10), run("int8", 531, [8, 48], 10), run("int4", 281, [12, 36], 11)],
  ];
  assertEqual(medianRatioLines(rounds), [
    "ratios to none, median of 3 rounds (range):",
    "  int8: weight bytes 0.531x; batch 1 1.50x (1.40-1.60), batch 8 1.10x (1.00-1.20), " +
    "prefill 512 1.00x (1.00-1.10)",
    "  int4: weight bytes 0.281x; batch 1 2.40x (2.00-2.50), batch 8 1.00x (0.90-1.10), " +
    "prefill 512 1.00x (0.90-1.10)",
  ]);
  // Two rounds: the upper of the two middle values.
  assertEqual(
    medianRatioLines(rounds.slice(0, 2))[1]!.split("; ")[1]!.split(",")[0],
    "batch 1 1.50x (1.40-1.50)",
  );
  assertEqual(medianRatioLines([[run("none", 1000, [10, 40], 20)]]), []);
});

Deno.test("prefillLine() gives the GPU pass's time and rate beside the wall time when timed", () => {
  const r = { tokens: 512, ms: 76.2, tokensPerS: 6719.2, cpuS: 0.04 };
  assertEqual(
    prefillLine({ ...r, gpuMs: 51.2 }),
    "prefill 512 tokens: 76 ms, 6719.2 tok/s (CPU 0.0 s; GPU pass 51.2 ms, 10000.0 tok/s)",
  );
  assertEqual(
    prefillLine({ ...r, gpuMs: null }),
    "prefill 512 tokens: 76 ms, 6719.2 tok/s (CPU 0.0 s)",
  );
});

Deno.test("prefillLine() gives the medians' rounds and range with --prefill-repeats", () => {
  const r = { tokens: 512, ms: 76.2, tokensPerS: 6719.2, cpuS: 0.04, gpuMs: 51.2 };
  assertEqual(
    prefillLine({ ...r, repeats: { n: 3, minMs: 74.6, maxMs: 80.1 } }),
    "prefill 512 tokens: 76 ms, 6719.2 tok/s (CPU 0.0 s; median of 3 after an untimed one, " +
      "75-80 ms; GPU pass 51.2 ms, 10000.0 tok/s)",
  );
});
