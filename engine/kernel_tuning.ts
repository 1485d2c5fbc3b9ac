/**
 * The engine's kernel tuning (`--kernel-tuning auto|measure|off`): under the `gpu` kernel profile,
 * the matmul tile and the `gemv` / `tiled` choice per call-site shape (kernels/matmul_tuner.ts),
 * and the decode attention's split-K partition size per small batch
 * (kernels/decode_split_tuner.ts), are measured on the adapter once the model is loaded, and kept in a cache file keyed by the
 * adapter, Deno, the matmul kernels' sources and the model's call sites, so the next start on
 * the same machine reads them back instead of measuring again.
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
 * The cache is `$WEBGPU_LLM_CACHE_DIR`, else `$XDG_CACHE_HOME/webgpu-llm`, else
 * `~/.cache/webgpu-llm`, file `matmul_tuning.json`. A cache that cannot be read or written is
 * logged and otherwise ignored.
 *
 * @module
 */

import { dirname, join } from "node:path";
import type { GpuContext } from "../gpu/context.ts";
import { MATMUL_SOURCES_DIGEST } from "../kernels/matmul_kernels.ts";
import { type MatmulTuningReport, tuneMatmul } from "../kernels/matmul_tuner.ts";
import {
  describeTuning,
  type MatmulTuning,
  parseMatmulTuning,
  shapeKey,
} from "../kernels/matmul_tuning.ts";
import type { Matmul } from "../kernels/matmul.ts";
import {
  checkDecodeSplitTuning,
  type DecodeSplitTuning,
  describeDecodeSplit,
} from "../kernels/decode_split.ts";
import { type DecodeSplitReport, tuneDecodeSplit } from "../kernels/decode_split_tuner.ts";
import {
  ATTENTION_SOURCES_DIGEST,
  type PagedAttentionDecode,
} from "../kernels/paged_attention_decode.ts";

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

/** Cache entries kept (the most recently written). */
const MAX_ENTRIES = 64;

/** What {@linkcode applyKernelTuning} did. */
export interface KernelTuningOutcome {
  /** The tuning now followed, or null (defaults: off, the cpu profile, a software adapter). */
  readonly tuning: MatmulTuning | null;
  /** The decode attention's split choices now followed, or null (its default rule). */
  readonly attention: DecodeSplitTuning | null;
  /** "measured", "cached" or why nothing was tuned. */
  readonly source: string;
  /** The measurement, when one ran. */
  readonly report?: MatmulTuningReport;
  /** The decode attention's measurement, when one ran. */
  readonly attentionReport?: DecodeSplitReport;
}

/** Options of {@linkcode applyKernelTuning}. */
export interface KernelTuningOptions {
  readonly mode: KernelTuningMode;
  /** Largest decode batch (max_num_seqs). */
  readonly maxBatch: number;
  /** Rows of the prefill the tile is chosen at (capped by max_num_batched_tokens). */
  readonly prefillRows: number;
  /** The decode attention kernel whose split is measured too, and the context length to use. */
  readonly attention?: { readonly kernel: PagedAttentionDecode; readonly contextLen: number };
  /** The cache file; default {@linkcode kernelTuningCachePath}. */
  readonly cachePath?: string;
  /** Start-up log, one line each. */
  readonly log?: (line: string) => void;
}

/** The cache file's path from the environment (see the module documentation). */
export function kernelTuningCachePath(
  env: (name: string) => string | undefined = envGet,
): string {
  const explicit = env("WEBGPU_LLM_CACHE_DIR");
  if (explicit) return join(explicit, "matmul_tuning.json");
  const xdg = env("XDG_CACHE_HOME");
  const home = env("HOME") ?? env("USERPROFILE") ?? ".";
  return join(xdg || join(home, ".cache"), "webgpu-llm", "matmul_tuning.json");
}

function envGet(name: string): string | undefined {
  try {
    return Deno.env.get(name);
  } catch {
    return undefined; // no --allow-env
  }
}

/** The part of a cache key naming the adapter. */
function adapterKey(ctx: GpuContext): string {
  const a = ctx.adapter;
  return `${a.vendor}/${a.architecture}/${a.device}/${a.description}`;
}

/**
 * How many tunings the cache at `path` holds for `ctx`'s adapter (any Deno, kernels or model),
 * and when the newest was measured (0 and "" without a file); null when the file is unreadable.
 */
export async function cachedTunings(
  ctx: GpuContext,
  path: string = kernelTuningCachePath(),
): Promise<{ entries: number; newest: string } | null> {
  try {
    const cache = await readCache(path);
    const mine = Object.entries(cache.entries).filter(([k]) =>
      k.startsWith(`${adapterKey(ctx)} |`)
    );
    const newest = mine.map(([, e]) => e.measuredAt).sort().at(-1) ?? "";
    return { entries: mine.length, newest };
  } catch {
    return null;
  }
}

/**
 * The cache key of tuning `matmuls` on `ctx`: the adapter, Deno, the kernels' digest, the
 * measured row counts and every call-site shape with its count.
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
    `kernels ${MATMUL_SOURCES_DIGEST}`,
    `batch ${maxBatch} prefill ${prefillRows}`,
    sites.join(", "),
  ].join(" | ");
}

interface CacheFile {
  version: 1;
  entries: Record<string, {
    tuning: MatmulTuning;
    attention?: DecodeSplitTuning;
    measuredAt: string;
    method: string;
  }>;
}

async function readCache(path: string): Promise<CacheFile> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return { version: 1, entries: {} };
    throw error;
  }
  const data = JSON.parse(text) as Partial<CacheFile>;
  if (data.version !== 1 || typeof data.entries !== "object" || data.entries === null) {
    throw new TypeError(`${path}: not a version 1 matmul tuning cache`);
  }
  return data as CacheFile;
}

async function writeCache(path: string, file: CacheFile): Promise<void> {
  const keys = Object.keys(file.entries);
  for (const k of keys.slice(0, Math.max(0, keys.length - MAX_ENTRIES))) delete file.entries[k];
  await Deno.mkdir(dirname(path), { recursive: true });
  const tmp = `${path}.${Deno.pid}.tmp`;
  await Deno.writeTextFile(tmp, JSON.stringify(file, null, 1) + "\n");
  await Deno.rename(tmp, path);
}

/**
 * Chooses the matmul tuning (and, with `options.attention`, the decode attention's split) by
 * `options.mode`, applies it to `matmuls` (which must hold every call site, bound) and the
 * attention kernel, and logs what was chosen. Measuring overwrites the call sites' outputs: run
 * it before the first step.
 */
export async function applyKernelTuning(
  ctx: GpuContext,
  matmuls: readonly Matmul[],
  options: KernelTuningOptions,
): Promise<KernelTuningOutcome> {
  const log = options.log ?? (() => {});
  const skip = (source: string): KernelTuningOutcome => {
    log(`Kernel tuning: none (${source})`);
    return { tuning: null, attention: null, source };
  };
  const { mode, why } = effectiveTuningMode(options.mode);
  if (mode === "off") return skip(`--kernel-tuning off${why}: default tile and gemv rows`);
  if (ctx.profile !== "gpu") return skip("the cpu kernel profile has no tuned choices");
  const used = matmuls.filter((m) => m.ops.length > 0);
  const attention = options.attention;
  const key = kernelTuningKey(ctx, used, options.maxBatch, options.prefillRows) +
    (attention === undefined ? "" : ` | ${attentionKey(attention.kernel, attention.contextLen)}`);
  const path = options.cachePath ?? kernelTuningCachePath();
  let cache: CacheFile = { version: 1, entries: {} };
  try {
    cache = await readCache(path);
  } catch (error) {
    log(`Kernel tuning: cache ${path} ignored (${messageOf(error)})`);
  }
  const entry = cache.entries[key];
  if (mode === "auto" && entry !== undefined) {
    try {
      const tuning = parseMatmulTuning(entry.tuning);
      const split = attention === undefined ? null : entry.attention ?? null;
      if (attention !== undefined && split === null) {
        throw new TypeError("no decode attention split in it");
      }
      if (split !== null) checkDecodeSplitTuning(split);
      for (const m of used) m.setTuning(tuning);
      attention?.kernel.setSplitTuning(split);
      log(`Kernel tuning: cached ${entry.measuredAt} (${path}): ${describeTuning(tuning)}`);
      if (split !== null) log(`Kernel tuning: cached ${describeDecodeSplit(split)}`);
      return { tuning, attention: split, source: "cached" };
    } catch (error) {
      log(`Kernel tuning: cached entry ignored (${messageOf(error)})`);
    }
  }
  if (mode === "auto" && ctx.adapter.isFallback) {
    return skip("auto: software adapter, nothing cached; --kernel-tuning measure measures here");
  }
  const report = await tuneMatmul(ctx, used, {
    maxBatch: options.maxBatch,
    prefillRows: options.prefillRows,
  });
  for (const m of used) m.setTuning(report.tuning);
  log(
    `Kernel tuning: measured in ${(report.wallMs / 1000).toFixed(1)} s (${report.method})${why}: ` +
      describeTuning(report.tuning),
  );
  let split: DecodeSplitReport | undefined;
  if (attention !== undefined) {
    split = await tuneDecodeSplit(ctx, attention.kernel, {
      maxBatch: options.maxBatch,
      contextLen: attention.contextLen,
    });
    attention.kernel.setSplitTuning(split.tuning);
    log(
      `Kernel tuning: measured in ${(split.wallMs / 1000).toFixed(1)} s: ` +
        describeDecodeSplit(split.tuning),
    );
  }
  delete cache.entries[key];
  cache.entries[key] = {
    tuning: report.tuning,
    ...(split !== undefined ? { attention: split.tuning } : {}),
    measuredAt: new Date().toISOString(),
    method: report.method,
  };
  try {
    await writeCache(path, cache);
  } catch (error) {
    log(`Kernel tuning: cache ${path} not written (${messageOf(error)})`);
  }
  return {
    tuning: report.tuning,
    attention: split?.tuning ?? null,
    source: "measured",
    report,
    ...(split !== undefined ? { attentionReport: split } : {}),
  };
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The decode attention's part of the cache key: its shape, kernel and context length. */
function attentionKey(k: PagedAttentionDecode, contextLen: number): string {
  return `attention ${k.variant} ${k.dtype} q${k.numQHeads} kv${k.numKvHeads} d${k.headDim} ` +
    `b${k.blockSize} ctx ${contextLen} digest ${ATTENTION_SOURCES_DIGEST}`;
}
