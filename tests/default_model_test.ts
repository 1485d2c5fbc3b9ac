/**
 * The default tiny model is created atomically: processes that need it at once (two servers, or
 * parallel tests, on first use) each end with the complete checkpoint, never a half-written one.
 */

import assert from "node:assert/strict";
import { createDefaultModel } from "../cli/engine_flags.ts";
import { Checkpoint } from "../engine/model/checkpoint.ts";

Deno.test("createDefaultModel() called four times at once leaves one complete checkpoint and no temporary directory", async () => {
  const parent = await Deno.makeTempDir({ prefix: "default_model_" });
  try {
    const dir = `${parent}/models/tiny-qwen3`;
    // Each call writes its own copy, then renames it into place; all but one lose the rename.
    // Meanwhile a reader opens the model whenever its config.json is there: it must be whole.
    let done = false;
    const reader = (async () => {
      while (!done) {
        let present = false;
        try {
          present = (await Deno.stat(`${dir}/config.json`)).isFile;
        } catch { /* not yet */ }
        if (present) {
          (await Checkpoint.open(dir)).close();
        }
        await new Promise((r) => setTimeout(r, 0));
      }
    })();
    await Promise.all([0, 1, 2, 3].map(() => createDefaultModel(dir))).finally(() => done = true);
    await reader;
    const ckpt = await Checkpoint.open(dir);
    try {
      assert.ok(ckpt.tensors.size > 0);
    } finally {
      ckpt.close();
    }
    const left = [];
    for await (const e of Deno.readDir(`${parent}/models`)) left.push(e.name);
    assert.deepEqual(left, ["tiny-qwen3"]);
    // Once it exists, another call keeps it (and still leaves nothing behind).
    const before = (await Deno.stat(`${dir}/model.safetensors`)).mtime;
    await createDefaultModel(dir);
    assert.deepEqual((await Deno.stat(`${dir}/model.safetensors`)).mtime, before);
  } finally {
    await Deno.remove(parent, { recursive: true });
  }
});
