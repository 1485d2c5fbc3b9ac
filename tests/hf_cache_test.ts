/**
 * Models by hub id: resolved in a Hugging Face cache the test builds (the layout
 * `huggingface_hub` writes), offline errors in one line, and downloads through
 * `@huggingface/hub` from a local HTTP server that answers the hub's file requests (no internet).
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { CheckpointError, ConfigError } from "../engine/model/errors.ts";
import {
  findCachedSnapshot,
  hfHubCacheDir,
  hfHubOffline,
  looksLikeHubId,
  repoFolder,
  resolveHubModel,
} from "../engine/model/hf_cache.ts";
import { downloadToCache } from "../engine/model/hf_download.ts";
import { makeModel } from "../tools/make_model.ts";
import { runMain } from "./support/cli.ts";
import { defaultServedName } from "../cli/engine_flags.ts";

const COMMIT = "0123456789abcdef0123456789abcdef01234567";

Deno.test("hfHubCacheDir() follows HF_HUB_CACHE, then HF_HOME, then ~/.cache/huggingface/hub", () => {
  const env = (vars: Record<string, string>) => (n: string) => vars[n];
  assert.equal(hfHubCacheDir(env({ HF_HUB_CACHE: "/c", HF_HOME: "/h", HOME: "/u" })), "/c");
  assert.equal(hfHubCacheDir(env({ HF_HOME: "/h", HOME: "/u" })), "/h/hub");
  assert.equal(hfHubCacheDir(env({ HOME: "/u" })), "/u/.cache/huggingface/hub");
  assert.ok(hfHubOffline(env({ HF_HUB_OFFLINE: "1" })));
  assert.ok(!hfHubOffline(env({ HF_HUB_OFFLINE: "0" })));
  assert.ok(
    looksLikeHubId("Qwen/Qwen3-0.6B") && !looksLikeHubId("./models/x") && !looksLikeHubId("x"),
  );
  assert.equal(repoFolder("/c", "Qwen/Qwen3-0.6B"), "/c/models--Qwen--Qwen3-0.6B");
});

/** A cache holding `org/tiny` at COMMIT with refs/main, as huggingface_hub lays it out. */
async function buildCache(root: string): Promise<string> {
  const repo = repoFolder(root, "test-org/tiny");
  const snapshot = join(repo, "snapshots", COMMIT);
  await makeModel({ out: snapshot, preset: "tiny-qwen3", dtype: "f32", seed: 4 });
  await Deno.mkdir(join(repo, "refs"), { recursive: true });
  await Deno.writeTextFile(join(repo, "refs", "main"), COMMIT);
  return snapshot;
}

Deno.test("resolveHubModel() finds a cached snapshot by branch or commit, and says in one line what is missing", async () => {
  const root = await Deno.makeTempDir();
  try {
    const snapshot = await buildCache(root);
    assert.equal(await findCachedSnapshot(root, "test-org/tiny"), snapshot);
    assert.equal(
      await resolveHubModel("test-org/tiny", { cacheDir: root, offline: true }),
      snapshot,
    );
    assert.equal(
      await resolveHubModel("test-org/tiny", { cacheDir: root, revision: COMMIT, offline: true }),
      snapshot,
    );
    await assert.rejects(
      resolveHubModel("test-org/other", { cacheDir: root, offline: true }),
      (e: unknown) =>
        e instanceof CheckpointError &&
        e.message ===
          `test-org/other (revision main) is not in the Hugging Face cache ${root}/models--test-org--other and HF_HUB_OFFLINE forbids downloading it`,
    );
    await assert.rejects(
      resolveHubModel("test-org/tiny", { cacheDir: root, revision: "v2", offline: true }),
      /revision v2\) is not in the Hugging Face cache/,
    );
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("main.ts generate --model ORG/NAME runs a model from the Hugging Face cache offline", async () => {
  const root = await Deno.makeTempDir();
  try {
    await buildCache(root);
    const env = { HF_HUB_CACHE: root, HF_HUB_OFFLINE: "1" };
    const ok = await runMain(
      [
        "generate",
        "--model",
        "test-org/tiny",
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "3",
        "--json",
      ],
      env,
    );
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal(JSON.parse(ok.stdout.trim()).token_ids.length, 3);
    // A server reports the hub id as the model's name (as vLLM does), a directory by its name.
    assert.equal(await defaultServedName("test-org/tiny", `${root}/x`), "test-org/tiny");
    assert.equal(await defaultServedName(root, root), root.split("/").pop());
    const missing = await runMain(
      ["generate", "--model", "test-org/absent", "--prompt-ids", "1"],
      env,
    );
    assert.equal(missing.code, 1);
    const errors = missing.stderr.split("\n").filter((l) => l.startsWith("error:"));
    assert.equal(errors.length, 1, missing.stderr);
    assert.match(errors[0]!, /test-org\/absent \(revision main\) is not in the Hugging Face cache/);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

/**
 * A stand-in for the hub's file API on loopback: the repository tree, paths-info (with the last
 * commit), and `resolve` downloads with byte ranges, for one repository whose files are `files`.
 */
function fakeHub(id: string, files: Map<string, Uint8Array>) {
  const requests: string[] = [];
  const oid = (path: string) =>
    `oid${[...path].reduce((h, c) => (h * 31 + c.charCodeAt(0)) >>> 0, 7)}`;
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
    const url = new URL(req.url);
    requests.push(`${req.method} ${url.pathname}`);
    const api = `/api/models/${id}`;
    if (url.pathname === `${api}/tree/main`) {
      return Response.json(
        [...files].map(([path, data]) => ({
          type: "file",
          path,
          oid: oid(path),
          size: data.length,
        })),
      );
    }
    if (req.method === "POST" && url.pathname === `${api}/paths-info/main`) {
      const { paths } = await req.json() as { paths: string[] };
      return Response.json(
        paths.filter((p) => files.has(p)).map((path) => ({
          type: "file",
          path,
          oid: oid(path),
          size: files.get(path)!.length,
          lastCommit: { id: COMMIT, title: "init", date: "2026-11-25T00:00:00Z" },
        })),
      );
    }
    const prefix = `/${id}/resolve/main/`;
    if (url.pathname.startsWith(prefix)) {
      const data = files.get(url.pathname.slice(prefix.length));
      if (data === undefined) {
        return new Response("not found", {
          status: 404,
          headers: { "x-error-code": "EntryNotFound" },
        });
      }
      const range = /^bytes=(\d+)-(\d*)$/.exec(req.headers.get("range") ?? "");
      const headers = { etag: `"${oid(url.pathname)}"`, "accept-ranges": "bytes" };
      if (range === null) return new Response(data.slice(), { headers });
      const start = Number(range[1]);
      const end = range[2] === "" ? data.length - 1 : Math.min(Number(range[2]), data.length - 1);
      return new Response(data.slice(start, end + 1), {
        status: 206,
        headers: { ...headers, "content-range": `bytes ${start}-${end}/${data.length}` },
      });
    }
    return new Response("not found", { status: 404 });
  });
  return { url: `http://127.0.0.1:${server.addr.port}`, requests, close: () => server.shutdown() };
}

Deno.test("downloadToCache() fetches a hub model into the cache with @huggingface/hub, reusable offline", async () => {
  const root = await Deno.makeTempDir();
  const src = await Deno.makeTempDir();
  try {
    await makeModel({ out: src, preset: "tiny-qwen3", dtype: "f32", seed: 5 });
    const files = new Map<string, Uint8Array>();
    for await (const e of Deno.readDir(src)) {
      files.set(e.name, await Deno.readFile(join(src, e.name)));
    }
    files.set("README.md", new TextEncoder().encode("not needed"));
    const hub = fakeHub("test-org/remote", files);
    try {
      const lines: string[] = [];
      const cache = join(root, "hub");
      const dir = await downloadToCache("test-org/remote", "main", cache, {
        hubUrl: hub.url,
        log: (l) => lines.push(l),
      });
      assert.equal(dir, join(repoFolder(cache, "test-org/remote"), "snapshots", COMMIT));
      for (const name of files.keys()) {
        const present = await Deno.stat(join(dir, name)).then(() => true, () => false);
        assert.equal(present, name !== "README.md", name);
      }
      assert.deepEqual(
        await Deno.readFile(join(dir, "model.safetensors")),
        files.get("model.safetensors"),
      );
      assert.equal(
        (await Deno.readTextFile(join(repoFolder(cache, "test-org/remote"), "refs", "main")))
          .trim(),
        COMMIT,
      );
      assert.match(lines[0]!, /^Downloading test-org\/remote \(main\): \d+ files/);
      // The bytes counted while streaming are exactly the wanted files' (README.md left out).
      const wanted = [...files].filter(([n]) => n !== "README.md");
      const bytes = wanted.reduce((a, [, d]) => a + d.length, 0);
      assert.ok(bytes < 1 << 20, "a tiny model: the size is written in KB");
      assert.equal(lines.at(-1), `Downloaded ${(bytes / 1024).toFixed(1)} KB`);
      // Offline from now on: the same resolution finds it without the network.
      assert.equal(
        await resolveHubModel("test-org/remote", { cacheDir: cache, offline: true }),
        dir,
      );
      await assert.rejects(
        downloadToCache("test-org/none", "main", cache, { hubUrl: hub.url }),
        (e: unknown) =>
          e instanceof CheckpointError && /^Cannot list test-org\/none/.test(e.message),
      );
    } finally {
      await hub.close();
    }
  } finally {
    await Deno.remove(root, { recursive: true });
    await Deno.remove(src, { recursive: true });
  }
});

Deno.test("downloadToCache() refuses a pre-quantized format it cannot read before fetching the weights", async () => {
  const root = await Deno.makeTempDir();
  const src = await Deno.makeTempDir();
  try {
    await makeModel({ out: src, preset: "tiny-qwen3", dtype: "f32", seed: 5 });
    const config = JSON.parse(await Deno.readTextFile(join(src, "config.json")));
    config.quantization_config = { quant_method: "bitsandbytes", load_in_4bit: true };
    await Deno.writeTextFile(join(src, "config.json"), JSON.stringify(config));
    const files = new Map<string, Uint8Array>();
    for await (const e of Deno.readDir(src)) {
      files.set(e.name, await Deno.readFile(join(src, e.name)));
    }
    const hub = fakeHub("test-org/bnb4", files);
    try {
      await assert.rejects(
        downloadToCache("test-org/bnb4", "main", join(root, "hub"), { hubUrl: hub.url }),
        (e: unknown) =>
          e instanceof ConfigError &&
          /^test-org\/bnb4\/config\.json: the weights are pre-quantized with quant_method "bitsandbytes"/
            .test(e.message),
      );
      const downloads = hub.requests.filter((r) => r.includes("/resolve/main/"));
      // Only config.json was fetched (the client may ask for it more than once).
      assert.ok(downloads.length > 0);
      assert.deepEqual(
        new Set(downloads.map((r) => r.split("/resolve/main/")[1])),
        new Set(["config.json"]),
      );
    } finally {
      await hub.close();
    }
  } finally {
    await Deno.remove(root, { recursive: true });
    await Deno.remove(src, { recursive: true });
  }
});
