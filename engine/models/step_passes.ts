/**
 * Where a step's dispatches go. The runner and the model name the kernel group of each call
 * site as they encode it (`passes.at(group).encode...`): the engine's own steps use
 * {@linkcode SinglePass}, which ignores the name and hands back the step's one compute pass; a
 * benchmark hands a {@linkcode KernelGroupRecorder} (kernel_group_recorder.ts) instead, to take
 * one step apart by group. A group is every call site of one kind in the step (e.g. all layers'
 * qkv matmuls); its name is what the model bench prints.
 *
 * @module
 */

/** The name of a kernel group (see the module doc), as the model bench prints it. */
export type KernelGroup = string;

/**
 * The groups every architecture has. The sampling stage (engine/sampler.ts) is two: the LM head
 * over the sampled rows, then the rest (masks, top logprobs, logits processing, sampling).
 */
export const KERNEL_GROUPS = {
  /** The runner's token feed and the model's embedding lookups. */
  embedding: "embedding + token feed",
  qkv: "matmul qkv",
  /** Each layer's `reshape_and_cache` and attention (decode or prefill kernel). */
  attention: "reshape_and_cache + attention",
  /** The attention output projection. */
  o: "matmul o",
  /** The LM head over the rows that sample. */
  lmHead: "matmul lm_head",
  /** Token masks, top logprobs, logits processing and sampling. */
  sample: "sample",
} as const;

/** Hands out the compute pass for each call site of a step. */
export interface StepPasses {
  /** The compute pass the next dispatches, of kernel group `group`, are encoded into. */
  at(group: KernelGroup): GPUComputePassEncoder;
}

/** Every dispatch of a step in the step's one compute pass (the engine's path). */
export class SinglePass implements StepPasses {
  #pass: GPUComputePassEncoder | null = null;

  /** Makes `pass` the pass of the step being encoded; returns this. */
  use(pass: GPUComputePassEncoder): this {
    this.#pass = pass;
    return this;
  }

  at(_group: KernelGroup): GPUComputePassEncoder {
    return this.#pass!;
  }
}
