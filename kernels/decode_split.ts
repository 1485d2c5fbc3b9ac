/**
 * Measured split-K choices of the decode attention (kernels/paged_attention_decode.ts), as plain
 * data: for each measured batch size, the partition size that was fastest at the measured
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

/** Measured split choices of one decode attention kernel on one adapter. */
export interface DecodeSplitTuning {
  /** Context length (tokens) the choices were measured at. */
  readonly contextLen: number;
  /**
   * Per measured batch size (as a decimal string key): the partition size to use, or 0 for the
   * direct path. Batches above the largest key take the direct path.
   */
  readonly partitionByBatch: Readonly<Record<string, number>>;
}

/**
 * The partition size `tuning` gives `numSeqs` sequences of at most `maxContextLen` tokens: the
 * entry of the smallest measured batch >= `numSeqs` (0 past the largest), and 0 when the context
 * fits one partition (splitting it would only add the merge). Past the measured context the
 * partitions grow so that their number stays the measured one (rounded up to
 * {@linkcode SPLIT_UNIT} tokens): 16-token partitions measured at 1,024 tokens are 64 of 128
 * tokens at 8,192, not 512 partials for the merge to walk.
 */
export function splitPartitionFor(
  tuning: DecodeSplitTuning,
  numSeqs: number,
  maxContextLen: number,
): number {
  let best: number | undefined;
  let bestBatch = Infinity;
  for (const [key, size] of Object.entries(tuning.partitionByBatch)) {
    const batch = Number(key);
    if (batch >= numSeqs && batch < bestBatch) {
      best = size;
      bestBatch = batch;
    }
  }
  if (best === undefined || best <= 0 || maxContextLen <= best) return 0;
  if (maxContextLen <= tuning.contextLen) return best;
  const parts = Math.ceil(tuning.contextLen / best);
  return Math.ceil(maxContextLen / parts / SPLIT_UNIT) * SPLIT_UNIT;
}

/**
 * Checks `tuning` (e.g. read back from a cache file).
 *
 * @throws {TypeError} naming the first entry that is not a positive batch size mapped to 0 or a
 * positive multiple of {@linkcode SPLIT_UNIT}, or a context length that is not a positive integer.
 */
export function checkDecodeSplitTuning(tuning: DecodeSplitTuning): void {
  const t = tuning as Partial<DecodeSplitTuning> | null;
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
}

/** One line, e.g. "split at 1024 tokens: batch 1 x 64, 2 x 128, 4 direct". */
export function describeDecodeSplit(t: DecodeSplitTuning): string {
  const rows = Object.entries(t.partitionByBatch)
    .sort(([a], [b]) => Number(a) - Number(b))
    .map(([batch, size]) => `${batch} ${size > 0 ? `x ${size}` : "direct"}`);
  return `decode attention split at ${t.contextLen} tokens: batch ${rows.join(", ")}`;
}
