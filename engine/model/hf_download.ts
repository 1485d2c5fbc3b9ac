/**
 * Downloading a hub model's checkpoint files into the Hugging Face cache with the maintained
 * client `@huggingface/hub` (its `listFiles` and `downloadFileToCacheDir`, which write the same
 * `blobs/` + `snapshots/<commit>/` layout as Python's `huggingface_hub`), then recording the
 * revision in `refs/` as `huggingface_hub` does, so the next run (and Python tools) find it
 * offline. Only what the engine reads is fetched: `config.json`, `generation_config.json`, the
 * tokenizer files, `*.safetensors` and their index. `config.json` comes first and is checked
 * before anything else is fetched: a model this engine cannot serve (its architecture, a
 * pre-quantized format it does not read) is refused without downloading its weights.
 *
 * The hub is `$HF_ENDPOINT` (default https://huggingface.co) and the token `$HF_TOKEN`, as in
 * `huggingface_hub`.
 *
 * @module
 */

import { downloadFileToCacheDir, listFiles } from "@huggingface/hub";
import { dirname, join } from "node:path";
import { parseCheckpointQuantization } from "./checkpoint_quantization.ts";
import { parseModelConfig } from "./config.ts";
import { CheckpointError } from "./errors.ts";
import { repoFolder } from "./hf_cache.ts";
import { LoadProgress } from "./load_progress.ts";

/** The top-level files a checkpoint needs. */
const WANTED =
  /^(config\.json|generation_config\.json|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|model\.safetensors\.index\.json|[^/]+\.safetensors)$/;

/** Options of {@linkcode downloadToCache}. */
export interface DownloadOptions {
  /** The hub's base URL; default `$HF_ENDPOINT` or https://huggingface.co. */
  readonly hubUrl?: string;
  /** Access token; default `$HF_TOKEN`. */
  readonly accessToken?: string;
  /** Progress lines ("downloading config.json (1 of 5, 0.7 KB)"). */
  readonly log?: (line: string) => void;
  /** Draw a progress bar of the downloaded bytes on stderr; default: when it is a terminal. */
  readonly progressBar?: boolean;
}

function env(name: string): string | undefined {
  try {
    return Deno.env.get(name) || undefined;
  } catch {
    return undefined;
  }
}

function size(bytes: number): string {
  return bytes >= 1 << 30
    ? `${(bytes / (1 << 30)).toFixed(2)} GB`
    : bytes >= 1 << 20
    ? `${(bytes / (1 << 20)).toFixed(1)} MB`
    : `${(bytes / 1024).toFixed(1)} KB`;
}

/**
 * `fetch` that reports the body bytes of file downloads (`/resolve/` URLs, except the one-byte
 * probe of a file's size) as they stream through.
 */
function countingFetch(onBytes: (n: number) => void): typeof fetch {
  return async (input, init) => {
    const res = await fetch(input, init);
    const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
    const range = new Headers(init?.headers).get("range");
    if (res.body === null || !url.includes("/resolve/") || range === "bytes=0-0") return res;
    const counted = res.body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          onBytes(chunk.byteLength);
          controller.enqueue(chunk);
        },
      }),
    );
    return new Response(counted, {
      status: res.status,
      statusText: res.statusText,
      headers: res.headers,
    });
  };
}

/**
 * Downloads the checkpoint files of hub model `id` at `revision` into `cacheDir` and returns
 * the snapshot directory.
 *
 * @throws {CheckpointError} one line when the hub cannot be reached or lists no `config.json`;
 *   its subclass ConfigError when `config.json` describes a model this engine cannot serve (then
 *   nothing but `config.json` was downloaded).
 */
export async function downloadToCache(
  id: string,
  revision: string,
  cacheDir: string,
  options: DownloadOptions = {},
): Promise<string> {
  const hubUrl = options.hubUrl ?? env("HF_ENDPOINT") ?? "https://huggingface.co";
  const accessToken = options.accessToken ?? env("HF_TOKEN");
  const common = { repo: id, revision, hubUrl, ...(accessToken ? { accessToken } : {}) };
  const log = options.log ?? (() => {});
  const files: { path: string; size: number }[] = [];
  try {
    for await (const f of listFiles({ ...common, recursive: false })) {
      if (f.type === "file" && WANTED.test(f.path)) files.push({ path: f.path, size: f.size });
    }
  } catch (e) {
    throw new CheckpointError(
      `Cannot list ${id} (revision ${revision}) on ${hubUrl}: ${
        (e instanceof Error ? e.message : String(e)).split("\n")[0]
      }`,
      { cause: e },
    );
  }
  if (!files.some((f) => f.path === "config.json")) {
    throw new CheckpointError(`${id} (revision ${revision}) on ${hubUrl} has no config.json`);
  }
  // config.json first, checked before the weights are fetched.
  files.sort((a, b) => Number(b.path === "config.json") - Number(a.path === "config.json"));
  const total = files.reduce((a, f) => a + f.size, 0);
  log(`Downloading ${id} (${revision}): ${files.length} files, ${size(total)} into ${cacheDir}`);
  const progress = new LoadProgress(
    total,
    options.progressBar ?? Deno.stderr.isTerminal(),
    "Downloading",
  );
  const fetchCounting = countingFetch((n) => progress.advance(n));
  let snapshot: string | null = null;
  for (const [i, f] of files.entries()) {
    log(`  ${f.path} (${i + 1} of ${files.length}, ${size(f.size)})`);
    let pointer: string;
    try {
      pointer = await downloadFileToCacheDir({
        ...common,
        path: f.path,
        cacheDir,
        fetch: fetchCounting,
      });
    } catch (e) {
      throw new CheckpointError(
        `Cannot download ${f.path} of ${id} from ${hubUrl}: ${
          (e instanceof Error ? e.message : String(e)).split("\n")[0]
        }`,
        { cause: e },
      );
    }
    snapshot ??= dirname(pointer);
    if (f.path === "config.json") await checkConfig(pointer, `${id}/config.json`);
  }
  progress.finish();
  log(`Downloaded ${size(progress.done)}`);
  // huggingface_hub records which commit a branch or tag name points at.
  if (!/^[0-9a-f]{40}$/.test(revision)) {
    const refs = join(repoFolder(cacheDir, id), "refs");
    await Deno.mkdir(refs, { recursive: true });
    await Deno.writeTextFile(join(refs, revision), snapshot!.split("/").pop()!);
  }
  return snapshot!;
}

/**
 * Parses the downloaded `config.json` at `path` as the loader will.
 *
 * @throws {ConfigError} `"<source>: ..."` for a model this engine cannot serve.
 */
async function checkConfig(path: string, source: string): Promise<void> {
  let raw: unknown;
  try {
    raw = JSON.parse(await Deno.readTextFile(path));
  } catch (e) {
    throw new CheckpointError(
      `${source}: invalid JSON (${(e instanceof Error ? e.message : String(e)).split("\n")[0]})`,
      { cause: e },
    );
  }
  parseModelConfig(raw, source);
  parseCheckpointQuantization(raw, source);
}
