/**
 * `deno task bench:batching --calibrate`: measures the WebGPU runner's step times, fits the mock
 * executor's latency model to them (bench/batching/calibrate.ts) and prints the `--mock-*` flags.
 *
 * @module
 */

import { resolveModelDir } from "../../cli/engine_flags.ts";
import { describeMachine } from "../support.ts";
import { calibrate, type Calibration, measureSwapOutMs } from "./calibrate.ts";
import type { BenchIo } from "../bench_io.ts";
import type { Options } from "./options.ts";
import type { Quantization } from "../../gpu/quant.ts";
import { destroyRunner, loadRunner } from "./runner_timing.ts";

/** What one calibration found, with where it ran. */
interface CalibrationRun {
  readonly machine: string;
  readonly model: string;
  readonly weightDtype: string;
  readonly quantization: Quantization;
  readonly calibration: Calibration;
  readonly swapOutMs: number;
}

/** The `--json` line of a calibration. */
function calibrationJson(run: CalibrationRun): string {
  const { baseMs, perTokenMs, perSeqMs, perKiloPairMs, r2 } = run.calibration.fit;
  return JSON.stringify({
    bench: "batching-calibration",
    machine: run.machine,
    model: run.model,
    weight_dtype: run.weightDtype,
    quantization: run.quantization,
    fit: {
      base_ms: baseMs,
      per_token_ms: perTokenMs,
      per_seq_ms: perSeqMs,
      per_kpair_ms: perKiloPairMs,
      r2,
    },
    swap_out_ms: run.swapOutMs,
    points: run.calibration.points.map((p) => ({
      ...p.shape,
      tokens: p.tokens,
      pairs: p.pairs,
      ms: p.ms,
      fitted_ms: p.fittedMs,
    })),
  });
}

/** The fit, every point measured against fitted, the swap-out time and the flags to pass. */
function printFit(run: CalibrationRun, io: BenchIo): void {
  const { baseMs, perTokenMs, perSeqMs, perKiloPairMs, r2 } = run.calibration.fit;
  const swapOutMs = run.swapOutMs;
  io.log(
    `fit: step ms = ${baseMs.toFixed(3)} + ${perTokenMs.toFixed(4)} x batched tokens + ` +
      `${perSeqMs.toFixed(4)} x sequences + ${perKiloPairMs.toFixed(4)} x 1000 attended ` +
      `pairs (R^2 ${r2.toFixed(3)})`,
  );
  for (const p of run.calibration.points) {
    io.log(
      `  ${p.shape.seqs} x ${p.shape.queryLen} (context ${p.shape.contextLen}): measured ` +
        `${p.ms.toFixed(2)} ms, fitted ${p.fittedMs.toFixed(2)} ms`,
    );
  }
  io.log(
    `swap-out of 16 KV blocks (copy, readback in the background): ${swapOutMs.toFixed(2)} ms`,
  );
  io.log(
    `use: --mock-base-ms ${baseMs.toFixed(2)} --mock-per-token-ms ${perTokenMs.toFixed(4)} ` +
      `--mock-per-seq-ms ${perSeqMs.toFixed(4)} --mock-per-kpair-ms ${
        perKiloPairMs.toFixed(4)
      } --mock-swap-out-ms ${swapOutMs.toFixed(1)}`,
  );
}

/** `--calibrate`: WebGPU step times and the fitted latency model. */
export async function runCalibrate(o: Options, io: BenchIo): Promise<number> {
  const dir = await resolveModelDir(o.model);
  const runner = await loadRunner(
    dir,
    {
      maxTokens: o.maxNumBatchedTokens,
      maxSeqs: Math.min(o.maxNumSeqs, 64),
      maxModelLen: o.maxModelLen,
      numKvBlocks: Math.max(64 * Math.ceil(256 / o.blockSize), Math.floor(o.kvSlots / o.blockSize)),
    },
    o.blockSize,
    o.kernelProfile,
    o.quantization,
  );
  try {
    const machine = describeMachine(runner.ctx);
    if (!o.json) {
      io.log(machine);
      io.log(
        `model: ${dir} (${runner.config.arch}, weights ${runner.ctx.weightDtype}, ` +
          `quantization ${o.quantization})`,
      );
      io.log(`timing: host wall time of N identical steps, ${runner.maxInFlight} in flight, / N`);
    }
    const calibration = await calibrate(runner, undefined, (shape, ms) => {
      if (!o.json) {
        io.log(
          `  ${shape.seqs} seq x ${shape.queryLen} tokens (context ${shape.contextLen}): ` +
            `${ms.toFixed(2)} ms/step`,
        );
      }
    });
    const swapOutMs = await measureSwapOutMs(runner);
    const run = {
      machine,
      model: dir,
      weightDtype: runner.ctx.weightDtype,
      quantization: o.quantization,
      calibration,
      swapOutMs,
    };
    if (o.json) io.log(calibrationJson(run));
    else printFit(run, io);
    return 0;
  } finally {
    destroyRunner(runner);
  }
}
