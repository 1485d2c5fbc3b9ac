import assert from "node:assert/strict";
import { join } from "node:path";
import { openCheckpoint } from "../engine/model/checkpoint.ts";
import { CheckpointError, ConfigError } from "../engine/model/errors.ts";
import {
  encodeTensorData,
  type TensorToWrite,
  writeSafetensors,
} from "../engine/model/safetensors.ts";
import { testSeed } from "./support/random.ts";

/** A tiny Qwen3 config: hidden 8, 2 heads of 4, 2 KV heads, intermediate 12, vocab 10. */
const config = {
  architectures: ["Qwen3ForCausalLM"],
  hidden_size: 8,
  head_dim: 4,
  intermediate_size: 12,
  num_attention_heads: 2,
  num_key_value_heads: 2,
  num_hidden_layers: 1,
  vocab_size: 10,
  rope_theta: 10000,
  tie_word_embeddings: true,
  eos_token_id: 9,
};

interface Made {
  dir: string;
  values: Map<string, Float32Array>;
  seed: number;
}

/** Tensors of the tiny model, with random f32 values (stored as `dtype`). */
function tinyTensors(
  name: string,
  dtype: "F32" | "F16" | "BF16",
): { seed: number; tensors: TensorToWrite[]; values: Map<string, Float32Array> } {
  const { seed, rng } = testSeed(name);
  const shapes: [string, number[]][] = [
    ["model.embed_tokens.weight", [10, 8]],
    ["model.layers.0.self_attn.q_proj.weight", [8, 8]],
    ["model.layers.0.self_attn.k_proj.weight", [8, 8]],
    ["model.layers.0.mlp.down_proj.weight", [8, 12]],
    ["model.norm.weight", [8]],
  ];
  const values = new Map<string, Float32Array>();
  const tensors = shapes.map(([n, shape]): TensorToWrite => {
    const v = rng.normals(shape.reduce((a, b) => a * b, 1));
    values.set(n, v);
    return { name: n, dtype, shape, data: () => encodeTensorData(v, dtype) };
  });
  return { seed, tensors, values };
}

async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "checkpoint_test_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** Writes a sharded checkpoint: tensors split over two shards with an index. */
async function makeSharded(dir: string, name: string): Promise<Made> {
  const { seed, tensors, values } = tinyTensors(name, "F32");
  await Deno.writeTextFile(join(dir, "config.json"), JSON.stringify(config));
  const shards = [tensors.slice(0, 2), tensors.slice(2)];
  const weightMap: Record<string, string> = {};
  for (let s = 0; s < shards.length; s++) {
    const file = `model-0000${s + 1}-of-00002.safetensors`;
    await writeSafetensors(join(dir, file), shards[s]!, { format: "pt" });
    for (const t of shards[s]!) weightMap[t.name] = file;
  }
  await Deno.writeTextFile(
    join(dir, "model.safetensors.index.json"),
    JSON.stringify({ metadata: { total_size: 0 }, weight_map: weightMap }),
  );
  return { dir, values, seed };
}

async function assertCheckpointError(
  promise: Promise<unknown>,
  pattern: RegExp,
): Promise<void> {
  await assert.rejects(promise, (e: unknown) => {
    assert.ok(e instanceof CheckpointError, `expected CheckpointError, got ${e}`);
    assert.ok(!e.message.includes("\n"), `message is not one line: ${e.message}`);
    assert.match(e.message, pattern);
    return true;
  });
}

Deno.test("openCheckpoint() reads a single-file checkpoint with config and generation config", async () => {
  await withTempDir(async (dir) => {
    const { seed, tensors, values } = tinyTensors("checkpoint single", "BF16");
    await Deno.writeTextFile(join(dir, "config.json"), JSON.stringify(config));
    await Deno.writeTextFile(
      join(dir, "generation_config.json"),
      JSON.stringify({ eos_token_id: [9, 8], temperature: 0.7 }),
    );
    await writeSafetensors(join(dir, "model.safetensors"), tensors);
    const ckpt = await openCheckpoint(dir);
    try {
      assert.equal(ckpt.config.arch, "Qwen3ForCausalLM");
      assert.equal(ckpt.config.headDim, 4);
      assert.deepEqual(ckpt.generationConfig, { eosTokenIds: [9, 8], temperature: 0.7 });
      assert.deepEqual([...ckpt.tensors.keys()].sort(), [...values.keys()].sort());
      const emb = ckpt.expectTensor("model.embed_tokens.weight", [10, 8]);
      assert.equal(emb.dtype, "BF16");
      assert.equal(emb.file, join(dir, "model.safetensors"));
      const norm = await ckpt.readTensor("model.norm.weight", "f32");
      // BF16 keeps the top 16 bits of the f32 (rounded): relative error <= 2^-8.
      values.get("model.norm.weight")!.forEach((v, i) => {
        assert.ok(Math.abs(norm[i]! - v) <= Math.abs(v) * 2 ** -8, `seed ${seed} norm[${i}]`);
      });
    } finally {
      ckpt.close();
    }
  });
});

Deno.test("openCheckpoint() reads sharded checkpoints and streams each tensor from its shard", async () => {
  await withTempDir(async (dir) => {
    const { values, seed } = await makeSharded(dir, "checkpoint sharded");
    const ckpt = await openCheckpoint(dir);
    try {
      assert.equal(ckpt.generationConfig, null);
      assert.equal(ckpt.tensors.size, values.size);
      assert.ok(
        ckpt.tensor("model.embed_tokens.weight").file.endsWith("model-00001-of-00002.safetensors"),
      );
      assert.ok(ckpt.tensor("model.norm.weight").file.endsWith("model-00002-of-00002.safetensors"));
      for (const [name, v] of values) {
        const got: number[] = [];
        for await (const chunk of ckpt.tensorChunks(name, "f32", 40)) {
          assert.ok(chunk.data.byteLength <= 40 || chunk.rows === 1, `${name}: chunk too large`);
          got.push(...chunk.data);
        }
        assert.deepEqual(got, [...v], `seed ${seed} ${name}`);
        const f16 = await ckpt.readTensor(name, "f16");
        assert.deepEqual([...f16], [...Float16Array.from(v)], `seed ${seed} ${name} as f16`);
      }
      assert.ok(ckpt.has("model.norm.weight"));
      assert.ok(!ckpt.has("lm_head.weight"));
    } finally {
      ckpt.close();
    }
  });
});

Deno.test("Checkpoint.expectTensor() names a missing tensor and a wrong shape in one line", async () => {
  await withTempDir(async (dir) => {
    await makeSharded(dir, "checkpoint expect");
    const ckpt = await openCheckpoint(dir);
    try {
      assert.throws(
        () => ckpt.expectTensor("lm_head.weight", [10, 8]),
        (e: unknown) =>
          e instanceof CheckpointError &&
          /^lm_head\.weight: tensor not found in model-00001-of-00002\.safetensors, model-00002-of-00002\.safetensors of .* \(layout: prefixed \("model\." names\)\)$/
            .test(e.message),
      );
      assert.throws(
        () => ckpt.expectTensor("model.layers.0.mlp.down_proj.weight", [12, 8]),
        (e: unknown) =>
          e instanceof CheckpointError &&
          /^model\.layers\.0\.mlp\.down_proj\.weight: expected shape \[12, 8\], found \[8, 12\] in .*model-00002-of-00002\.safetensors$/
            .test(e.message),
      );
      assert.throws(
        () => ckpt.expectTensor("model.norm.weight", [8, 1]),
        /expected shape \[8, 1\], found \[8\]/,
      );
      assert.throws(
        () => ckpt.tensorChunks("nope", "f32"),
        (e: unknown) =>
          e instanceof CheckpointError &&
          /^nope: tensor not found in .*\(layout: prefixed/.test(e.message),
      );
    } finally {
      ckpt.close();
    }
  });
});

Deno.test("openCheckpoint() rejects missing shards, tensors absent from their shard and missing files", async () => {
  await withTempDir(async (dir) => {
    await makeSharded(dir, "checkpoint errors");
    const indexPath = join(dir, "model.safetensors.index.json");
    const index = JSON.parse(await Deno.readTextFile(indexPath));

    await Deno.writeTextFile(
      indexPath,
      JSON.stringify({
        weight_map: { ...index.weight_map, "lm_head.weight": "model-00003-of-00003.safetensors" },
      }),
    );
    await assertCheckpointError(
      openCheckpoint(dir),
      /model\.safetensors\.index\.json: weight_map points at missing shard "model-00003-of-00003\.safetensors" \(for "lm_head\.weight"\)$/,
    );

    await Deno.writeTextFile(
      indexPath,
      JSON.stringify({
        weight_map: { ...index.weight_map, "lm_head.weight": "model-00001-of-00002.safetensors" },
      }),
    );
    await assertCheckpointError(
      openCheckpoint(dir),
      /^lm_head\.weight: listed in .*index\.json for shard "model-00001-of-00002\.safetensors" but not found in it$/,
    );

    await Deno.writeTextFile(indexPath, JSON.stringify({ weight_map: { a: "../x.safetensors" } }));
    await assertCheckpointError(openCheckpoint(dir), /invalid shard file name/);

    await Deno.writeTextFile(indexPath, JSON.stringify({ metadata: {} }));
    await assertCheckpointError(
      openCheckpoint(dir),
      /index\.json: missing or invalid "weight_map"$/,
    );

    await Deno.writeTextFile(indexPath, "{ not json");
    await assertCheckpointError(openCheckpoint(dir), /index\.json: invalid JSON/);

    await Deno.remove(indexPath);
    await assertCheckpointError(
      openCheckpoint(dir),
      /: no model\.safetensors or model\.safetensors\.index\.json found$/,
    );

    // A truncated single-file checkpoint is named by its path.
    const single = join(dir, "model.safetensors");
    await Deno.writeFile(single, new Uint8Array(5));
    await assertCheckpointError(
      openCheckpoint(dir),
      /model\.safetensors: truncated safetensors file/,
    );

    await Deno.writeTextFile(
      join(dir, "config.json"),
      JSON.stringify({ ...config, architectures: ["BertModel"] }),
    );
    await assert.rejects(
      openCheckpoint(dir),
      (e: unknown) =>
        e instanceof ConfigError &&
        /config\.json: unsupported architectures \["BertModel"\]/.test(e.message),
    );

    await Deno.remove(join(dir, "config.json"));
    await assertCheckpointError(openCheckpoint(dir), /config\.json: not found$/);
  });
});
