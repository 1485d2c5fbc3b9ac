/**
 * `deno task bench:batching`: static vs dynamic vs continuous batching on one workload under
 * one KV memory budget.
 *
 * The same requests (default 256, prompts uniform 16..256 tokens, outputs uniform 16..512,
 * ignore_eos, all arriving at once, fixed seed) go through each scheduler of scheduler/*,
 * driven by the harness in bench/batching/harness.ts (the engine's loop, with the scheduler's
 * KV gauges read at every step). Every scheduler gets `--kv-slots` token slots of KV (default
 * 16,384): static and dynamic (10 ms window) reserve max_model_len (default 1024) contiguous
 * slots per batch member, so their batch is the largest that fits (16); continuous pages the
 * same pool in blocks with up to `--max-num-seqs` (256) requests.
 *
 * Executors: `mock` (default), the engine's MockExecutor (engine/executors/mock_executor.ts) on
 * its virtual clock, simulates each step as `a + b * batchedTokens + s * sequences +
 * c * attendedPairs / 1000` ms of virtual time, plus a fixed time per swapped-out request
 * (fast, exactly reproducible; the host is free and the device serial; `--clock wall` runs the
 * same executor on its wall clock instead, without the swap-out time), with the terms fitted
 * from the WebGPU runner's measured step times by `--calibrate` (the defaults in
 * bench/batching/options.ts are such a fit); `webgpu` runs the model (default: the tiny generated
 * tiny-qwen3) in real time, and also measures decode steps per second with one readback per step
 * against pipelined steps.
 *
 * Modes:
 * ```sh
 * deno task bench:batching [--executor mock|webgpu] [--model DIR] [--json] [--requests N] ...
 * deno task bench:batching --calibrate [--model DIR] [--json]   # fit the mock latency model
 * deno task bench:batching --sweep [--rate R] [--out-dir DIR]    # the 004 experiment
 * ```
 * `--sweep` runs static batch sizes 1, 4, 8, dynamic 1, 4, 8 x windows 0, 10, 50 ms and
 * continuous (max_num_seqs 1, 4, 8 and `--max-num-seqs`) on the mock executor with Poisson
 * arrivals at `--rate` req/s (default 20, with short requests by default: prompts 16..64,
 * outputs 4..16, so that gaps are comparable with the wait windows), and writes sweep.md, sweep.json, sweep_latency.svg and
 * sweep_throughput.svg to `--out-dir` (default bench/results/batching-<time>/, git-ignored).
 *
 * Exit status 0 (also for `--help`), 2 for bad command-line input, 1 for a configuration the run cannot take (one
 * `error:` line on stderr).
 *
 * @module
 */

import { runCalibrate } from "./batching/calibrate_command.ts";
import { runCompare } from "./batching/compare.ts";
import { type BenchIo, reportUsage, runMain, UsageError } from "./bench_io.ts";
import { type Options, parseBatchingArgs } from "./batching/options.ts";
import { runSweep } from "./batching/sweep.ts";

const defaultIo: BenchIo = {
  log: (l) => console.log(l),
  err: (l) => console.error(l),
};

/** Runs the benchmark with `argv`; returns the exit status. */
export async function runBatchingBench(argv: string[], io: BenchIo = defaultIo): Promise<number> {
  let o: Options;
  try {
    o = parseBatchingArgs(argv);
  } catch (error) {
    if (error instanceof UsageError) return reportUsage(error, io, "bench:batching");
    throw error;
  }
  try {
    if (o.calibrate) return await runCalibrate(o, io);
    if (o.sweep) return await runSweep(o, io);
    return await runCompare(o, io);
  } catch (error) {
    // A configuration the run cannot take (e.g. shapes the runner cannot hold): one line.
    if (error instanceof RangeError) {
      io.err(`error: ${error.message}`);
      return 1;
    }
    throw error;
  }
}

if (import.meta.main) Deno.exit(await runMain(() => runBatchingBench(Deno.args)));
