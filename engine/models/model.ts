/**
 * What the model runner needs from an architecture: load its weights, bind its call sites once,
 * and encode the forward pass of a step up to the final hidden state of the rows that sample
 * (in `StepBuffers.lastNormed`). The LM head and the sampler are shared (engine/sampler.ts).
 *
 * @module
 */

import type { ModelConfig } from "../model/config.ts";
import type { GpuMatrix } from "../../gpu/tensor.ts";
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

/**
 * A model whose call sites are bound: the forward pass is a closure over them. The
 * architecture files (decoder.ts, gpt2.ts) build one in their `load`.
 */
export class BoundModel implements Model {
  readonly config: ModelConfig;
  readonly lmHead: GpuMatrix;
  readonly #encode: (pass: GPUComputePassEncoder, step: StepShape) => void;
  readonly #weights: { destroy(): void };

  /**
   * @param encode encodes one step's forward pass over the bound call sites.
   * @param weights owner of the weight buffers (released by {@linkcode BoundModel.destroy}).
   */
  constructor(
    config: ModelConfig,
    lmHead: GpuMatrix,
    encode: (pass: GPUComputePassEncoder, step: StepShape) => void,
    weights: { destroy(): void },
  ) {
    this.config = config;
    this.lmHead = lmHead;
    this.#encode = encode;
    this.#weights = weights;
  }

  encode(pass: GPUComputePassEncoder, step: StepShape): void {
    this.#encode(pass, step);
  }

  destroy(): void {
    this.#weights.destroy();
  }
}
