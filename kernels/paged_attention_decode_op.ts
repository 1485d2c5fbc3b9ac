/**
 * The split-K scratch and the call site of {@linkcode PagedAttentionDecode}
 * (kernels/paged_attention_decode.ts): where the partials go, and how each step chooses the
 * direct path or split-K and its partition size.
 *
 * @module
 */

import type { ParamSlot } from "../gpu/params.ts";
import { decodeChoiceFor, DEFAULT_DECODE_WIDTH, SPLIT_UNIT } from "./decode_split.ts";
import { checkBlockTableStride } from "./block_table_stride.ts";
import { dispatch1d, MAX_GROUPS_PER_DIM, noteWork } from "./dispatch.ts";
import type { DecodeSites, PagedAttentionDecode } from "./paged_attention_decode.ts";

/**
 * Sequences up to which a scratch also has room for short partitions (they give a small batch
 * more workgroups; see kernels/decode_split.ts): of 64 tokens at any context, of
 * {@linkcode SPLIT_UNIT} tokens up to {@linkcode SHORT_SPLIT_CONTEXT} tokens.
 */
export const SMALL_BATCH_SPLIT = 16;

/** Contexts up to which a scratch holds partitions of {@linkcode SPLIT_UNIT} tokens. */
export const SHORT_SPLIT_CONTEXT = 2048;

/**
 * Contexts up to which a scratch also holds partitions of 64 tokens for any number of sequences
 * (where one binding holds them): the context the engine measures its split choices at
 * (engine/kernel_tuning.ts), past which a measured choice keeps its number of partitions
 * (kernels/decode_split.ts), so a large batch measured there can split too.
 */
export const LARGE_BATCH_CONTEXT = 1024;

/**
 * Scratch of the split-K path: room for `pairs` (sequence, partition) partials, at least
 * `maxNumSeqs` sequences of `maxPartitions` partitions of the kernel's `partitionSize` (and, for
 * up to {@linkcode SMALL_BATCH_SPLIT} sequences, short partitions; for any number, where one
 * binding holds them, 64-token partitions up to {@linkcode LARGE_BATCH_CONTEXT}). A step of `n`
 * sequences lays them out with a stride of `floor(pairs / n)` partitions per sequence:
 * - `partOut` f32 `[n, numQHeads, stride, headDim]` (unnormalised outputs),
 * - `partMl` f32 `[n, numQHeads, stride, 2]` (running max, sum).
 * Ops run one after another, so every layer can share one scratch.
 */
export class PagedAttentionScratch {
  constructor(
    readonly partOut: GPUBuffer,
    readonly partMl: GPUBuffer,
    readonly maxNumSeqs: number,
    readonly maxPartitions: number,
    readonly partitionSize: number,
    readonly pairs: number = maxNumSeqs * maxPartitions,
  ) {}

  /** Partitions each of `numSeqs` sequences may have in one step (the layout's stride). */
  partitionsPerSeq(numSeqs: number): number {
    return Math.floor(this.pairs / Math.max(1, numSeqs));
  }

  /** Releases both buffers. */
  destroy(): void {
    this.partOut.destroy();
    this.partMl.destroy();
  }
}

/** One decode attention call site (one layer). */
export class PagedAttentionDecodeOp {
  /** The bound pipelines at each width run so far (the default's from the start). */
  readonly #sites = new Map<number, DecodeSites>();

  constructor(
    private readonly kernel: PagedAttentionDecode,
    /** Binds the kernel (and its fused variant, when bound with rope inputs) at a width. */
    private readonly sitesAt: (width: number) => DecodeSites,
    private readonly merge: { pipeline: GPUComputePipeline; group: GPUBindGroup },
    private readonly slots: { decode: ParamSlot; merge: ParamSlot },
    private readonly scratch: PagedAttentionScratch,
    /** The block-table row stride bound (the most entries a row of the buffer holds). */
    private readonly maxBtStride: number,
  ) {
    this.#sites.set(DEFAULT_DECODE_WIDTH, sitesAt(DEFAULT_DECODE_WIDTH));
  }

  /** Whether {@linkcode encode} can run the fused variant (RoPE and the K/V write included). */
  get fusesRope(): boolean {
    return this.#sites.get(DEFAULT_DECODE_WIDTH)!.fused !== null;
  }

  /** The bound pipelines at `width`, bound on first use. */
  #at(width: number): DecodeSites {
    let sites = this.#sites.get(width);
    if (sites === undefined) {
      sites = this.sitesAt(width);
      this.#sites.set(width, sites);
    }
    return sites;
  }

  /**
   * Sets the block-table layout of the next encodes: rows `stride` entries apart (a step's
   * tables packed at its longest, not the bound maximum), or 0 (`INDEXED_ROWS`), rows found
   * through a header of one offset per sequence (kernels/block_table_stride.ts).
   *
   * @throws {RangeError} when `stride` is neither 0 nor an integer in [1, the bound stride].
   */
  setBlockTableStride(stride: number): void {
    this.slots.decode.setU32(3, checkBlockTableStride(stride, this.maxBtStride));
  }

  /**
   * The partition size {@linkcode encode} splits `numSeqs` sequences of at most `maxContextLen`
   * tokens into by default, or 0 for the direct path: the kernel's measured split choices when
   * set (kernels/decode_split.ts), else partitions of `partitionSize` above `splitThreshold`
   * tokens; 0 when the partitions would not fit the scratch.
   */
  splitPartition(numSeqs: number, maxContextLen: number): number {
    return this.choice(numSeqs, maxContextLen).partition;
  }

  /**
   * {@linkcode splitPartition} and the workgroup width {@linkcode encode} runs by default: the
   * measured choice's (kernels/decode_split.ts `decodeChoiceFor`; its width also when its
   * partitions do not fit the scratch), else the default width.
   */
  choice(numSeqs: number, maxContextLen: number): { partition: number; width: number } {
    const k = this.kernel;
    const measured = k.splitTuning !== null
      ? decodeChoiceFor(k.splitTuning, numSeqs, maxContextLen)
      : null;
    const size = measured !== null
      ? measured.partition
      : maxContextLen > k.splitThreshold
      ? k.partitionSize
      : 0;
    const fits = Math.ceil(maxContextLen / size) <= this.scratch.partitionsPerSeq(numSeqs);
    return {
      partition: size > 0 && fits ? size : 0,
      width: measured?.width ?? DEFAULT_DECODE_WIDTH,
    };
  }

  /** Whether {@linkcode encode} takes the split-K path for this longest context by default. */
  usesSplit(maxContextLen: number, numSeqs = 1): boolean {
    return this.splitPartition(numSeqs, maxContextLen) > 0;
  }

  /**
   * Encodes attention of the first `numSeqs` sequences, whose longest context is
   * `maxContextLen` tokens (the host knows it; it sizes the split-K grid). `split` forces the
   * path: `false` direct, `true` split-K with the kernel's `partitionSize`, a number split-K
   * with partitions of that many tokens (a multiple of {@linkcode SPLIT_UNIT}); by default
   * {@linkcode splitPartition} decides.
   *
   * With `fused` the fused variant runs: it first norms and rotates the queries and writes each
   * sequence's new K and V (what `rope_and_cache` does for an all-decode step). `width` forces the
   * workgroup width (one of the kernel's `widths`); by default the measured choice's when `split`
   * is not forced, else the default width.
   *
   * @returns whether the split-K path was encoded.
   * @throws {RangeError} when `numSeqs` or the partitions exceed the scratch (split-K only) or
   * the grid limit, a forced partition size is not a positive multiple of
   *   {@linkcode SPLIT_UNIT}, `fused` is asked of an op without the fused variant, or the
   *   kernel does not run `width`.
   */
  encode(
    pass: GPUComputePassEncoder,
    numSeqs: number,
    maxContextLen: number,
    split?: boolean | number,
    fused = false,
    width?: number,
  ): boolean {
    if (fused && !this.fusesRope) {
      throw new RangeError("Cannot encode fused paged attention: the op was bound without it");
    }
    if (numSeqs <= 0) return false;
    if (numSeqs > MAX_GROUPS_PER_DIM) {
      throw new RangeError(
        `Cannot encode paged attention: ${numSeqs} sequences exceed ${MAX_GROUPS_PER_DIM}`,
      );
    }
    const kernel = this.kernel;
    const chosen = split === undefined ? this.choice(numSeqs, maxContextLen) : null;
    const sites = this.#at(width ?? chosen?.width ?? DEFAULT_DECODE_WIDTH);
    const decode = fused ? sites.fused! : sites.decode;
    const size = split === undefined
      ? chosen!.partition
      : split === true
      ? kernel.partitionSize
      : split === false
      ? 0
      : split;
    if (size > 0) {
      if (!Number.isInteger(size) || size % SPLIT_UNIT !== 0) {
        throw new RangeError(
          `Cannot encode split-K paged attention: partitions of ${size} tokens ` +
            `(a multiple of ${SPLIT_UNIT})`,
        );
      }
      const parts = Math.max(1, Math.ceil(maxContextLen / size));
      const stride = this.scratch.partitionsPerSeq(numSeqs);
      if (parts > stride || numSeqs > this.scratch.maxNumSeqs) {
        throw new RangeError(
          `Cannot encode split-K paged attention: ${numSeqs} sequences x ${parts} partitions ` +
            `exceed the scratch (${this.scratch.maxNumSeqs} sequences, ${this.scratch.pairs} ` +
            `partials)`,
        );
      }
      this.slots.decode.setU32(5, size, stride, 1);
      this.slots.merge.setU32(0, numSeqs).setU32(3, size, stride);
      pass.setPipeline(decode.pipeline);
      pass.setBindGroup(0, decode.group);
      pass.dispatchWorkgroups(parts, kernel.numKvHeads, numSeqs);
      pass.setPipeline(this.merge.pipeline);
      pass.setBindGroup(0, this.merge.group);
      dispatch1d(pass, numSeqs * kernel.numQHeads);
    } else {
      this.slots.decode.setU32(5, 0xffffffff, this.scratch.maxPartitions, 0);
      pass.setPipeline(decode.pipeline);
      pass.setBindGroup(0, decode.group);
      pass.dispatchWorkgroups(1, kernel.numKvHeads, numSeqs);
    }
    // At most (every sequence at the longest context): q.K and p.V per query head and token,
    // each K and V row read once.
    const tokens = numSeqs * maxContextLen;
    noteWork(
      pass,
      4 * tokens * kernel.numQHeads * kernel.headDim,
      2 * tokens * kernel.numKvHeads * kernel.headDim * (kernel.dtype === "f16" ? 2 : 4),
    );
    return size > 0;
  }
}
