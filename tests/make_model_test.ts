import assert from "node:assert/strict";
import { assignShards, makeModel, parseMakeModelArgs } from "../tools/make_model.ts";
import { SafetensorsFile } from "../engine/model/safetensors.ts";
import { PRESETS } from "../engine/model/presets.ts";
import { presetTensors } from "../engine/model/preset_tensors.ts";
import { Tokenizer } from "../engine/tokenizer.ts";
import { testSeed } from "./support/random.ts";

type Json = Record<string, unknown>;

async function readJson(path: string): Promise<Json> {
  const value: unknown = JSON.parse(await Deno.readTextFile(path));
  assert(typeof value === "object" && value !== null && !Array.isArray(value), path);
  return { ...value };
}

/**
 * The tensors of the real Hugging Face checkpoints, written out independently of
 * engine/model/presets.ts: [name, shape] in any order.
 */
function expectedTensors(
  arch: string,
  c: {
    V: number;
    H: number;
    L: number;
    heads: number;
    kv: number;
    hd: number;
    I: number;
    P: number;
    tied: boolean;
  },
): Map<string, number[]> {
  const m = new Map<string, number[]>();
  if (arch === "gpt2") {
    m.set("transformer.wte.weight", [c.V, c.H]);
    m.set("transformer.wpe.weight", [c.P, c.H]);
    for (let l = 0; l < c.L; l++) {
      for (const ln of ["ln_1", "ln_2"]) {
        m.set(`transformer.h.${l}.${ln}.weight`, [c.H]);
        m.set(`transformer.h.${l}.${ln}.bias`, [c.H]);
      }
      // Conv1D: [in, out].
      m.set(`transformer.h.${l}.attn.c_attn.weight`, [c.H, 3 * c.H]);
      m.set(`transformer.h.${l}.attn.c_attn.bias`, [3 * c.H]);
      m.set(`transformer.h.${l}.attn.c_proj.weight`, [c.H, c.H]);
      m.set(`transformer.h.${l}.attn.c_proj.bias`, [c.H]);
      m.set(`transformer.h.${l}.mlp.c_fc.weight`, [c.H, c.I]);
      m.set(`transformer.h.${l}.mlp.c_fc.bias`, [c.I]);
      m.set(`transformer.h.${l}.mlp.c_proj.weight`, [c.I, c.H]);
      m.set(`transformer.h.${l}.mlp.c_proj.bias`, [c.H]);
    }
    m.set("transformer.ln_f.weight", [c.H]);
    m.set("transformer.ln_f.bias", [c.H]);
    return m;
  }
  m.set("model.embed_tokens.weight", [c.V, c.H]);
  m.set("model.norm.weight", [c.H]);
  if (!c.tied) m.set("lm_head.weight", [c.V, c.H]);
  for (let l = 0; l < c.L; l++) {
    const p = `model.layers.${l}`;
    m.set(`${p}.input_layernorm.weight`, [c.H]);
    m.set(`${p}.post_attention_layernorm.weight`, [c.H]);
    m.set(`${p}.self_attn.q_proj.weight`, [c.heads * c.hd, c.H]);
    m.set(`${p}.self_attn.k_proj.weight`, [c.kv * c.hd, c.H]);
    m.set(`${p}.self_attn.v_proj.weight`, [c.kv * c.hd, c.H]);
    m.set(`${p}.self_attn.o_proj.weight`, [c.H, c.heads * c.hd]);
    if (arch === "qwen2") {
      m.set(`${p}.self_attn.q_proj.bias`, [c.heads * c.hd]);
      m.set(`${p}.self_attn.k_proj.bias`, [c.kv * c.hd]);
      m.set(`${p}.self_attn.v_proj.bias`, [c.kv * c.hd]);
    }
    if (arch === "qwen3") {
      m.set(`${p}.self_attn.q_norm.weight`, [c.hd]);
      m.set(`${p}.self_attn.k_norm.weight`, [c.hd]);
    }
    m.set(`${p}.mlp.gate_proj.weight`, [c.I, c.H]);
    m.set(`${p}.mlp.up_proj.weight`, [c.I, c.H]);
    m.set(`${p}.mlp.down_proj.weight`, [c.H, c.I]);
  }
  return m;
}

/** Reads the shapes in config.json the way a loader would and derives the expected tensors. */
function expectedFromConfig(config: Json): Map<string, number[]> {
  const n = (key: string): number => {
    const v = config[key];
    assert(typeof v === "number", `config.${key} is a number`);
    return v;
  };
  const arch = String(config.model_type);
  if (arch === "gpt2") {
    const H = n("n_embd");
    const inner = config.n_inner === null ? 4 * H : n("n_inner");
    return expectedTensors(arch, {
      V: n("vocab_size"),
      H,
      L: n("n_layer"),
      heads: n("n_head"),
      kv: n("n_head"),
      hd: H / n("n_head"),
      I: inner,
      P: n("n_positions"),
      tied: true,
    });
  }
  const H = n("hidden_size");
  const heads = n("num_attention_heads");
  return expectedTensors(arch, {
    V: n("vocab_size"),
    H,
    L: n("num_hidden_layers"),
    heads,
    kv: n("num_key_value_heads"),
    hd: typeof config.head_dim === "number" ? config.head_dim : H / heads,
    I: n("intermediate_size"),
    P: n("max_position_embeddings"),
    tied: config.tie_word_embeddings === true,
  });
}

/** Every tensor of every safetensors file in `dir` (via the index when sharded). */
async function readTensors(dir: string, files: string[]) {
  const out = new Map<string, { file: string; dtype: string; shape: number[] }>();
  for (const file of files.filter((f) => f.endsWith(".safetensors"))) {
    const st = await SafetensorsFile.open(`${dir}/${file}`);
    try {
      assert.deepEqual(st.metadata, { format: "pt" });
      for (const [name, info] of st.tensors) {
        assert(!out.has(name), `${name} appears twice`);
        out.set(name, { file, dtype: info.dtype, shape: [...info.shape] });
      }
    } finally {
      st.close();
    }
  }
  return out;
}

async function withTempDir(prefix: string, fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const CASES = [
  { preset: "tiny-qwen3", dtype: "f32", shards: 1, arch: "Qwen3ForCausalLM" },
  { preset: "tiny-qwen2", dtype: "bf16", shards: 2, arch: "Qwen2ForCausalLM" },
  { preset: "tiny-llama", dtype: "f16", shards: 3, arch: "LlamaForCausalLM" },
  { preset: "tiny-gpt2", dtype: "bf16", shards: 1, arch: "GPT2LMHeadModel" },
  { preset: "tiny-gpt2", dtype: "f32", shards: 2, arch: "GPT2LMHeadModel" },
] as const;

const ST_DTYPE = { f32: "F32", f16: "F16", bf16: "BF16" } as const;
const TORCH_DTYPE = { f32: "float32", f16: "float16", bf16: "bfloat16" } as const;

Deno.test("makeModel() writes every file with the Hugging Face names and shapes", async () => {
  for (const c of CASES) {
    await withTempDir(`make_${c.preset}_`, async (dir) => {
      const ctx = `${c.preset} ${c.dtype} shards=${c.shards}`;
      const made = await makeModel({
        out: dir,
        preset: c.preset,
        dtype: c.dtype,
        shards: c.shards,
      });
      const weightFiles = c.shards === 1 ? ["model.safetensors"] : Array.from(
        { length: c.shards },
        (_, k) => `model-0000${k + 1}-of-0000${c.shards}.safetensors`,
      );
      const expectedFiles = [
        "config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        ...weightFiles,
        ...(c.shards > 1 ? ["model.safetensors.index.json"] : []),
      ].sort();
      const onDisk = [];
      for await (const e of Deno.readDir(dir)) onDisk.push(e.name);
      assert.deepEqual(onDisk.sort(), expectedFiles, ctx);
      assert.deepEqual([...made.files].sort(), expectedFiles, ctx);

      const config = await readJson(`${dir}/config.json`);
      assert.deepEqual(config.architectures, [c.arch], ctx);
      assert.equal(config.torch_dtype, TORCH_DTYPE[c.dtype], ctx);
      assert.equal(config.vocab_size, 512, ctx);
      const tok = await Tokenizer.fromDir(dir);
      assert.equal(tok.size, 512, ctx);
      assert.equal(config.eos_token_id, tok.eosTokenId, ctx);
      assert.equal(
        config.bos_token_id,
        tok.encode("<|endoftext|>", { addSpecialTokens: false })[0],
      );
      const gen = await readJson(`${dir}/generation_config.json`);
      assert.equal(gen.bos_token_id, config.bos_token_id, ctx);
      const tokConfig = await readJson(`${dir}/tokenizer_config.json`);
      assert.equal(typeof tokConfig.chat_template, "string", ctx);
      assert.equal(tokConfig.clean_up_tokenization_spaces, false, ctx);

      const tensors = await readTensors(dir, weightFiles);
      const expected = expectedFromConfig(config);
      assert.deepEqual([...tensors.keys()].sort(), [...expected.keys()].sort(), ctx);
      let bytes = 0;
      for (const [name, t] of tensors) {
        assert.deepEqual(t.shape, expected.get(name), `${ctx}: ${name}`);
        assert.equal(t.dtype, ST_DTYPE[c.dtype], `${ctx}: ${name}`);
        bytes += t.shape.reduce((a, b) => a * b, c.dtype === "f32" ? 4 : 2);
      }
      assert.equal(made.totalSize, bytes, ctx);

      if (c.shards > 1) {
        const index = await readJson(`${dir}/model.safetensors.index.json`);
        assert.deepEqual(index.metadata, { total_size: bytes }, ctx);
        const map = index.weight_map;
        assert(typeof map === "object" && map !== null, ctx);
        const entries = Object.entries(map);
        assert.equal(entries.length, tensors.size, ctx);
        for (const [name, file] of entries) assert.equal(file, tensors.get(name)?.file, name);
        assert.equal(new Set(entries.map(([, f]) => f)).size, c.shards, `${ctx}: no empty shard`);
      }
    });
  }
});

Deno.test("config.json has each architecture's fields", async () => {
  await withTempDir("make_cfg_", async (dir) => {
    await makeModel({ out: `${dir}/q3`, preset: "tiny-qwen3" });
    const q3 = await readJson(`${dir}/q3/config.json`);
    assert.equal(q3.model_type, "qwen3");
    assert.equal(q3.head_dim, 32);
    assert.notEqual(Number(q3.num_attention_heads) * 32, q3.hidden_size);
    assert.equal(q3.rope_theta, 1_000_000);
    assert.equal(q3.tie_word_embeddings, true);
    assert.equal(q3.rms_norm_eps, 1e-6);
    assert.equal(q3.max_position_embeddings, 2048);
    assert.equal(q3.torch_dtype, "float32");

    await makeModel({ out: `${dir}/llama`, preset: "tiny-llama" });
    const llama = await readJson(`${dir}/llama/config.json`);
    assert.equal(llama.model_type, "llama");
    assert.equal(llama.tie_word_embeddings, false);
    assert.deepEqual(llama.rope_scaling, {
      factor: 32,
      high_freq_factor: 4,
      low_freq_factor: 1,
      original_max_position_embeddings: 8192,
      rope_type: "llama3",
    });
    assert.equal(llama.rope_theta, 500_000);

    await makeModel({ out: `${dir}/gpt2`, preset: "tiny-gpt2" });
    const gpt2 = await readJson(`${dir}/gpt2/config.json`);
    assert.equal(gpt2.model_type, "gpt2");
    assert.equal(gpt2.n_inner, null);
    assert.equal(gpt2.activation_function, "gelu_new");
    assert.equal(gpt2.layer_norm_epsilon, 1e-5);
  });
});

Deno.test("real-shaped presets have the real parameter counts", () => {
  const params = (name: string) =>
    presetTensors(PRESETS[name]!).reduce((n, t) => n + t.shape.reduce((a, b) => a * b, 1), 0);
  // Published counts (tied embeddings counted once).
  assert.equal(params("qwen3-0.6b"), 596_049_920);
  assert.equal(params("qwen2.5-0.5b"), 494_032_768);
  assert.equal(params("llama-3.2-1b"), 1_235_814_400);
  assert.equal(params("distilgpt2"), 81_912_576);
});

Deno.test("makeModel() weights are deterministic, seeded, sharding-independent and sane", async () => {
  const { seed } = testSeed("make_model weights");
  const read = async (dir: string, name: string, file: string) => {
    const st = await SafetensorsFile.open(`${dir}/${file}`);
    try {
      return await st.readTensor(name);
    } finally {
      st.close();
    }
  };
  await withTempDir("make_det_", async (dir) => {
    await makeModel({ out: `${dir}/a`, preset: "tiny-qwen2", dtype: "f32", seed });
    await makeModel({ out: `${dir}/b`, preset: "tiny-qwen2", dtype: "f32", seed, shards: 2 });
    await makeModel({ out: `${dir}/c`, preset: "tiny-qwen2", dtype: "bf16", seed });
    await makeModel({
      out: `${dir}/d`,
      preset: "tiny-qwen2",
      dtype: "f32",
      seed: (seed ^ 1) >>> 0,
    });
    const index = await readJson(`${dir}/b/model.safetensors.index.json`);
    const map = index.weight_map;
    assert(typeof map === "object" && map !== null);
    const shardOf = new Map<string, unknown>(Object.entries(map));
    for (const spec of presetTensors(PRESETS["tiny-qwen2"]!)) {
      const ctx = `seed ${seed} ${spec.name}`;
      const a = await read(`${dir}/a`, spec.name, "model.safetensors");
      const b = await read(`${dir}/b`, spec.name, String(shardOf.get(spec.name)));
      const c = await read(`${dir}/c`, spec.name, "model.safetensors");
      const d = await read(`${dir}/d`, spec.name, "model.safetensors");
      assert.deepEqual(b, a, `${ctx}: same with --shards 2`);
      assert.notDeepEqual(d, a, `${ctx}: differs with another seed`);
      let mean = 0;
      let sq = 0;
      for (let i = 0; i < a.length; i++) {
        // bf16 keeps 8 significant bits: relative rounding error <= 2^-8.
        assert(Math.abs(c[i]! - a[i]!) <= Math.abs(a[i]!) * 2 ** -8, `${ctx}: bf16 [${i}]`);
        mean += a[i]!;
        sq += a[i]! * a[i]!;
      }
      mean /= a.length;
      const std = Math.sqrt(sq / a.length - mean * mean);
      const isNorm = spec.name.includes("norm");
      const wantStd = spec.init.std;
      // Six standard errors of the mean (a fixed 0.01 failed for a 64-element bias with std 0.02,
      // whose standard error is 0.0025: seed 2458771074).
      const bound = (6 * wantStd) / Math.sqrt(a.length);
      assert(Math.abs(mean - (isNorm ? 1 : 0)) < bound, `${ctx}: mean ${mean}, bound ${bound}`);
      if (a.length >= 1000) assert(Math.abs(std - wantStd) < 0.1 * wantStd, `${ctx}: std ${std}`);
    }
  });
});

Deno.test("assignShards() splits into exactly N contiguous, non-empty, balanced shards", () => {
  assert.deepEqual(assignShards([10, 10, 10, 10], 2), [0, 0, 1, 1]);
  assert.deepEqual(assignShards([100, 1, 1], 3), [0, 1, 2]);
  assert.deepEqual(assignShards([1, 1, 100], 2), [0, 0, 1]);
  assert.deepEqual(assignShards([1, 1, 1, 100], 3), [0, 0, 1, 2]);
  assert.deepEqual(assignShards([5, 5, 5, 5, 5, 5], 3), [0, 0, 1, 1, 2, 2]);
  assert.throws(() => assignShards([1, 2], 3), RangeError);
});

Deno.test("make-model CLI writes a checkpoint and rejects bad flags with exit code 2", async () => {
  const run = async (...args: string[]) => {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "tools/make_model.ts", ...args],
      cwd: new URL("..", import.meta.url),
      stdout: "piped",
      stderr: "piped",
    }).output();
    return {
      code: out.code,
      stdout: new TextDecoder().decode(out.stdout),
      stderr: new TextDecoder().decode(out.stderr),
    };
  };
  await withTempDir("make_cli_", async (dir) => {
    const ok = await run("--out", dir, "--preset", "tiny-llama", "--dtype", "f16", "--seed", "7");
    assert.equal(ok.code, 0, ok.stderr);
    assert.match(ok.stdout, /^wrote tiny-llama \(f16/);
    assert.equal((await readJson(`${dir}/config.json`)).torch_dtype, "float16");
  });
  for (
    const bad of [
      ["--preset", "tiny-qwen3"],
      ["--out", "x", "--preset", "nope"],
      ["--out", "x", "--preset", "tiny-qwen3", "--dtype", "f64"],
      ["--out", "x", "--preset", "tiny-qwen3", "--shards", "0"],
      ["--out", "x", "--preset", "tiny-qwen3", "--seed", "-3"],
      ["--out", "x", "--preset", "tiny-qwen3", "--bogus"],
      ["--out", "x", "--preset", "tiny-qwen3", "--fp8-block", "64"],
      ["--out", "x", "--preset", "tiny-qwen3", "--fp8", "block", "--fp8-block", "0"],
      ["--out", "x", "--preset", "tiny-qwen3", "--fp8", "channel", "--fp8-block", "64"],
      ["--out", "x", "--preset", "tiny-qwen3", "--fp8", "int4"],
      ["--out", "x", "--preset", "tiny-gpt2", "--fp8", "block"],
      ["--out", "x", "--preset", "tiny-qwen3", "--gptq", "3"],
      ["--out", "x", "--preset", "tiny-qwen3", "--gptq", "4", "--awq"],
      ["--out", "x", "--preset", "tiny-qwen3", "--awq", "--asym"],
      ["--out", "x", "--preset", "tiny-qwen3", "--group-size", "32"],
      ["--out", "x", "--preset", "tiny-qwen3", "--awq", "--group-size", "0"],
      ["--out", "x", "--preset", "tiny-qwen3", "--awq", "--fp8", "block"],
      ["--out", "x", "--preset", "tiny-gpt2", "--gptq", "4"],
      ["--out", "x", "--preset", "tiny-qwen3", "--pack-quantized", "4", "--gptq-v2"],
      ["--out", "x", "--preset", "tiny-qwen3", "--pack-quantized", "4", "--gptq", "4"],
    ]
  ) {
    const r = await run(...bad);
    assert.equal(r.code, 2, `${bad.join(" ")}: ${r.stderr}`);
    assert.equal(r.stderr.trim().split("\n").length, 1, `${bad.join(" ")}: one line`);
    assert.match(r.stderr, /^make_model: /);
  }
});

Deno.test("parseMakeModelArgs() takes --fp8 block (blocks of 128 unless --fp8-block says), channel or tensor", () => {
  const base = ["--out", "x", "--preset", "tiny-qwen3"];
  assert.equal(parseMakeModelArgs(base).fp8, undefined);
  assert.deepEqual(parseMakeModelArgs([...base, "--fp8", "block"]).fp8, {
    scheme: "block",
    block: 128,
  });
  assert.deepEqual(parseMakeModelArgs([...base, "--fp8", "block", "--fp8-block", "24"]).fp8, {
    scheme: "block",
    block: 24,
  });
  assert.deepEqual(parseMakeModelArgs([...base, "--fp8", "channel"]).fp8, { scheme: "channel" });
  assert.deepEqual(parseMakeModelArgs([...base, "--fp8", "tensor"]).fp8, { scheme: "tensor" });
});

Deno.test("parseMakeModelArgs() takes --gptq 4|8 (with --asym, --act-order, --gptq-v2), --awq or --pack-quantized 4|8, in groups of 128 unless --group-size says", () => {
  const base = ["--out", "x", "--preset", "tiny-qwen3"];
  assert.equal(parseMakeModelArgs(base).packedInt, undefined);
  assert.deepEqual(parseMakeModelArgs([...base, "--gptq", "4"]).packedInt, {
    method: "gptq",
    bits: 4,
    groupSize: 128,
    symmetric: true,
    actOrder: false,
    v2: false,
  });
  assert.deepEqual(
    parseMakeModelArgs([
      ...base,
      ...["--gptq", "8", "--group-size=-1", "--asym", "--act-order", "--gptq-v2"],
    ]).packedInt,
    { method: "gptq", bits: 8, groupSize: -1, symmetric: false, actOrder: true, v2: true },
  );
  assert.deepEqual(parseMakeModelArgs([...base, "--awq", "--group-size", "32"]).packedInt, {
    method: "awq",
    bits: 4,
    groupSize: 32,
  });
  assert.deepEqual(
    parseMakeModelArgs([...base, "--pack-quantized", "8", "--asym", "--act-order"]).packedInt,
    { method: "compressed-tensors", bits: 8, groupSize: 128, symmetric: false, actOrder: true },
  );
});
