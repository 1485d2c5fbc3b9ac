/**
 * The engine's kernel tuning (`--kernel-tuning auto|measure|off`): under the `gpu` kernel profile,
 * the matmul tile and the `gemv` / `tiled` choice per call-site shape (kernels/matmul_tuner.ts),
 * the decode attention's split-K partition size per small batch (kernels/decode_split_tuner.ts)
 * and the prefill attention kernel per prompt length (kernels/prefill_attention_tuner.ts) are
 * measured on the adapter once the model is loaded, and kept in a cache file
 * (engine/kernel_tuning_cache.ts) keyed by the adapter, Deno, the kernels' sources and the model's
 * shapes, so the next start on the same machine reads them back instead of measuring again.
 *
 * - `auto` (default): the cached tuning, else measure and cache it; on a software adapter
 *   (lavapipe: no speed target for the gpu profile, and measuring prefill tiles there takes
 *   long) the cached tuning, else the defaults.
 * - `measure`: measure now (also on a software adapter) and refresh the cache.
 * - `off`: the defaults (kernels/matmul_tile.ts `TILE`, `gemv` up to 16 rows).
 *
 * The environment variable `WEBGPU_LLM_KERNEL_TUNING` (one of the modes) replaces `auto`, as
 * `WEBGPU_LLM_KERNEL_PROFILE` does for the kernel profile (e.g. `off` for a test run on a GPU).
 *
 * A cache that cannot be read or written is logged and otherwise ignored. A candidate kernel the
 * adapter cannot run (its pipeline fails to compile there) is measured inside GPU error scopes
 * as Infinity, skipped and logged (gpu/timer.ts `PassClock`); a part that cannot be measured at
 * all keeps its defaults, and nothing is cached that start.
 *
 * @module
 */

import type { GpuContext } from "../gpu/context.ts";
import type { MatmulTuningReport } from "../kernels/matmul_tuner.ts";
import type { MatmulTuning } from "../kernels/matmul_tuning.ts";
import type { Matmul } from "../kernels/matmul.ts";
import type { ModelRunner } from "./model_runner.ts";
import type { DecodeSplitTuning } from "../kernels/decode_split.ts";
import type { DecodeSplitReport } from "../kernels/decode_split_tuner.ts";
import type { PrefillAttentionReport, PrefillChoice } from "../kernels/prefill_attention_tuner.ts";
import {
  envGet,
  kernelTuningCachePath,
  readTuningCache,
  type TuningCacheFile,
  writeTuningCache,
} from "./kernel_tuning_cache.ts";
import {
  kernelTuningKey,
  type KernelTuningOptions,
  type PrefillTarget,
  tuningParts,
} from "./kernel_tuning_parts.ts";

export { cachedTunings, kernelTuningCachePath } from "./kernel_tuning_cache.ts";
export { kernelTuningKey, type KernelTuningOptions, type PrefillTarget };

/** The accepted values of `--kernel-tuning`. */
export const KERNEL_TUNING_MODES = ["auto", "measure", "off"] as const;

/** How the engine chooses the matmul tuning (see the module documentation). */
export type KernelTuningMode = typeof KERNEL_TUNING_MODES[number];

/** The environment variable that replaces the `auto` mode. */
export const KERNEL_TUNING_ENV = "WEBGPU_LLM_KERNEL_TUNING";

/**
 * The mode in effect: `mode`, or for `auto` the environment's {@linkcode KERNEL_TUNING_ENV}.
 *
 * @throws {TypeError} when the environment variable is set to something else than a mode.
 */
export function effectiveTuningMode(
  mode: KernelTuningMode,
  env: (name: string) => string | undefined = envGet,
): { mode: KernelTuningMode; why: string } {
  const value = env(KERNEL_TUNING_ENV);
  if (mode !== "auto" || value === undefined || value === "") return { mode, why: "" };
  const chosen = KERNEL_TUNING_MODES.find((m) => m === value);
  if (chosen === undefined) {
    throw new TypeError(
      `${KERNEL_TUNING_ENV} must be one of ${KERNEL_TUNING_MODES.join(", ")}, got "${value}"`,
    );
  }
  return { mode: chosen, why: ` (${KERNEL_TUNING_ENV}=${chosen})` };
}

/** What {@linkcode applyKernelTuning} did. */
export interface KernelTuningOutcome {
  /** The matmul tuning now followed, or null (defaults: off, the cpu profile, a software adapter). */
  readonly tuning: MatmulTuning | null;
  /** The decode attention's split choices now followed, or null (its default rule). */
  readonly attention: DecodeSplitTuning | null;
  /** The prefill attention kernels now run by step length, or null (the default one). */
  readonly prefill: PrefillChoice | null;
  /** "measured", "cached" or why nothing was tuned. */
  readonly source: string;
  /** The matmul measurement, when one ran. */
  readonly report?: MatmulTuningReport;
  /** The decode attention's measurement, when one ran. */
  readonly attentionReport?: DecodeSplitReport;
  /** The prefill attention's measurements (one per measured length), when they ran. */
  readonly prefillReports?: readonly PrefillAttentionReport[];
}

/**
 * Chooses the kernel tuning by `options.mode`: the matmul's (`matmuls` must hold every call
 * site, bound) and, when given, the decode attention's split and the prefill attention kernel;
 * applies it and logs what was chosen. Measuring overwrites the call sites' outputs: run it
 * before the first step.
 */
export async function applyKernelTuning(
  ctx: GpuContext,
  matmuls: readonly Matmul[],
  options: KernelTuningOptions,
): Promise<KernelTuningOutcome> {
  const log = options.log ?? (() => {});
  const none = { tuning: null, attention: null, prefill: null };
  const skip = (source: string): KernelTuningOutcome => {
    log(`Kernel tuning: none (${source})`);
    return { ...none, source };
  };
  const { mode, why } = effectiveTuningMode(options.mode);
  if (mode === "off") return skip(`--kernel-tuning off${why}: default tile and gemv rows`);
  if (ctx.profile !== "gpu") return skip("the cpu kernel profile has no tuned choices");
  const used = matmuls.filter((m) => m.ops.length > 0);
  const parts = tuningParts(ctx, used, options);
  const key = parts.map((p) => p.key).join(" | ");
  const path = options.cachePath ?? kernelTuningCachePath();
  let cache: TuningCacheFile = { version: 2, entries: {} };
  try {
    cache = await readTuningCache(path);
  } catch (error) {
    log(`Kernel tuning: cache ${path} ignored (${messageOf(error)})`);
  }
  const outcome = (values: Map<string, unknown>) => ({
    tuning: (values.get("matmul") ?? null) as MatmulTuning | null,
    attention: (values.get("decode") ?? null) as DecodeSplitTuning | null,
    prefill: (values.get("prefill") ?? null) as PrefillChoice | null,
  });
  const entry = cache.entries[key];
  if (mode === "auto" && entry !== undefined) {
    try {
      const values = new Map(parts.map((p) => {
        if (!(p.name in entry.parts)) throw new TypeError(`no ${p.name} choice in it`);
        return [p.name, p.check(entry.parts[p.name])] as const;
      }));
      for (const p of parts) {
        p.apply(values.get(p.name));
        log(
          `Kernel tuning: cached ${entry.measuredAt} (${path}): ${p.describe(values.get(p.name))}`,
        );
      }
      return { ...outcome(values), source: "cached" };
    } catch (error) {
      log(`Kernel tuning: cached entry ignored (${messageOf(error)})`);
    }
  }
  if (mode === "auto" && ctx.adapter.isFallback) {
    return skip("auto: software adapter, nothing cached; --kernel-tuning measure measures here");
  }
  // Measuring takes a while on a first start (tens of seconds on a GPU): say so before it starts.
  const reason = why !== ""
    ? why.trim().slice(1, -1)
    : mode === "measure"
    ? "--kernel-tuning measure"
    : "nothing cached";
  log(
    `Kernel tuning: measuring the ${parts.map((p) => p.name).join(", ")} choices on this ` +
      `adapter (${reason}); the result is cached in ${path}`,
  );
  const values = new Map<string, unknown>();
  const reports = new Map<string, unknown>();
  let method = "";
  let failed = false;
  for (const p of parts) {
    let m: Awaited<ReturnType<typeof p.measure>>;
    try {
      m = await p.measure();
    } catch (error) {
      // A part that cannot be measured here keeps its defaults; the others still apply.
      ctx.check();
      failed = true;
      log(`Kernel tuning: ${p.name} not measured (${messageOf(error)}); its defaults are kept`);
      continue;
    }
    p.apply(m.value);
    values.set(p.name, m.value);
    reports.set(p.name, m.report);
    method = m.method;
    log(
      `Kernel tuning: measured in ${(m.wallMs / 1000).toFixed(1)} s (${m.method})${why}: ` +
        p.describe(m.value),
    );
    if (m.failures.length > 0) {
      log(
        `Kernel tuning: ${m.failures.length} ${p.name} candidate(s) failed on this adapter ` +
          `and were skipped (first: ${m.failures[0]})`,
      );
    }
  }
  if (failed) return { ...outcome(values), source: "measured (partly; not cached)" };
  delete cache.entries[key];
  cache.entries[key] = {
    parts: Object.fromEntries(values),
    measuredAt: new Date().toISOString(),
    method,
  };
  try {
    await writeTuningCache(path, cache);
  } catch (error) {
    log(`Kernel tuning: cache ${path} not written (${messageOf(error)})`);
  }
  return {
    ...outcome(values),
    source: "measured",
    report: reports.get("matmul") as MatmulTuningReport,
    ...(reports.has("decode")
      ? { attentionReport: reports.get("decode") as DecodeSplitReport }
      : {}),
    ...(reports.has("prefill")
      ? { prefillReports: reports.get("prefill") as PrefillAttentionReport[] }
      : {}),
  };
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** Rows of X of the prefill the matmul tile is measured at (capped by the token budget). */
export const TUNING_PREFILL_ROWS = 512;
/** Context length the decode attention's split is measured at (capped by max_model_len). */
export const TUNING_CONTEXT_LEN = 1024;
/**
 * Shorter contexts the split is measured at too (those below the capped length): a partition
 * size fastest at 1,024 tokens leaves a 150-token batch-1 step 3 partitions of 64 tokens where 10
 * of 16 may be faster, or the other way round; each context is measured, not guessed.
 */
export const TUNING_SHORT_CONTEXTS: readonly number[] = [128, 256, 512];

/**
 * {@linkcode applyKernelTuning} for everything `runner` can tune, at its sizes: its matmuls up to
 * `max_num_seqs` rows, the decode attention's split, the prefill attention kernel.
 */
export function tuneRunner(
  runner: ModelRunner,
  mode: KernelTuningMode,
  log?: (line: string) => void,
): Promise<KernelTuningOutcome> {
  const o = runner.options;
  return applyKernelTuning(runner.ctx, runner.matmuls, {
    mode,
    maxBatch: o.maxSeqs,
    prefillRows: Math.min(TUNING_PREFILL_ROWS, o.maxTokens),
    attention: {
      kernel: runner.decodeAttention,
      contextLen: Math.min(TUNING_CONTEXT_LEN, o.maxModelLen),
      shorterContexts: TUNING_SHORT_CONTEXTS.filter((c) => c < o.maxModelLen),
    },
    prefill: {
      ...runner.prefillAttention,
      tokens: Math.min(TUNING_PREFILL_ROWS, o.maxTokens, o.maxModelLen),
      blockSize: o.blockSize,
    },
    ...(log !== undefined ? { log } : {}),
  });
}
