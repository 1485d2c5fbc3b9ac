/**
 * Models named by Hugging Face hub id (`Qwen/Qwen3-0.6B`), found in the Hugging Face cache that
 * Python tools (`huggingface_hub`, transformers, vLLM) fill, with the same directory layout, so
 * models they downloaded are used as they are:
 *
 * ```text
 * <cache>/models--Qwen--Qwen3-0.6B/
 *   refs/main                      the commit hash the revision "main" points at
 *   snapshots/<commit>/config.json  the files of that commit (links into blobs/)
 *   blobs/<etag>
 * ```
 *
 * The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub` (as
 * `huggingface_hub` decides). A revision is a branch or tag (resolved through `refs/`) or a
 * commit hash (a snapshot directory). `HF_HUB_OFFLINE=1` forbids the network: a model absent
 * from the cache is then one error line saying what is missing and where it looked.
 *
 * @module
 */

import { join } from "node:path";
import { CheckpointError } from "./errors.ts";

/** A hub model id: `owner/name` (letters, digits, `-`, `_`, `.`). */
const HUB_ID = /^[A-Za-z0-9][A-Za-z0-9._-]*\/[A-Za-z0-9][A-Za-z0-9._-]*$/;
/** A full commit hash. */
const COMMIT = /^[0-9a-f]{40}$/;

/** The files a checkpoint needs (what is downloaded, and what a snapshot must hold). */
export const REQUIRED_FILES = ["config.json"] as const;

/** Where the environment says the cache is (see the module doc). */
export function hfHubCacheDir(env: (name: string) => string | undefined = envGet): string {
  const explicit = env("HF_HUB_CACHE");
  if (explicit) return explicit;
  const home = env("HF_HOME");
  if (home) return join(home, "hub");
  const userHome = env("HOME") ?? env("USERPROFILE") ?? ".";
  return join(userHome, ".cache", "huggingface", "hub");
}

/** Whether `HF_HUB_OFFLINE` forbids downloads (`1`, `true`, `yes`, `on`). */
export function hfHubOffline(env: (name: string) => string | undefined = envGet): boolean {
  return /^(1|true|yes|on)$/i.test(env("HF_HUB_OFFLINE") ?? "");
}

function envGet(name: string): string | undefined {
  try {
    return Deno.env.get(name);
  } catch {
    return undefined; // no --allow-env
  }
}

/** Whether `model` looks like a hub id rather than a path (`org/name`, no such directory here). */
export function looksLikeHubId(model: string): boolean {
  return HUB_ID.test(model) && !model.startsWith(".");
}

/** The cache folder of a model repository (`models--org--name`). */
export function repoFolder(cacheDir: string, id: string): string {
  return join(cacheDir, `models--${id.replaceAll("/", "--")}`);
}

async function isFile(path: string): Promise<boolean> {
  try {
    return (await Deno.stat(path)).isFile;
  } catch {
    return false;
  }
}

/**
 * The snapshot directory of `id` at `revision` in `cacheDir`, or null when the cache lacks it
 * (no ref for the revision, no snapshot for the commit, or no `config.json` in it).
 */
export async function findCachedSnapshot(
  cacheDir: string,
  id: string,
  revision = "main",
): Promise<string | null> {
  const repo = repoFolder(cacheDir, id);
  let commit = revision;
  if (!COMMIT.test(revision)) {
    try {
      commit = (await Deno.readTextFile(join(repo, "refs", revision))).trim();
    } catch {
      return null;
    }
  }
  const snapshot = join(repo, "snapshots", commit);
  for (const f of REQUIRED_FILES) if (!(await isFile(join(snapshot, f)))) return null;
  return snapshot;
}

/** Options of {@linkcode resolveHubModel}. */
export interface HubModelOptions {
  /** Branch, tag or commit hash; default `main`. */
  readonly revision?: string;
  /** The cache; default {@linkcode hfHubCacheDir}. */
  readonly cacheDir?: string;
  /** Whether the network may be used; default: not `HF_HUB_OFFLINE`. */
  readonly offline?: boolean;
  /**
   * Fetches what the cache lacks into it and returns the snapshot directory; without one (or
   * offline) a model absent from the cache is an error.
   */
  readonly download?: (id: string, revision: string, cacheDir: string) => Promise<string>;
}

/**
 * The checkpoint directory of hub model `id`: its snapshot in the cache, downloaded there first
 * when absent and allowed.
 *
 * @throws {CheckpointError} one line naming the model, the revision and the cache it looked in,
 *   when the model is absent and cannot be downloaded.
 */
export async function resolveHubModel(id: string, options: HubModelOptions = {}): Promise<string> {
  const revision = options.revision ?? "main";
  const cacheDir = options.cacheDir ?? hfHubCacheDir();
  const cached = await findCachedSnapshot(cacheDir, id, revision);
  if (cached !== null) return cached;
  const offline = options.offline ?? hfHubOffline();
  if (offline || options.download === undefined) {
    throw new CheckpointError(
      `${id} (revision ${revision}) is not in the Hugging Face cache ${repoFolder(cacheDir, id)}${
        offline ? " and HF_HUB_OFFLINE forbids downloading it" : ""
      }`,
    );
  }
  try {
    return await options.download(id, revision, cacheDir);
  } catch (e) {
    throw new CheckpointError(
      `${id} (revision ${revision}) is not in the Hugging Face cache ${
        repoFolder(cacheDir, id)
      } and downloading it failed: ${(e instanceof Error ? e.message : String(e)).split("\n")[0]}`,
      { cause: e },
    );
  }
}
