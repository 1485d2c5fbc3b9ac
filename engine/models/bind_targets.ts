/**
 * What a model's call sites are bound against, allocated once per model runner for its largest
 * step: the paged KV cache, the step buffers, the parameter arena, and the compiled kernels
 * (attention included). Every layer of the model binds against the same ones.
 *
 * @module
 */

import type { GpuContext } from "../../gpu/context.ts";
import { ParamArena } from "../../gpu/params.ts";
import { KvCache } from "../kv_cache.ts";
import type { ModelConfig } from "../model/config.ts";
import { DEFAULT_RING_SLOTS, StepBuffers } from "../step_buffers.ts";
import { AttentionKernels, GPU_PREFILL_VARIANTS } from "./attention_block.ts";
import type { TiledPrefillVariant } from "../../kernels/paged_attention_prefill.ts";
import { KernelSet } from "./kernel_set.ts";

/** What an architecture binds its call sites against (the runner's, shared by every layer). */
export interface BindTargets {
  readonly kernels: KernelSet;
  readonly attention: AttentionKernels;
  /** The parameter slots of every call site. */
  readonly arena: ParamArena;
  readonly bufs: StepBuffers;
  readonly kv: KvCache;
}

/** The sizes the targets are allocated for (the model runner's options). */
export interface BindTargetSizes {
  /** Most new tokens in one step. */
  readonly maxTokens: number;
  /** Most sequences in one step. */
  readonly maxSeqs: number;
  /** Most sampler rows in one step (at least maxSeqs; default maxSeqs; engine/sampler.ts). */
  readonly maxRows?: number;
  /** Longest sequence, prompt and output. */
  readonly maxModelLen: number;
  /** Tokens per KV block. */
  readonly blockSize: number;
  /** KV blocks in the pool. */
  readonly numKvBlocks: number;
  /** Compile the fused decode attention for a RoPE model (gpu profile); default true. */
  readonly fusedDecode?: boolean;
  /** Steps in flight at once (default `DEFAULT_RING_SLOTS` - 1): the ring has one slot more. */
  readonly maxInFlight?: number;
}

/**
 * Allocates the KV cache and step buffers for `sizes` (in `ctx.weightDtype`), the parameter
 * arena, and compiles the kernels, for a model of config `c` (of the GPU prefill attention
 * kernels, `gpuPrefill`: see `gpuPrefillCompiles`). The caller destroys `kv`, `bufs`, `arena` and
 * `attention` (in that order of allocation).
 */
export function allocateBindTargets(
  ctx: GpuContext,
  c: ModelConfig,
  sizes: BindTargetSizes,
  gpuPrefill: readonly TiledPrefillVariant[] = GPU_PREFILL_VARIANTS,
): BindTargets {
  const dtype = ctx.weightDtype;
  const D = c.headDim;
  const kv = new KvCache(ctx, {
    numLayers: c.numLayers,
    numKvHeads: c.numKvHeads,
    headDim: D,
    blockSize: sizes.blockSize,
    dtype,
  }, sizes.numKvBlocks);
  const qkvWidth = (c.numHeads + 2 * c.numKvHeads) * D;
  const bufs = new StepBuffers(ctx, {
    maxTokens: sizes.maxTokens,
    maxSeqs: sizes.maxSeqs,
    maxRows: sizes.maxRows ?? sizes.maxSeqs,
    maxBlocksPerSeq: Math.ceil(sizes.maxModelLen / sizes.blockSize),
  }, {
    hidden: c.hiddenSize,
    qkv: qkvWidth,
    attn: c.numHeads * D,
    mlp: c.arch === "GPT2LMHeadModel" ? c.intermediateSize : 2 * c.intermediateSize,
    vocab: c.vocabSize,
  }, sizes.maxInFlight === undefined ? DEFAULT_RING_SLOTS : sizes.maxInFlight + 1);
  // 64 for the step's own kernels (feed, LM head, a sample and a top_logprobs per ring slot of
  // the default 8, logits_process and its re-bindings when its lists grow) and the model's final
  // layers, two more per further ring slot; each further sub-batch of sampler rows binds one more
  // LM head (a slot per weight part) and a sample and a top_logprobs per ring slot
  // (engine/sampler.ts).
  const subBatches = Math.ceil((sizes.maxRows ?? sizes.maxSeqs) / sizes.maxSeqs);
  const arena = new ParamArena(
    ctx,
    128 + 40 * c.numLayers + 2 * Math.max(0, bufs.ringSlots - DEFAULT_RING_SLOTS) +
      (subBatches - 1) * (32 + 2 * bufs.ringSlots),
  );
  const kernels = new KernelSet(ctx, dtype);
  const attention = new AttentionKernels(
    ctx,
    {
      numHeads: c.numHeads,
      numKvHeads: c.numKvHeads,
      headDim: D,
      qkvWidth,
      kOffset: c.numHeads * D,
      vOffset: (c.numHeads + c.numKvHeads) * D,
      maxModelLen: sizes.maxModelLen,
    },
    kv,
    sizes.maxSeqs,
    gpuPrefill,
    // RoPE models (every architecture but GPT-2); head norms in the weights' dtype (Qwen3).
    c.arch === "GPT2LMHeadModel" || sizes.fusedDecode === false
      ? undefined
      : { normDtype: c.qkNorm ? dtype : null, eps: c.normEps },
  );
  return { kernels, attention, arena, bufs, kv };
}
