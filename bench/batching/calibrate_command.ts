/**
 * `deno task bench:batching --calibrate`: measures the WebGPU runner's step times, fits the mock
 * executor's latency model to them (bench/batching/calibrate.ts) and prints the `--mock-*` flags.
 *
 * @module
 */

import { resolveModelDir } from "../../cli/engine_flags.ts";
import { describeMachine } from "../support.ts";
import { calibrate, measureSwapOutMs } from "./calibrate.ts";
import type { BenchIo } from "../bench_io.ts";
import type { Options } from "./options.ts";
import { loadRunner } from "./runner_timing.ts";

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
  );
  try {
    const machine = describeMachine(runner.ctx);
    if (!o.json) {
      io.log(machine);
      io.log(`model: ${dir} (${runner.config.arch}, weights ${runner.ctx.weightDtype})`);
      io.log(`timing: host wall time of N identical steps, ${runner.maxInFlight} in flight, / N`);
    }
    const cal = await calibrate(runner, undefined, (shape, ms) => {
      if (!o.json) {
        io.log(
          `  ${shape.seqs} seq x ${shape.queryLen} tokens (context ${shape.contextLen}): ` +
            `${ms.toFixed(2)} ms/step`,
        );
      }
    });
    const { baseMs, perTokenMs, perSeqMs, perKiloPairMs, r2 } = cal.fit;
    const swapOutMs = await measureSwapOutMs(runner);
    if (o.json) {
      io.log(JSON.stringify({
        bench: "batching-calibration",
        machine,
        model: dir,
        weight_dtype: runner.ctx.weightDtype,
        fit: {
          base_ms: baseMs,
          per_token_ms: perTokenMs,
          per_seq_ms: perSeqMs,
          per_kpair_ms: perKiloPairMs,
          r2,
        },
        swap_out_ms: swapOutMs,
        points: cal.points.map((p) => ({
          ...p.shape,
          tokens: p.tokens,
          pairs: p.pairs,
          ms: p.ms,
          fitted_ms: p.fittedMs,
        })),
      }));
    } else {
      io.log(
        `fit: step ms = ${baseMs.toFixed(3)} + ${perTokenMs.toFixed(4)} x batched tokens + ` +
          `${perSeqMs.toFixed(4)} x sequences + ${perKiloPairMs.toFixed(4)} x 1000 attended ` +
          `pairs (R^2 ${r2.toFixed(3)})`,
      );
      for (const p of cal.points) {
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
    return 0;
  } finally {
    const ctx = runner.ctx;
    runner.destroy();
    ctx.destroy();
  }
}
