/**
 * The model bench's per-kernel breakdown of one decode step, through the real runner: one
 * decode step of `batch` sequences at position {@linkcode PROMPT} (context PROMPT + 1, over the
 * prefilled prompt) runs with its dispatches recorded by kernel group
 * ({@linkcode KernelGroupRecorder}: the groups the model names, e.g. all layers' qkv matmuls);
 * then each group's dispatches, all layers of them, are replayed as one compute pass and timed
 * with GPU timestamps (bench/support.ts `timeGpu`: median of 3 after a warm-up; where the adapter
 * lacks `timestamp-query`, the host clock over 3 passes in one submission). The figures are
 * those of the engine's own call sites, weights and buffers.
 *
 * @module
 */

import type { GpuContext } from "../../gpu/context.ts";
import { KernelGroupRecorder } from "../../engine/models/kernel_group_recorder.ts";
import { timeGpu } from "../support.ts";
import { PROMPT } from "./options.ts";
import type { BenchWorkload } from "./workload.ts";

/** One kernel group's time in the breakdown. */
export interface Group {
  readonly name: string;
  readonly ms: number;
}

/** Records the decode step of `batch` sequences at position PROMPT by kernel group. */
async function recordDecodeStep(
  work: BenchWorkload,
  batch: number,
): Promise<KernelGroupRecorder> {
  const recorder = new KernelGroupRecorder();
  const input = work.decodeStep(work.tables(batch), PROMPT, () => PROMPT % work.vocabTokens);
  await work.runner.execute(input, { groups: recorder }).result;
  return recorder;
}

/**
 * The breakdown of one decode step of `batch` sequences (see the module doc), groups in step
 * order. The replays overwrite the step's activations and its KV slots at position PROMPT
 * (every decode the bench runs writes those before reading them).
 */
export async function breakdown(
  ctx: GpuContext,
  work: BenchWorkload,
  batch: number,
): Promise<Group[]> {
  const recorder = await recordDecodeStep(work, batch);
  const out: Group[] = [];
  for (const name of recorder.groups) {
    const t = await timeGpu(ctx, (pass) => recorder.replay(name, pass), {
      warmup: 1,
      repeats: 3,
    });
    out.push({ name, ms: t.medianMs });
  }
  return out;
}
