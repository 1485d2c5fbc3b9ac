/**
 * What the model runner needs from an architecture: load its weights, bind its call sites once,
 * and encode the forward pass of a step up to the final hidden state of the rows that sample
 * (in `StepBuffers.lastNormed`). The LM head and the sampler are shared (engine/sampler.ts).
 *
 * @module
 */

import type { ModelConfig } from "../model/config.ts";
import type { GpuMatrix } from "../gpu/tensor.ts";
import type { StepShape } from "./attention_block.ts";

/** A model ready to encode steps. */
export interface Model {
  readonly config: ModelConfig;
  /** `[vocab, hidden]` weight of the LM head (the embedding table when tied). */
  readonly lmHead: GpuMatrix;
  /** Encodes the forward pass up to `lastNormed` (final norm applied to the sampled rows). */
  encode(pass: GPUComputePassEncoder, step: StepShape): void;
  /** Releases weights and scratch buffers. */
  destroy(): void;
}
