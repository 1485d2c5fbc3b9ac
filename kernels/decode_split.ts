/**
 * Measured split-K choices of the decode attention (kernels/paged_attention_decode.ts), as plain
 * data: for each measured batch size, the partition size that was fastest at each measured
 * context length (0: the direct path, one workgroup per (sequence, kv head)). A small batch gives
 * the direct path few workgroups (8 for one Qwen3-0.6B sequence), so short partitions can fill a
 * GPU that the direct path leaves idle; kernels/decode_split_tuner.ts measures it.
 *
 * @module
 */

/**
 * Split-K partitions are multiples of this many tokens (any size works in the kernels, whose
 * loops stop at the partition's end; whole 16-token KV blocks keep a partition's reads aligned).
 */
export const SPLIT_UNIT = 16;

/**
 * Partition sizes (tokens) the tuner tries; 0 is the direct path. The short ones give a short
 * context at batch 1 more workgroups: one Qwen3-0.6B sequence of 150 tokens is 8 workgroups
 * direct, 24 in partitions of 64 tokens, 80 in partitions of 16.
 */
export const SPLIT_CANDIDATES: readonly number[] = [0, 16, 32, 64, 128, 256, 512];

/**
 * Invocations per workgroup of the `workgroup` decode kernel (kernels/paged_attention_decode.wgsl
 * WG, also its positions per tile): 64 by default; 256 gives a context of up to 256 tokens one
 * tile with 4x the invocations (the direct path of one Qwen3-0.6B sequence is 8 workgroups), where
 * short partitions reach more workgroups only through a merge dispatch. The tuner measures the
 * wider one for the direct path and partitions of at least {@linkcode WIDE_MIN_PARTITION} tokens.
 */
export const DECODE_WIDTHS: readonly number[] = [64, 256];

/** The default of {@linkcode DECODE_WIDTHS}. */
export const DEFAULT_DECODE_WIDTH = 64;

/** Shortest partition measured at a width above the default (a shorter one leaves most idle). */
export const WIDE_MIN_PARTITION = 128;

/** The split choices measured at one context length. */
export interface DecodeSplitChoice {
  /** Context length (tokens) the choices were measured at. */
  readonly contextLen: number;
  /**
   * Per measured batch size (as a decimal string key): the partition size to use, or 0 for the
   * direct path. Batches above the largest key take the direct path.
   */
  readonly partitionByBatch: Readonly<Record<string, number>>;
  /**
   * Per measured batch size (the keys of `partitionByBatch`): the workgroup width its choice was
   * measured at, one of {@linkcode DECODE_WIDTHS}; a batch not listed (or no table, as in
   * tunings measured before widths existed) runs {@linkcode DEFAULT_DECODE_WIDTH}.
   */
  readonly widthByBatch?: Readonly<Record<string, number>>;
}

/**
 * Measured split choices of one decode attention kernel on one adapter: at `contextLen` (the
 * longest context measured, followed past it too) and, optionally, at shorter contexts, where a
 * partition size measured at the longest one can be the wrong choice (at 150 tokens, 64-token
 * partitions are 3 per sequence, 16-token ones 10).
 */
export interface DecodeSplitTuning extends DecodeSplitChoice {
  /**
   * Choices measured at shorter contexts, in ascending `contextLen` (each below the tuning's
   * own): a step whose longest context is at most one of them follows the shortest such.
   */
  readonly shorter?: readonly DecodeSplitChoice[];
}

/**
 * The partition size `tuning` gives `numSeqs` sequences of at most `maxContextLen` tokens, from
 * the choices measured at the shortest context >= `maxContextLen` (the longest measured past
 * them all): the entry of the smallest measured batch >= `numSeqs` (0 past the largest), and 0
 * when the context fits one partition (splitting it would only add the merge). Past the longest
 * measured context the partitions grow so that their number stays the measured one (rounded up
 * to {@linkcode SPLIT_UNIT} tokens): 16-token partitions measured at 1,024 tokens are 64 of 128
 * tokens at 8,192, not 512 partials for the merge to walk.
 */
export function splitPartitionFor(
  tuning: DecodeSplitTuning,
  numSeqs: number,
  maxContextLen: number,
): number {
  return decodeChoiceFor(tuning, numSeqs, maxContextLen).partition;
}

/**
 * The partition size (as {@linkcode splitPartitionFor}) and the workgroup width (one of
 * {@linkcode DECODE_WIDTHS}) `tuning` gives `numSeqs` sequences of at most `maxContextLen`
 * tokens: both from the same measured entry (the default width past the largest batch).
 */
export function decodeChoiceFor(
  tuning: DecodeSplitTuning,
  numSeqs: number,
  maxContextLen: number,
): { readonly partition: number; readonly width: number } {
  const choice = tuning.shorter?.find((c) => maxContextLen <= c.contextLen) ?? tuning;
  let best: number | undefined;
  let bestBatch = Infinity;
  for (const [key, size] of Object.entries(choice.partitionByBatch)) {
    const batch = Number(key);
    if (batch >= numSeqs && batch < bestBatch) {
      best = size;
      bestBatch = batch;
    }
  }
  const width = best === undefined
    ? DEFAULT_DECODE_WIDTH
    : choice.widthByBatch?.[String(bestBatch)] ?? DEFAULT_DECODE_WIDTH;
  if (best === undefined || best <= 0 || maxContextLen <= best) return { partition: 0, width };
  if (maxContextLen <= choice.contextLen) return { partition: best, width };
  const parts = Math.ceil(choice.contextLen / best);
  return { partition: Math.ceil(maxContextLen / parts / SPLIT_UNIT) * SPLIT_UNIT, width };
}

/**
 * Checks `tuning` (e.g. read back from a cache file), its widths against `widths` (a kernel's,
 * default {@linkcode DECODE_WIDTHS}).
 *
 * @throws {TypeError} naming the first entry that is not a positive batch size mapped to 0 or a
 * positive multiple of {@linkcode SPLIT_UNIT}, a context length that is not a positive integer,
 * shorter contexts that are not an array ascending below the tuning's own, or a width that is not
 * one of `widths` or belongs to no measured batch.
 */
export function checkDecodeSplitTuning(
  tuning: DecodeSplitTuning,
  widths: readonly number[] = DECODE_WIDTHS,
): void {
  const t = tuning as Partial<DecodeSplitTuning> | null;
  checkChoice(t, widths);
  const shorter = t!.shorter;
  if (shorter === undefined) return;
  if (!Array.isArray(shorter)) {
    throw new TypeError("Invalid decode split tuning: shorter must be an array");
  }
  let previous = 0;
  for (const c of shorter as Partial<DecodeSplitChoice>[]) {
    checkChoice(c, widths);
    if (c.contextLen! <= previous || c.contextLen! >= t!.contextLen!) {
      throw new TypeError(
        `Invalid decode split tuning: shorter context ${c.contextLen} is not ascending below ` +
          `${t!.contextLen}`,
      );
    }
    previous = c.contextLen!;
  }
}

/** {@linkcode checkDecodeSplitTuning} for one context's choices. */
function checkChoice(
  t: Partial<DecodeSplitChoice> | null | undefined,
  widths: readonly number[],
): void {
  if (!Number.isInteger(t?.contextLen) || t!.contextLen! < 1) {
    throw new TypeError(
      `Invalid decode split tuning: contextLen ${JSON.stringify(t?.contextLen)} is not positive`,
    );
  }
  const table = t!.partitionByBatch;
  if (typeof table !== "object" || table === null || Array.isArray(table)) {
    throw new TypeError("Invalid decode split tuning: partitionByBatch must be an object");
  }
  for (const [key, size] of Object.entries(table)) {
    const batch = Number(key);
    if (!Number.isInteger(batch) || batch < 1 || String(batch) !== key) {
      throw new TypeError(`Invalid decode split tuning: batch "${key}" is not a positive integer`);
    }
    if (!Number.isInteger(size) || size < 0 || size % SPLIT_UNIT !== 0) {
      throw new TypeError(
        `Invalid decode split tuning: batch ${key} has partition size ${
          JSON.stringify(size)
        } (0 or a multiple of ${SPLIT_UNIT})`,
      );
    }
  }
  const byBatch = t!.widthByBatch;
  if (byBatch === undefined) return;
  if (typeof byBatch !== "object" || byBatch === null || Array.isArray(byBatch)) {
    throw new TypeError("Invalid decode split tuning: widthByBatch must be an object");
  }
  for (const [key, width] of Object.entries(byBatch)) {
    if (!(key in table)) {
      throw new TypeError(`Invalid decode split tuning: width of batch "${key}" has no partition`);
    }
    if (!widths.includes(width)) {
      throw new TypeError(
        `Invalid decode split tuning: batch ${key} has width ${JSON.stringify(width)} (one of ${
          widths.join(", ")
        })`,
      );
    }
  }
}

/**
 * One line, e.g. "decode attention split at 1024 tokens: batch 1 x 64, 2 x 128, 4 direct", with
 * the shorter contexts first ("at 128 tokens: batch 1 x 16, 2 direct; at 1024 tokens: ..."); a
 * width other than the default follows its entry ("1 direct w256").
 */
export function describeDecodeSplit(t: DecodeSplitTuning): string {
  const one = (c: DecodeSplitChoice) => {
    const rows = Object.entries(c.partitionByBatch)
      .sort(([a], [b]) => Number(a) - Number(b))
      .map(([batch, size]) => {
        const width = c.widthByBatch?.[batch] ?? DEFAULT_DECODE_WIDTH;
        const w = width === DEFAULT_DECODE_WIDTH ? "" : ` w${width}`;
        return `${batch} ${size > 0 ? `x ${size}` : "direct"}${w}`;
      });
    return `at ${c.contextLen} tokens: batch ${rows.join(", ")}`;
  };
  return `decode attention split ${[...(t.shorter ?? []), t].map(one).join("; ")}`;
}
