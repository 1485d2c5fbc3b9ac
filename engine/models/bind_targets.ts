/**
 * What a model's call sites are bound against, allocated once per model runner for its largest
 * step: the step buffers, the parameter arena, and the compiled kernels (attention included),
 * before the weights load; and the paged KV cache, which a model allocates once its weights are
 * on the device (so that the engine can size it from the memory left: engine/engine_setup.ts).
 * Every layer of the model binds against the same ones.
 *
 * @module
 */

import type { GpuContext } from "../../gpu/context.ts";
import { type KvCacheDtypeChoice, kvDtypeOf } from "../../gpu/dtype.ts";
import { ParamArena } from "../../gpu/params.ts";
import type { KvCache, KvCacheShape } from "../kv_cache.ts";
import type { ModelConfig } from "../model/config.ts";
import { DEFAULT_RING_SLOTS, StepBuffers } from "../step_buffers.ts";
import { AttentionKernels, GPU_PREFILL_VARIANTS } from "./attention_block.ts";
import type { TiledPrefillVariant } from "../../kernels/paged_attention_prefill.ts";
import { KernelSet } from "./kernel_set.ts";

/** What an architecture binds its call sites against (the runner's, shared by every layer). */
export interface BindTargets extends ModelTargets {
  readonly kv: KvCache;
}

/** The targets allocated before the weights load: all but the KV cache. */
export interface ModelTargets {
  readonly kernels: KernelSet;
  readonly attention: AttentionKernels;
  /** The parameter slots of every call site. */
  readonly arena: ParamArena;
  readonly bufs: StepBuffers;
}

/**
 * Allocates the KV cache once a model's weights are loaded (engine/models/load_model.ts): the
 * architectures call it between loading their weights and binding their attention.
 */
export type KvCacheAllocator = () => Promise<KvCache>;

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
  /** The KV cache's dtype: `auto` (the default) the weights'. */
  readonly kvCacheDtype?: KvCacheDtypeChoice;
  /** Compile the fused decode attention for a RoPE model (gpu profile); default true. */
  readonly fusedDecode?: boolean;
  /** Steps in flight at once (default `DEFAULT_RING_SLOTS` - 1): the ring has one slot more. */
  readonly maxInFlight?: number;
}

/**
 * The KV cache's shape for a model of config `c` on `ctx`: its dtype `ctx.weightDtype` for
 * `auto` (the default), else as chosen.
 */
export function kvCacheShape(
  ctx: GpuContext,
  c: ModelConfig,
  blockSize: number,
  dtype: KvCacheDtypeChoice = "auto",
): KvCacheShape {
  return {
    numLayers: c.numLayers,
    numKvHeads: c.numKvHeads,
    headDim: c.headDim,
    blockSize,
    dtype: kvDtypeOf(dtype, ctx.weightDtype),
  };
}

/**
 * Allocates the step buffers for `sizes` (in `ctx.weightDtype`), the parameter arena, and
 * compiles the kernels, for a model of config `c` (of the GPU prefill attention kernels,
 * `gpuPrefill`: see `gpuPrefillCompiles`). The caller destroys `bufs`, `arena` and `attention`
 * (in that order of allocation). The KV cache comes later ({@linkcode KvCacheAllocator}).
 */
export function allocateBindTargets(
  ctx: GpuContext,
  c: ModelConfig,
  sizes: BindTargetSizes,
  gpuPrefill: readonly TiledPrefillVariant[] = GPU_PREFILL_VARIANTS,
): ModelTargets {
  const dtype = ctx.weightDtype;
  const D = c.headDim;
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
    kvCacheShape(ctx, c, sizes.blockSize, sizes.kvCacheDtype),
    sizes.maxSeqs,
    gpuPrefill,
    // RoPE models (every architecture but GPT-2); head norms in the weights' dtype (Qwen3).
    c.arch === "GPT2LMHeadModel" || sizes.fusedDecode === false
      ? undefined
      : { normDtype: c.qkNorm ? dtype : null, eps: c.normEps },
  );
  return { kernels, attention, arena, bufs };
}
