/**
 * Measures the decode attention's split-K choice on this adapter (kernels/decode_split.ts): for
 * batch sizes 1, 2, 4, ... up to `maxBatch`, the direct path and partitions of each of
 * {@linkcode SPLIT_CANDIDATES} tokens that fit the kernel's scratch (16 and 32 tokens up to 16
 * sequences, kernels/paged_attention_decode_op.ts; 64 and more beyond), each at the default
 * workgroup width, and at every wider width the kernel runs (`widths`, kernels/decode_split.ts
 * DECODE_WIDTHS) the direct path and partitions of at least {@linkcode WIDE_MIN_PARTITION}
 * tokens; at one context length and at the shorter ones asked for (every sequence of a batch at that length), on buffers of the
 * kernel's shape made here (zero queries and KV: the time does not depend on the values). A
 * kernel with the fused variant (`rope`) is measured in it, as all-decode steps run it: q/k
 * norms, RoPE and each sequence's K/V write into its last position's slot included. Each
 * time is the median of several passes timed on the GPU (gpu/timer.ts; the candidates of one
 * batch size and context in one submission, `PassClock.medianMsEach`); the fastest per batch
 * size wins.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../gpu/context.ts";
import { kvBytesPerElement } from "../gpu/dtype.ts";
import { ParamArena } from "../gpu/params.ts";
import { PassClock } from "../gpu/timer.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import {
  type DecodeSplitChoice,
  type DecodeSplitTuning,
  DEFAULT_DECODE_WIDTH,
  SPLIT_CANDIDATES,
  WIDE_MIN_PARTITION,
} from "./decode_split.ts";
import type { PagedAttentionDecode } from "./paged_attention_decode.ts";

/** Options of {@linkcode tuneDecodeSplit}. */
export interface DecodeSplitTunerOptions {
  /** The largest decode batch. */
  readonly maxBatch: number;
  /** Context length of every sequence, in tokens: the longest measured. */
  readonly contextLen: number;
  /**
   * Shorter context lengths measured too (those not below `contextLen` are dropped); default
   * none.
   */
  readonly shorterContexts?: readonly number[];
  /** Timed passes per measurement; default 5. */
  readonly repeats?: number;
  /** Most bytes of K and V cache allocated; sequences share blocks past it. Default 64 MiB (each). */
  readonly maxCacheBytes?: number;
}

/** What {@linkcode tuneDecodeSplit} measured and chose. */
export interface DecodeSplitReport {
  readonly tuning: DecodeSplitTuning;
  /**
   * Per batch size: each tried partition size (0: direct), its workgroup width and its median
   * time in ms, at `tuning.contextLen`.
   */
  readonly points: SplitPoints;
  /** The same per shorter context length measured (as a decimal string key). */
  readonly shorterPoints: Readonly<Record<string, SplitPoints>>;
  readonly method: string;
  /** The GPU errors of the candidates the adapter could not run (measured as Infinity). */
  readonly failures: readonly string[];
  readonly wallMs: number;
}

/**
 * Per batch size (a decimal string key): each tried partition size, workgroup width and median
 * time, ms.
 */
export type SplitPoints = Readonly<
  Record<string, readonly { size: number; width: number; ms: number }[]>
>;

/** The (partition size, width) pairs measured for a kernel running `widths`, the default first. */
export function splitCandidates(
  widths: readonly number[],
): readonly { size: number; width: number }[] {
  return widths.flatMap((width) =>
    SPLIT_CANDIDATES.filter((size) =>
      width === DEFAULT_DECODE_WIDTH || size === 0 || size >= WIDE_MIN_PARTITION
    ).map((size) => ({ size, width }))
  );
}

/** Batch sizes measured: 1, 2, 4, ... below `maxBatch`, then `maxBatch`. */
export function splitBatches(maxBatch: number): number[] {
  const out: number[] = [];
  for (let b = 1; b < maxBatch; b *= 2) out.push(b);
  out.push(maxBatch);
  return out;
}

/**
 * Measures the split choice of `kernel` (see the module documentation).
 *
 * @throws {RangeError} when `maxBatch`, `contextLen` or a shorter context is not a positive
 *   integer.
 */
export async function tuneDecodeSplit(
  ctx: GpuContext,
  kernel: PagedAttentionDecode,
  options: DecodeSplitTunerOptions,
): Promise<DecodeSplitReport> {
  const t0 = performance.now();
  const { maxBatch, contextLen: L } = options;
  const shorterContexts = options.shorterContexts ?? [];
  if (![maxBatch, L, ...shorterContexts].every((n) => Number.isInteger(n) && n >= 1)) {
    throw new RangeError(
      `Cannot tune decode attention: maxBatch ${maxBatch}, contextLen ${L} and shorter ` +
        `contexts [${shorterContexts.join(", ")}] must be positive integers`,
    );
  }
  const contexts = [...new Set(shorterContexts.filter((c) => c < L))].sort((a, b) => a - b);
  const batches = splitBatches(maxBatch);
  const B = batches.at(-1)!;
  const { numQHeads: hq, numKvHeads: hkv, headDim: D, blockSize: bs } = kernel;
  const perSeq = Math.ceil(L / bs);
  const blockBytes = hkv * bs * D * kvBytesPerElement(kernel.dtype);
  const budget = Math.min(options.maxCacheBytes ?? 64 * 2 ** 20, ctx.maxBindingBytes);
  // Distinct blocks per sequence while they fit the budget; past it sequences share them.
  const numBlocks = Math.max(perSeq, Math.min(B * perSeq, Math.floor(budget / blockBytes)));
  const tables = Uint32Array.from({ length: B * perSeq }, (_, i) => i % numBlocks);
  const own: { destroy(): void }[] = [];
  const buffer = (label: string, bytes: number) => {
    const b = ctx.createBuffer(`decode_split_tuner/${label}`, Math.max(16, bytes), STORAGE_RW);
    own.push(b);
    return { buffer: b };
  };
  try {
    const blockTables = buffer("block_tables", tables.byteLength);
    ctx.device.queue.writeBuffer(blockTables.buffer, 0, tables);
    const contextLens = buffer("context_lens", 4 * B);
    const scratch = kernel.createScratch(B, L);
    own.push(scratch);
    // Two slots (attention and merge) per candidate: those of one batch size are timed together
    // (PassClock.medianMsEach), so each candidate has a call site of its own.
    const candidates = splitCandidates(kernel.widths);
    const arena = new ParamArena(ctx, 2 * candidates.length, "decode-split-tuning");
    own.push(arena);
    // The fused variant reads k and v from each sequence's fused [q | k | v] row, and writes
    // them to the slot of its last position.
    const fused = kernel.rope !== null;
    const qStride = (fused ? hq + 2 * hkv : hq) * D;
    const slotMapping = buffer("slot_mapping", 4 * B);
    /** Every sequence at `len` tokens: its length and (fused) its last position's slot. */
    const setContext = (len: number) => {
      ctx.device.queue.writeBuffer(contextLens.buffer, 0, new Uint32Array(B).fill(len));
      const slots = Uint32Array.from(
        { length: B },
        (_, s) => tables[s * perSeq + Math.floor((len - 1) / bs)]! * bs + ((len - 1) % bs),
      );
      ctx.device.queue.writeBuffer(slotMapping.buffer, 0, slots);
    };
    const rope = () => {
      const normDtype = kernel.rope!.normDtype;
      const norm = (label: string) => {
        const w = GpuMatrix.create(ctx, label, 1, D, normDtype!);
        own.push(w);
        return w;
      };
      return {
        positions: contextLens,
        invFreq: buffer("inv_freq", 2 * D),
        slotMapping,
        ...(normDtype === null ? {} : { qkNorm: { q: norm("q_norm"), k: norm("k_norm") } }),
      };
    };
    const bound = {
      q: buffer("q", 4 * B * qStride),
      kCache: buffer("k", numBlocks * blockBytes),
      vCache: buffer("v", numBlocks * blockBytes),
      blockTables,
      contextLens,
      out: buffer("out", 4 * B * hq * D),
      scratch,
      ...(fused ? { rope: rope() } : {}),
    };
    const ops = candidates.map(() => kernel.bind(arena, bound, { qStride, btStride: perSeq }));
    const clock = new PassClock(ctx, arena, options.repeats);
    /** The points and choices at `len` tokens. */
    const measureAt = async (len: number) => {
      setContext(len);
      const points: Record<string, { size: number; width: number; ms: number }[]> = {};
      const partitionByBatch: Record<string, number> = {};
      const widthByBatch: Record<string, number> = {};
      for (const b of batches) {
        const tries = candidates.flatMap((c, i) =>
          c.size === 0 || (c.size < len && Math.ceil(len / c.size) <= scratch.partitionsPerSeq(b))
            ? [{ ...c, op: ops[i]! }]
            : []
        );
        const times = await clock.medianMsEach(tries.map(({ size, width, op }) => () => {
          const split = size === 0 ? false : size;
          return (pass) => op.encode(pass, b, len, split, fused, width);
        }));
        const tried = tries.map(({ size, width }, i) => ({ size, width, ms: times[i]! }));
        points[b] = tried;
        const best = tried.reduce((best, p) => (p.ms < best.ms ? p : best));
        partitionByBatch[b] = best.size;
        if (best.width !== DEFAULT_DECODE_WIDTH) widthByBatch[b] = best.width;
      }
      const choice: DecodeSplitChoice = Object.keys(widthByBatch).length > 0
        ? { contextLen: len, partitionByBatch, widthByBatch }
        : { contextLen: len, partitionByBatch };
      return { points, choice };
    };
    const shorterPoints: Record<string, SplitPoints> = {};
    const shorter: DecodeSplitChoice[] = [];
    for (const len of contexts) {
      const m = await measureAt(len);
      shorterPoints[len] = m.points;
      shorter.push(m.choice);
    }
    const { points, choice } = await measureAt(L);
    ctx.check();
    return {
      tuning: shorter.length > 0 ? { ...choice, shorter } : choice,
      points,
      shorterPoints,
      method: clock.method,
      failures: clock.failures,
      wallMs: performance.now() - t0,
    };
  } finally {
    for (const o of own) o.destroy();
  }
}
