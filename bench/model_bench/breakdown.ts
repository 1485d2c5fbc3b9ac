/**
 * The model bench's per-kernel breakdown of one step, through the real runner: one decode step
 * of `batch` sequences at position {@linkcode PROMPT} (context PROMPT + 1, over the prefilled
 * prompt), or the prefill of one sequence of `tokens` tokens, runs with its dispatches recorded
 * by kernel group
 * ({@linkcode KernelGroupRecorder}: the groups the model names, e.g. all layers' qkv matmuls);
 * then each group's dispatches, all layers of them, are replayed as one compute pass and timed
 * with GPU timestamps (bench/support.ts `timeGpu`: median of 3 after a warm-up; where the adapter
 * lacks `timestamp-query`, the host clock over 3 passes in one submission). The figures are
 * those of the engine's own call sites, weights and buffers.
 *
 * @module
 */

import type { ForwardBatch } from "../../engine/forward_batch.ts";
import type { GpuContext } from "../../gpu/context.ts";
import type { KernelWork } from "../../kernels/dispatch.ts";
import { KernelGroupRecorder } from "../../engine/models/kernel_group_recorder.ts";
import { timeGpu } from "../support.ts";
import { PROMPT } from "./options.ts";
import type { BenchWorkload } from "./workload.ts";

/** One kernel group's time in the breakdown. */
export interface Group {
  readonly name: string;
  readonly ms: number;
  /** What the group's call sites reported doing (the matmuls: FLOPs, weight bytes), if any. */
  readonly work?: KernelWork;
}

/** Runs `input` with its dispatches recorded by kernel group. */
async function record(work: BenchWorkload, input: ForwardBatch): Promise<KernelGroupRecorder> {
  const recorder = new KernelGroupRecorder();
  await work.runner.execute(input, { groups: recorder }).result;
  return recorder;
}

/**
 * The breakdown of one decode step of `batch` sequences (see the module doc), groups in step
 * order. The replays overwrite the step's activations and its KV slots at position PROMPT
 * (every decode the bench runs writes those before reading them).
 */
export function breakdown(ctx: GpuContext, work: BenchWorkload, batch: number): Promise<Group[]> {
  const input = work.decodeStep(work.tables(batch), PROMPT, () => PROMPT % work.vocabTokens);
  return timeGroups(ctx, work, input);
}

/**
 * The breakdown of the prefill of one sequence of `tokens` tokens (see the module doc), in the
 * last decode sequence's own KV blocks (the warm-up prefill's; the shared prompt's blocks stay
 * as they are); groups in step order.
 */
export function prefillBreakdown(
  ctx: GpuContext,
  work: BenchWorkload,
  tokens: number,
): Promise<Group[]> {
  const base = work.blocksPerSeq * work.runner.options.maxSeqs;
  return timeGroups(ctx, work, work.prefillStep(tokens, base));
}

/** Each kernel group of the step `input`, replayed alone and timed. */
async function timeGroups(
  ctx: GpuContext,
  work: BenchWorkload,
  input: ForwardBatch,
): Promise<Group[]> {
  const recorder = await record(work, input);
  const out: Group[] = [];
  for (const name of recorder.groups) {
    const t = await timeGpu(ctx, (pass) => recorder.replay(name, pass), {
      warmup: 1,
      repeats: 3,
    });
    const work = recorder.work(name);
    out.push(work === undefined ? { name, ms: t.medianMs } : { name, ms: t.medianMs, work });
  }
  return out;
}
