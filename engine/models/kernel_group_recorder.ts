/**
 * A step taken apart by kernel group, for benchmarks: passed to `ModelRunner.execute` (as
 * `timing.groups`), it encodes every dispatch of the step into the step's pass as usual (the
 * step computes and samples exactly what it would without it) and also records, per group, the
 * pipeline, bind group and grid of each. {@linkcode KernelGroupRecorder.replay} then encodes one
 * group's dispatches, all layers of it, into a pass of the caller's (e.g. one timed with
 * timestamp writes): exactly the call sites, buffers and parameters of the engine's step.
 *
 * A replay runs the group's kernels over whatever the step buffers hold: it overwrites the
 * recorded step's activations, its KV cache slots and its ring slot of sampled tokens (read the
 * step's result first; do not feed a later step from its samples).
 *
 * @module
 */

import type { KernelWork, WorkCountingPass } from "../../kernels/dispatch.ts";
import type { KernelGroup, StepPasses } from "./step_passes.ts";

/** One recorded pass command, re-encoded into another pass by a replay. */
type Command = (pass: GPUComputePassEncoder) => void;

/**
 * The pass one group's call sites see: forwards each command to the step's pass and records it.
 * Kernels set a pipeline and bind group 0 and dispatch (kernels/call_site.ts); a kernel that
 * used another pass method would fail here loudly (no such method), never be dropped silently.
 */
class RecordingPass implements WorkCountingPass {
  readonly commands: Command[] = [];
  dispatches = 0;
  /** The work the call sites reported (kernels/dispatch.ts `noteWork`), summed. */
  work: KernelWork | undefined;

  constructor(readonly target: GPUComputePassEncoder) {}

  setPipeline(pipeline: GPUComputePipeline): void {
    this.target.setPipeline(pipeline);
    this.commands.push((pass) => pass.setPipeline(pipeline));
  }

  setBindGroup(index: number, group: GPUBindGroup | null, offsets?: number[]): void {
    this.target.setBindGroup(index, group, offsets);
    this.commands.push((pass) => pass.setBindGroup(index, group, offsets));
  }

  dispatchWorkgroups(x: number, y?: number, z?: number): void {
    this.target.dispatchWorkgroups(x, y, z);
    this.commands.push((pass) => pass.dispatchWorkgroups(x, y, z));
    this.dispatches++;
  }

  noteWork(work: KernelWork): void {
    const w = this.work;
    this.work = w === undefined
      ? { ...work }
      : { flops: w.flops + work.flops, bytes: w.bytes + work.bytes };
  }
}

/** Records one step's dispatches by kernel group (see the module doc). */
export class KernelGroupRecorder implements StepPasses {
  #target: GPUComputePassEncoder | null = null;
  readonly #groups = new Map<KernelGroup, RecordingPass>();

  /** Starts recording a step encoded into `pass` (forgets the previous one); returns this. */
  use(pass: GPUComputePassEncoder): this {
    this.#target = pass;
    this.#groups.clear();
    return this;
  }

  at(group: KernelGroup): GPUComputePassEncoder {
    if (this.#target === null) {
      throw new Error("KernelGroupRecorder.at() before use(): no step is being recorded");
    }
    let recording = this.#groups.get(group);
    if (recording === undefined) {
      recording = new RecordingPass(this.#target);
      this.#groups.set(group, recording);
    }
    // Only the methods kernels call exist on it (see RecordingPass).
    return recording as unknown as GPUComputePassEncoder;
  }

  /** The groups that dispatched, in the order of their first call site in the step. */
  get groups(): KernelGroup[] {
    return [...this.#groups].filter(([, r]) => r.dispatches > 0).map(([g]) => g);
  }

  /**
   * The work `group`'s call sites reported (kernels/dispatch.ts `noteWork`: the matmuls' and
   * the decode attention's FLOPs and bytes read), summed over the step; undefined when none did.
   */
  work(group: KernelGroup): KernelWork | undefined {
    return this.#groups.get(group)?.work;
  }

  /** Dispatches of the recorded step, `group`'s only when given. */
  dispatches(group?: KernelGroup): number {
    if (group !== undefined) return this.#groups.get(group)?.dispatches ?? 0;
    return [...this.#groups.values()].reduce((n, r) => n + r.dispatches, 0);
  }

  /**
   * Encodes `group`'s recorded dispatches, in step order, into `pass`. Their parameters are the
   * ones the step wrote (each call site has its own slot in the runner's parameter arena).
   *
   * @throws {RangeError} when the recorded step has no dispatch of `group`.
   */
  replay(group: KernelGroup, pass: GPUComputePassEncoder): void {
    const recording = this.#groups.get(group);
    if (recording === undefined || recording.dispatches === 0) {
      throw new RangeError(`The recorded step has no dispatch of kernel group "${group}"`);
    }
    for (const command of recording.commands) command(pass);
  }
}
