/**
 * One layer's attention over the paged KV cache: write this step's K and V into the cache
 * (`reshape_and_cache`, unless the model's `rope_and_cache` already did), then attend. Steps
 * where every sequence decodes one token use the decode kernel (one query per sequence, split-K
 * for long contexts); steps with any multi-token chunk use the varlen prefill kernel for all
 * sequences (it handles single-token sequences too). Under the gpu profile a RoPE model's
 * all-decode steps run the decode kernel's fused variant, which does `rope_and_cache`'s work
 * itself ({@linkcode AttentionBlock.fusesRope}): the model skips that dispatch then.
 *
 * @module
 */

import { INDEXED_ROWS } from "../../kernels/block_table_stride.ts";
import type { ParamArena } from "../../gpu/params.ts";
import type { KvCache, KvCacheShape } from "../kv_cache.ts";
import type { StepBuffers } from "../step_buffers.ts";
import { defaultDecodeVariant } from "../../kernels/paged_attention_decode_config.ts";
import {
  type DecodeRopeConfig,
  PagedAttentionDecode,
  type PagedAttentionDecodeOp,
  type PagedAttentionDecodeRopeBuffers,
  unrolledFusedFits,
} from "../../kernels/paged_attention_decode.ts";
import {
  gpuPrefillKernels,
  PagedAttentionPrefill,
  type PagedAttentionPrefillOp,
  type TiledPrefillVariant,
} from "../../kernels/paged_attention_prefill.ts";
import { ReshapeAndCache, type ReshapeAndCacheOp } from "../../kernels/reshape_and_cache.ts";
import type { PrefillChoice } from "../../kernels/prefill_attention_tuner.ts";
import type { GpuContext } from "../../gpu/context.ts";
import type { KvDtype } from "../../gpu/dtype.ts";
import { withErrorScopes } from "../../gpu/timer.ts";

/** Shape of the attention of a model (the same for every layer). */
export interface AttentionGeometry {
  readonly numHeads: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  /** f32 elements per token in the fused `[q | k | v]` buffer. */
  readonly qkvWidth: number;
  /** Offsets of k and v in a fused row (q starts at 0). */
  readonly kOffset: number;
  readonly vOffset: number;
  readonly maxModelLen: number;
}

/** What one step looks like, as the attention needs it. */
export interface StepShape {
  readonly numTokens: number;
  readonly numSeqs: number;
  /** Every sequence computes exactly one new token. */
  readonly allDecode: boolean;
  /** Longest context (tokens in cache after the step). */
  readonly maxContextLen: number;
  /** Sequences that sample a token this step. */
  readonly numSampled: number;
}

/** The GPU prefill attention kernels with a tile of rows per workgroup. */
export const GPU_PREFILL_VARIANTS: readonly TiledPrefillVariant[] = ["tiled", "blocked"];

/**
 * Which of the GPU prefill attention kernels (`tiled`, `blocked`) the adapter compiles for this
 * geometry and KV dtype, each compiled inside GPU error scopes: one that fails is left out, with
 * its message in `errors`, and does not fail the context. None under the cpu profile (they are
 * not added there); a kernel that does not fit the workgroup memory is left out silently.
 */
export async function gpuPrefillCompiles(
  ctx: GpuContext,
  geometry: Pick<AttentionGeometry, "numHeads" | "numKvHeads" | "headDim">,
  dtype: KvDtype,
): Promise<{ readonly variants: TiledPrefillVariant[]; readonly errors: string[] }> {
  const { numHeads, numKvHeads, headDim } = geometry;
  const variants: TiledPrefillVariant[] = [];
  const errors: string[] = [];
  if (ctx.isCpuProfile) return { variants, errors };
  for (const variant of GPU_PREFILL_VARIANTS) {
    // The default shape and each other row count the tuner measures (none where it does not fit).
    const r = await withErrorScopes(ctx.device, () =>
      Promise.resolve(
        gpuPrefillKernels(ctx, { numQHeads: numHeads, numKvHeads, headDim, dtype }, [variant]),
      ));
    if ("error" in r) errors.push(`${variant}: ${r.error.message.split("\n")[0]!}`);
    else if (r.value.length > 0) variants.push(variant);
  }
  return { variants, errors };
}

/**
 * Whether a RoPE model's decode attention runs fused with `rope_and_cache`'s work: always under
 * the gpu kernel profile; under the cpu profile where its `unrolled` kernel runs and the fused
 * variant fits the workgroup memory (lavapipe: one dispatch less per layer, each ~30 us there,
 * bench/dispatch_floor.ts).
 */
export function fusesRope(ctx: GpuContext, group: number, headDim: number): boolean {
  if (!ctx.isCpuProfile) return true;
  return defaultDecodeVariant(ctx, group, headDim) === "unrolled" &&
    unrolledFusedFits(ctx, group, headDim);
}

/** Which prefill kernel runs: `index`, or by step length (the first `byTokens` entry that holds it). */
interface PrefillSelection {
  index: number;
  byTokens: readonly { readonly tokens: number; readonly index: number }[];
}

/** The kernel index `sel` gives a step of `tokens` new tokens. */
function prefillIndex(sel: Readonly<PrefillSelection>, tokens: number): number {
  return (sel.byTokens.find((c) => tokens <= c.tokens) ?? sel).index;
}

/** The attention kernels compiled for one model; {@linkcode AttentionKernels.bind} per layer. */
export class AttentionKernels {
  readonly geometry: AttentionGeometry;
  readonly #reshape: ReshapeAndCache;
  readonly #decode: PagedAttentionDecode;
  /** The profile's prefill kernel first, then (gpu profile, where they fit) `tiled`, `blocked`. */
  readonly #prefill: readonly PagedAttentionPrefill[];
  /**
   * Which of `#prefill` every layer runs (shared by the blocks): `index`, or by step length, the
   * first of `byTokens` whose `tokens` hold the step's new tokens (`index` past the last).
   */
  readonly #prefillChoice: PrefillSelection = { index: 0, byTokens: [] };
  readonly #scratch: ReturnType<PagedAttentionDecode["createScratch"]>;

  /**
   * @param gpuPrefill the GPU prefill kernels to add beside the profile's (gpu profile, where
   *   they fit): {@linkcode gpuPrefillCompiles} says which the adapter compiles.
   * @param rope a RoPE model's head norms: the decode kernel's fused variant (q/k norms, RoPE
   *   and the K/V write of all-decode steps) is then compiled too, see {@linkcode fusesRope}.
   */
  constructor(
    ctx: GpuContext,
    geometry: AttentionGeometry,
    kv: KvCacheShape,
    maxSeqs: number,
    gpuPrefill: readonly TiledPrefillVariant[] = GPU_PREFILL_VARIANTS,
    rope?: DecodeRopeConfig,
  ) {
    this.geometry = geometry;
    const { numHeads, numKvHeads, headDim } = geometry;
    const dtype = kv.dtype;
    this.#reshape = new ReshapeAndCache(ctx, dtype);
    this.#decode = new PagedAttentionDecode(ctx, {
      numQHeads: numHeads,
      numKvHeads,
      headDim,
      blockSize: kv.blockSize,
      dtype,
      ...(rope !== undefined && fusesRope(ctx, numHeads / numKvHeads, headDim) ? { rope } : {}),
    });
    const prefill = { numQHeads: numHeads, numKvHeads, headDim, dtype };
    this.#prefill = [
      new PagedAttentionPrefill(ctx, prefill),
      ...(ctx.isCpuProfile ? [] : gpuPrefillKernels(ctx, prefill, gpuPrefill)),
    ];
    this.#scratch = this.#decode.createScratch(maxSeqs, geometry.maxModelLen);
  }

  /** The prefill attention kernels a layer can run (the first is the default). */
  get prefillKernels(): readonly PagedAttentionPrefill[] {
    return this.#prefill;
  }

  /**
   * The name of the prefill kernel every layer runs (`PagedAttentionPrefill.name`) for steps of
   * `tokens` new tokens (default: the longest, past every length of a choice by length).
   */
  prefillName(tokens = Infinity): string {
    return this.#prefill[prefillIndex(this.#prefillChoice, tokens)]!.name;
  }

  /**
   * Makes every layer run the prefill kernel named `name` (one of {@linkcode prefillKernels}).
   *
   * @throws {RangeError} when no such kernel was compiled for this model and profile.
   */
  usePrefill(name: string): void {
    this.#prefillChoice.index = this.#prefillIndexOf(name);
    this.#prefillChoice.byTokens = [];
  }

  /**
   * Makes every layer run a prefill kernel by step length: `choice`'s (see
   * {@linkcode PrefillChoice}).
   *
   * @throws {RangeError} when a name is not a kernel compiled for this model and profile, or the
   *   choice is empty.
   */
  usePrefillChoice(choice: PrefillChoice): void {
    const byTokens = choice.map((c) => ({ tokens: c.tokens, index: this.#prefillIndexOf(c.name) }));
    const last = byTokens[byTokens.length - 1];
    if (last === undefined) throw new RangeError("Cannot use an empty prefill attention choice");
    this.#prefillChoice.index = last.index;
    this.#prefillChoice.byTokens = byTokens;
  }

  #prefillIndexOf(name: string): number {
    const index = this.#prefill.findIndex((k) => k.name === name);
    if (index < 0) {
      throw new RangeError(
        `Cannot use the ${name} prefill attention: this model runs ${
          this.#prefill.map((k) => k.name).join(" or ")
        }`,
      );
    }
    return index;
  }

  /** The decode attention kernel every layer's call site shares (its split choice is tunable). */
  get decodeKernel(): PagedAttentionDecode {
    return this.#decode;
  }

  /**
   * Binds layer `layer`'s call sites. With `writeCache` false the block does not write K and V
   * (the model writes them before it, e.g. with `rope_and_cache`); `rope`, the inputs of that
   * write, lets all-decode steps run the fused decode variant where it was compiled.
   */
  bind(
    arena: ParamArena,
    bufs: StepBuffers,
    kv: KvCache,
    layer: number,
    { writeCache = true, rope }: {
      writeCache?: boolean;
      rope?: PagedAttentionDecodeRopeBuffers;
    } = {},
  ): AttentionBlock {
    const g = this.geometry;
    const kCache = { buffer: kv.k[layer]! };
    const vCache = { buffer: kv.v[layer]! };
    const q = { buffer: bufs.qkv };
    const btStride = bufs.capacity.maxBlocksPerSeq;
    const reshape = writeCache && this.#reshape.bind(
      arena,
      { src: q, slotMapping: { buffer: bufs.slotMapping }, kCache, vCache },
      {
        numKvHeads: g.numKvHeads,
        headDim: g.headDim,
        blockSize: kv.shape.blockSize,
        srcStride: g.qkvWidth,
        kOffset: g.kOffset,
        vOffset: g.vOffset,
      },
    );
    const common = {
      q,
      kCache,
      vCache,
      blockTables: { buffer: bufs.blockTables },
      contextLens: { buffer: bufs.contextLens },
      out: { buffer: bufs.attnOut },
    };
    const decode = this.#decode.bind(arena, {
      ...common,
      scratch: this.#scratch,
      ...(rope !== undefined ? { rope } : {}),
    }, {
      qStride: g.qkvWidth,
      btStride,
    });
    const prefill = this.#prefill.map((k) =>
      k.bind(arena, { ...common, cuQLens: { buffer: bufs.cuQLens } }, {
        blockSize: kv.shape.blockSize,
        btStride,
        qStride: g.qkvWidth,
      })
    );
    // The step buffers hold the block tables as indexed rows (engine/block_table_rows.ts), every
    // step: set once, here.
    for (const op of [decode, ...prefill]) op.setBlockTableStride(INDEXED_ROWS);
    return new AttentionBlock(reshape, decode, prefill, this.#prefillChoice);
  }

  /** Releases the split-K scratch. */
  destroy(): void {
    this.#scratch.destroy();
  }
}

/** One layer's attention call sites. */
export class AttentionBlock {
  constructor(
    /** The K/V cache write, or false when the model writes the cache itself. */
    private readonly reshape: ReshapeAndCacheOp | false,
    private readonly decode: PagedAttentionDecodeOp,
    /** One op per prefill kernel of the model ({@linkcode AttentionKernels.prefillKernels}). */
    private readonly prefill: readonly PagedAttentionPrefillOp[],
    /** Which of them runs (shared by every layer). */
    private readonly prefillChoice: Readonly<PrefillSelection>,
  ) {}

  /** The prefill op this layer runs for a step of `tokens` new tokens. */
  prefillFor(tokens: number): PagedAttentionPrefillOp {
    return this.prefill[prefillIndex(this.prefillChoice, tokens)]!;
  }

  /**
   * Whether this block's all-decode steps run the fused decode variant, which norms and rotates
   * q and k and writes the new K and V itself: the model does not encode its `rope_and_cache`
   * for such steps.
   */
  get fusesRope(): boolean {
    return this.decode.fusesRope;
  }

  /** Encodes cache writes (when bound with them) and attention for this step; output in `attnOut`. */
  encode(pass: GPUComputePassEncoder, step: StepShape): void {
    if (this.reshape) this.reshape.encode(pass, step.numTokens);
    if (step.allDecode) {
      this.decode.encode(pass, step.numSeqs, step.maxContextLen, undefined, this.fusesRope);
    } else {
      this.prefillFor(step.numTokens).encode(pass, step.numSeqs, step.numTokens);
    }
  }
}
