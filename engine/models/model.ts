/**
 * What the model runner needs from an architecture: load its weights, bind its call sites once,
 * and encode the forward pass of a step up to the final hidden state of the rows that sample
 * (in `StepBuffers.lastNormed`), each call site into the pass of its kernel group
 * (step_passes.ts). The LM head and the sampler are shared (engine/sampler.ts).
 *
 * @module
 */

import type { ModelConfig } from "../model/config.ts";
import type { GpuMatrix } from "../../gpu/tensor.ts";
import type { StepShape } from "./attention_block.ts";
import type { StepPasses } from "./step_passes.ts";

/** Encodes one step's forward pass over bound call sites. */
export type EncodeForward = (passes: StepPasses, step: StepShape) => void;

/** A model ready to encode steps. */
export interface Model {
  readonly config: ModelConfig;
  /** `[vocab, hidden]` weight of the LM head (the embedding table when tied). */
  readonly lmHead: GpuMatrix;
  /**
   * Encodes the forward pass up to `lastNormed` (final norm applied to the sampled rows), each
   * call site into `passes.at(its kernel group)`.
   */
  encode(passes: StepPasses, step: StepShape): void;
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
  readonly #encode: EncodeForward;
  readonly #weights: { destroy(): void };

  /**
   * @param encode encodes one step's forward pass over the bound call sites.
   * @param weights owner of the weight buffers (released by {@linkcode BoundModel.destroy}).
   */
  constructor(
    config: ModelConfig,
    lmHead: GpuMatrix,
    encode: EncodeForward,
    weights: { destroy(): void },
  ) {
    this.config = config;
    this.lmHead = lmHead;
    this.#encode = encode;
    this.#weights = weights;
  }

  encode(passes: StepPasses, step: StepShape): void {
    this.#encode(passes, step);
  }

  destroy(): void {
    this.#weights.destroy();
  }
}
