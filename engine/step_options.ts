/**
 * How `ModelRunner.execute` (engine/model_runner.ts) runs one step (its GPU timing for
 * benchmarks, whether its readback waits for a later step) and the handle it returns.
 *
 * @module
 */

import type { KernelGroupRecorder } from "./models/kernel_group_recorder.ts";
import type { SampledRows } from "./sampled_rows.ts";

/**
 * GPU timing of one step (benchmarks): the step's single compute pass is opened with
 * `descriptor` (e.g. {@linkcode GpuTimer.passDescriptor}, timestamp writes) and `resolve` is
 * called on the step's encoder after the pass (e.g. `GpuTimer.resolve`); with `groups`, the
 * step's dispatches are also recorded by kernel group, for a per-group breakdown
 * ({@linkcode KernelGroupRecorder.replay}). Without a timing, a step costs nothing of this.
 */
export interface StepTiming {
  readonly descriptor?: GPUComputePassDescriptor;
  resolve?(encoder: GPUCommandEncoder): void;
  readonly groups?: KernelGroupRecorder;
}

/**
 * How to run one step: its GPU timing (benchmarks), and whether its readback may wait for a
 * later step (`overlap`, `readbackBatch`).
 *
 * Deno's `mapAsync` (and `onSubmittedWorkDone`) blocks the calling thread, in the call itself,
 * until the GPU has finished every submitted step (deno ext/webgpu polls the device with a
 * blocking wait first). Started right after a step's submit, it keeps the host from encoding
 * the next step while the GPU runs this one. With `overlap`, the step's readback is deferred:
 * deferred readbacks start together when a later `execute` has encoded and finished its command
 * buffer, just before submitting it, once as many are deferred as one of them allows
 * (`readbackBatch`), or at `ModelRunner.flush`: the host encodes the next step while
 * the GPU runs the queued ones, and the GPU waits for the host only for that submit, once per
 * `readbackBatch` steps (the first `mapAsync` of the batch waits for the GPU; the others find
 * their steps done). The caller must call `flush()` before it waits on a step whose readback has
 * not started ({@linkcode StepHandle.readbackStarted}).
 */
export interface StepOptions extends StepTiming {
  readonly overlap?: boolean;
  /**
   * With `overlap`: this step's readback starts at the first `execute` that finds this many
   * readbacks deferred, its own included (default 1: at the next `execute`). A step without
   * `overlap` starts every deferred one first.
   */
  readonly readbackBatch?: number;
}

/** A submitted step. */
export interface StepHandle {
  /** The runner's number for this step (0, 1, ...): name its samples with `sampledRef`. */
  readonly step: number;
  /** Sequences that sampled (rows of the result, in batch order). */
  readonly rows: number;
  /** Resolves when the GPU has finished the step (rows may be 0). */
  readonly result: Promise<SampledRows>;
  /** Whether the step's readback has started (false while deferred: see `StepOptions`). */
  readbackStarted(): boolean;
  /** `result`, after starting the deferred readbacks when this step's has not started. */
  wait(): Promise<SampledRows>;
}
