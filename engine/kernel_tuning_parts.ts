/**
 * The parts of the engine's kernel tuning (engine/kernel_tuning.ts): what each measures (the
 * matmul, the decode attention's split, the prefill attention kernel), how a cached choice is
 * checked, applied and described, and the cache key of each.
 *
 * @module
 */

import type { GpuContext } from "../gpu/context.ts";
import { MATMUL_SOURCES_DIGEST } from "../kernels/matmul_kernels.ts";
import { MATMUL_TUNER_REVISION, tuneMatmul } from "../kernels/matmul_tuner.ts";
import { describeTuning, type MatmulTuning, shapeKey } from "../kernels/matmul_tuning.ts";
import { parseMatmulTuning } from "../kernels/matmul_tuning_parse.ts";
import type { Matmul } from "../kernels/matmul.ts";
import {
  checkDecodeSplitTuning,
  type DecodeSplitTuning,
  describeDecodeSplit,
} from "../kernels/decode_split.ts";
import { tuneDecodeSplit } from "../kernels/decode_split_tuner.ts";
import {
  ATTENTION_SOURCES_DIGEST,
  type PagedAttentionDecode,
} from "../kernels/paged_attention_decode.ts";
import {
  type PagedAttentionPrefill,
  PREFILL_SOURCES_DIGEST,
} from "../kernels/paged_attention_prefill.ts";
import {
  describePrefillChoice,
  parsePrefillChoice,
  type PrefillChoice,
  prefillLengths,
  tunePrefillAttention,
} from "../kernels/prefill_attention_tuner.ts";
import { adapterKey } from "./kernel_tuning_cache.ts";
import type { KernelTuningMode } from "./kernel_tuning.ts";

/** The prefill attention kernels a model can run, and how to choose them for every layer. */
export interface PrefillTarget {
  /** The kernels (same shape; the first is the default). */
  readonly kernels: readonly PagedAttentionPrefill[];
  /** Makes every layer run a kernel by step length (`PagedAttentionPrefill.name`s). */
  useChoice(choice: PrefillChoice): void;
  /** New tokens of the longest sequence measured (shorter ones: `prefillLengths`). */
  readonly tokens: number;
  /** Tokens per KV block. */
  readonly blockSize: number;
}

/** Options of {@linkcode applyKernelTuning}. */
export interface KernelTuningOptions {
  readonly mode: KernelTuningMode;
  /** Largest decode batch (max_num_seqs). */
  readonly maxBatch: number;
  /** Rows of the prefill the tile is chosen at (capped by max_num_batched_tokens). */
  readonly prefillRows: number;
  /**
   * The decode attention kernel whose split is measured too, the context length to use and the
   * shorter ones measured beside it.
   */
  readonly attention?: {
    readonly kernel: PagedAttentionDecode;
    readonly contextLen: number;
    readonly shorterContexts?: readonly number[];
  };
  /** The prefill attention kernels to choose from (measured when there are several). */
  readonly prefill?: PrefillTarget;
  /** The cache file; default {@linkcode kernelTuningCachePath}. */
  readonly cachePath?: string;
  /** Start-up log, one line each. */
  readonly log?: (line: string) => void;
}

/**
 * The cache key of tuning `matmuls` on `ctx`: the adapter, Deno, the kernels' digest and the
 * tuner's revision, the measured row counts and every call-site shape with its count.
 */
export function kernelTuningKey(
  ctx: GpuContext,
  matmuls: readonly Matmul[],
  maxBatch: number,
  prefillRows: number,
): string {
  const shapes = new Map<string, number>();
  for (const m of matmuls) {
    for (const op of m.ops) {
      const k = shapeKey(op.shape);
      shapes.set(k, (shapes.get(k) ?? 0) + 1);
    }
  }
  const sites = [...shapes].sort(([a], [b]) => a.localeCompare(b)).map(([k, n]) => `${k}*${n}`);
  return [
    adapterKey(ctx),
    `deno ${Deno.version.deno}`,
    `kernels ${MATMUL_SOURCES_DIGEST} tuner ${MATMUL_TUNER_REVISION}`,
    `batch ${maxBatch} prefill ${prefillRows}`,
    sites.join(", "),
  ].join(" | ");
}

/**
 * One tuned choice: its part of the cache key, how to measure it, check it when read back,
 * apply it and describe it.
 */
export interface TuningPart<T> {
  readonly name: "matmul" | "decode" | "prefill";
  readonly key: string;
  measure(): Promise<
    { value: T; wallMs: number; method: string; failures: readonly string[]; report: unknown }
  >;
  /** @throws {TypeError} when `data` is not a valid choice. */
  check(data: unknown): T;
  apply(value: T): void;
  describe(value: T): string;
}

/** A tuner's report as a part's measurement: the choice `value`, and the report. */
function measurement<T>(
  value: T,
  r: { readonly wallMs: number; readonly method: string; readonly failures: readonly string[] },
) {
  return { value, wallMs: r.wallMs, method: r.method, failures: r.failures, report: r };
}

/** The parts tuned for these targets (the decode and prefill ones when given). */
export function tuningParts(
  ctx: GpuContext,
  matmuls: readonly Matmul[],
  options: KernelTuningOptions,
): TuningPart<unknown>[] {
  const parts: TuningPart<unknown>[] = [];
  const matmul: TuningPart<MatmulTuning> = {
    name: "matmul",
    key: kernelTuningKey(ctx, matmuls, options.maxBatch, options.prefillRows),
    async measure() {
      const r = await tuneMatmul(ctx, matmuls, {
        maxBatch: options.maxBatch,
        prefillRows: options.prefillRows,
      });
      return measurement(r.tuning, r);
    },
    check: parseMatmulTuning,
    apply: (t) => matmuls.forEach((m) => m.setTuning(t)),
    describe: describeTuning,
  };
  parts.push(matmul as TuningPart<unknown>);
  const a = options.attention;
  if (a !== undefined) {
    const k = a.kernel;
    const decode: TuningPart<DecodeSplitTuning> = {
      name: "decode",
      key: `attention ${k.variant} ${k.dtype} q${k.numQHeads} kv${k.numKvHeads} d${k.headDim} ` +
        `b${k.blockSize} ctx ${[...(a.shorterContexts ?? []), a.contextLen].join("/")} ` +
        // Every batch up to the largest is measured (up to 16 only before 2026-11-29).
        `batch ${options.maxBatch} digest ${ATTENTION_SOURCES_DIGEST}`,
      async measure() {
        const r = await tuneDecodeSplit(ctx, k, {
          maxBatch: options.maxBatch,
          contextLen: a.contextLen,
          ...(a.shorterContexts !== undefined ? { shorterContexts: a.shorterContexts } : {}),
        });
        return measurement(r.tuning, r);
      },
      check(data) {
        checkDecodeSplitTuning(data as DecodeSplitTuning, k.widths);
        return data as DecodeSplitTuning;
      },
      apply: (t) => k.setSplitTuning(t),
      describe: describeDecodeSplit,
    };
    parts.push(decode as TuningPart<unknown>);
  }
  const pre = options.prefill;
  if (pre !== undefined && pre.kernels.length > 1) {
    const names = pre.kernels.map((k) => k.name);
    const lengths = prefillLengths(pre.tokens);
    const prefill: TuningPart<PrefillChoice> = {
      name: "prefill",
      // The KV dtype in the key since fp8 caches came (2026-11-30): their kernels decode as they
      // read.
      key: `prefill ${pre.kernels[0]!.config.dtype} ${names.join("/")} tokens ${
        lengths.join("/")
      } digest ${PREFILL_SOURCES_DIGEST}`,
      async measure() {
        const reports = [];
        for (const tokens of lengths) {
          reports.push(
            await tunePrefillAttention(ctx, pre.kernels, { tokens, blockSize: pre.blockSize }),
          );
        }
        return {
          value: reports.map((r) => ({ tokens: r.tokens, name: r.name })),
          wallMs: reports.reduce((sum, r) => sum + r.wallMs, 0),
          method: reports[0]!.method,
          failures: reports.flatMap((r) => r.failures),
          report: reports,
        };
      },
      check: (data) => parsePrefillChoice(data, names, lengths),
      apply: (v) => pre.useChoice(v),
      describe: (v) => describePrefillChoice(v, names),
    };
    parts.push(prefill as TuningPart<unknown>);
  }
  return parts;
}
