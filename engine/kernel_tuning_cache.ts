/**
 * The file the engine keeps measured kernel tunings in (engine/kernel_tuning.ts): one JSON
 * object, entries keyed by the adapter, Deno, the kernels' sources and the model's shapes, each
 * holding the measured choice of every tuned part (matmul, decode attention, prefill attention).
 *
 * The file is `$WEBGPU_LLM_CACHE_DIR/matmul_tuning.json`, else under `$XDG_CACHE_HOME/webgpu-llm`,
 * else `~/.cache/webgpu-llm`. It is written whole through a temporary file and a rename; the
 * newest {@linkcode MAX_ENTRIES} entries are kept.
 *
 * @module
 */

import { dirname, join } from "node:path";
import type { GpuContext } from "../gpu/context.ts";

/** Cache entries kept (the most recently written). */
export const MAX_ENTRIES = 64;

/** One measured tuning: each part's choice as plain data. */
export interface TuningEntry {
  readonly parts: Readonly<Record<string, unknown>>;
  readonly measuredAt: string;
  readonly method: string;
}

/** The cache file's content. */
export interface TuningCacheFile {
  version: 2;
  entries: Record<string, TuningEntry>;
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

/** `Deno.env.get`, or undefined without `--allow-env`. */
export function envGet(name: string): string | undefined {
  try {
    return Deno.env.get(name);
  } catch {
    return undefined;
  }
}

/** The part of a cache key naming the adapter. */
export function adapterKey(ctx: GpuContext): string {
  const a = ctx.adapter;
  return `${a.vendor}/${a.architecture}/${a.device}/${a.description}`;
}

/**
 * Reads the cache at `path` (empty when there is none).
 *
 * @throws {TypeError} when the file is not a version 2 tuning cache; {@linkcode SyntaxError} when
 *   it is not JSON; the file system's errors but NotFound.
 */
export async function readTuningCache(path: string): Promise<TuningCacheFile> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return { version: 2, entries: {} };
    throw error;
  }
  const data = JSON.parse(text) as Partial<TuningCacheFile>;
  if (data.version !== 2 || typeof data.entries !== "object" || data.entries === null) {
    throw new TypeError(`${path}: not a version 2 kernel tuning cache`);
  }
  return data as TuningCacheFile;
}

/** Writes `file` to `path` (the newest {@linkcode MAX_ENTRIES} entries) through a rename. */
export async function writeTuningCache(path: string, file: TuningCacheFile): Promise<void> {
  const keys = Object.keys(file.entries);
  for (const k of keys.slice(0, Math.max(0, keys.length - MAX_ENTRIES))) delete file.entries[k];
  await Deno.mkdir(dirname(path), { recursive: true });
  const tmp = `${path}.${Deno.pid}.tmp`;
  await Deno.writeTextFile(tmp, JSON.stringify(file, null, 1) + "\n");
  await Deno.rename(tmp, path);
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
    const cache = await readTuningCache(path);
    const mine = Object.entries(cache.entries).filter(([k]) =>
      k.startsWith(`${adapterKey(ctx)} |`)
    );
    const newest = mine.map(([, e]) => e.measuredAt).sort().at(-1) ?? "";
    return { entries: mine.length, newest };
  } catch {
    return null;
  }
}
