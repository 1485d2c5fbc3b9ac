/**
 * Fine-grained FP8 checkpoints (Qwen's `-FP8` format): the `float8_e4m3fn` decode table and the
 * encoder of test checkpoints against the format's definition, the block scales applied across
 * chunk boundaries, `quantization_config` accepted or refused in one line, the checkpoint reader
 * against an independent float64 dequantization (tests/reference/fp8.ts, which reads the bytes
 * itself), and greedy generation against the float64 reference on the dequantized weights.
 */

import assert from "node:assert/strict";
import { openCheckpoint } from "../engine/model/checkpoint.ts";
import {
  type Fp8Quantization,
  parseCheckpointQuantization,
} from "../engine/model/checkpoint_quantization.ts";
import { ConfigError } from "../engine/model/errors.ts";
import { applyFp8Scales, E4M3_VALUES } from "../engine/model/fp8.ts";
import { ModelRunner } from "../engine/model_runner.ts";
import { encodeE4m3, type Fp8CheckpointLayout } from "../tools/fp8_weights.ts";
import { makeModel } from "../tools/make_model.ts";
import { e4m3Value, fp8WeightRef } from "./reference/fp8.ts";
import { ReferenceModel } from "./reference/model.ts";
import { GPU_TEST, testContext } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import {
  assertGreedyMatchesReference,
  CHECKPOINT_GREEDY,
  SOLO_RUNNER_OPTIONS,
} from "./support/solo_run.ts";

Deno.test("E4M3_VALUES holds the value of every float8_e4m3fn byte", () => {
  for (let bits = 0; bits < 256; bits++) {
    const want = e4m3Value(bits);
    const got = E4M3_VALUES[bits]!;
    if (Number.isNaN(want)) assert.ok(Number.isNaN(got), `byte ${bits}`);
    else assert.equal(got, want, `byte ${bits}`);
  }
  // Anchors from the format: 1.0, the largest value, the smallest subnormal and normal, NaNs.
  assert.equal(E4M3_VALUES[0x38], 1);
  assert.equal(E4M3_VALUES[0x7e], 448);
  assert.equal(E4M3_VALUES[0xfe], -448);
  assert.equal(E4M3_VALUES[0x01], 2 ** -9);
  assert.equal(E4M3_VALUES[0x08], 2 ** -6);
  assert.ok(Number.isNaN(E4M3_VALUES[0x7f]!) && Number.isNaN(E4M3_VALUES[0xff]!));
});

/** The nearest code to `x` by scanning every finite code (ties to the even code). */
function nearestCode(x: number): number {
  let best = -1;
  let bestErr = Infinity;
  for (let c = 0; c < 256; c++) {
    const v = e4m3Value(c);
    if (Number.isNaN(v) || (c & 0x80) !== (x < 0 ? 0x80 : 0)) continue;
    const err = Math.abs(v - x);
    if (err < bestErr || (err === bestErr && c % 2 === 0)) {
      best = c;
      bestErr = err;
    }
  }
  return best;
}

Deno.test("encodeE4m3() rounds to the nearest code with ties to even and saturates at 448", () => {
  for (let c = 0; c < 256; c++) {
    if (c === 0x7f || c === 0xff) continue;
    assert.equal(encodeE4m3(e4m3Value(c)), c, `code ${c}`);
  }
  assert.equal(encodeE4m3(1.0625), 0x38, "halfway between 1 and 1.125: the even code");
  assert.equal(encodeE4m3(1.1875), 0x3a, "halfway between 1.125 and 1.25: the even code");
  assert.equal(encodeE4m3(2 ** -10), 0x00, "half the smallest subnormal");
  assert.equal(encodeE4m3(1e6), 0x7e);
  assert.equal(encodeE4m3(-464), 0xfe);
  const { seed, rng } = testSeed("encodeE4m3 random");
  for (let i = 0; i < 2000; i++) {
    const x = rng.normal() * 2 ** rng.int(-12, 9);
    const want = Math.abs(x) >= 448 ? (x < 0 ? 0xfe : 0x7e) : nearestCode(x);
    assert.equal(encodeE4m3(x), want, `seed ${seed}: ${x}`);
  }
});

Deno.test("applyFp8Scales() scales each element by its block when chunks start mid-block", () => {
  const { seed, rng } = testSeed("applyFp8Scales");
  const rows = 37;
  const cols = 50;
  const blockRows = 16;
  const blockCols = 24;
  const scaleCols = Math.ceil(cols / blockCols);
  const scales = Float32Array.from(
    { length: Math.ceil(rows / blockRows) * scaleCols },
    () => rng.uniform() + 0.01,
  );
  const values = Float32Array.from({ length: rows * cols }, () => E4M3_VALUES[rng.int(0, 126)]!);
  const out = values.slice();
  for (const [start, end] of [[0, 11], [11, 12], [12, 37]] as const) {
    applyFp8Scales(out.subarray(start * cols, end * cols), start, cols, {
      blockRows,
      blockCols,
      scaleCols,
      values: scales,
    });
  }
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const s = scales[Math.floor(r / blockRows) * scaleCols + Math.floor(c / blockCols)]!;
      const want = Math.fround(values[r * cols + c]! * s);
      assert.equal(out[r * cols + c], want, `seed ${seed}: [${r}, ${c}]`);
    }
  }
});

Deno.test("parseCheckpointQuantization() reads fine-grained FP8 and refuses other methods in one line", () => {
  const src = "config.json";
  assert.equal(parseCheckpointQuantization({}, src), null);
  assert.equal(parseCheckpointQuantization({ quantization_config: null }, src), null);
  assert.deepEqual(
    parseCheckpointQuantization({
      quantization_config: {
        quant_method: "fp8",
        fmt: "e4m3",
        activation_scheme: "dynamic",
        weight_block_size: [128, 64],
      },
    }, src),
    {
      method: "fp8",
      scaleSuffix: "weight_scale_inv",
      scaling: { kind: "block", rows: 128, cols: 64 },
    },
  );
  // compressed-tensors as llm-compressor's FP8_DYNAMIC and FP8_BLOCK schemes write it.
  const ct = (weights: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
    quantization_config: {
      quant_method: "compressed-tensors",
      format: "float-quantized",
      quantization_status: "compressed",
      config_groups: {
        group_0: {
          targets: ["Linear"],
          weights: { num_bits: 8, type: "float", symmetric: true, dynamic: false, ...weights },
          input_activations: { num_bits: 8, type: "float", strategy: "token", dynamic: true },
          output_activations: null,
        },
      },
      ignore: ["lm_head"],
      kv_cache_scheme: null,
      sparsity_config: { format: "dense" },
      ...extra,
    },
  });
  for (const strategy of ["channel", "tensor"] as const) {
    assert.deepEqual(parseCheckpointQuantization(ct({ strategy }), src), {
      method: "compressed-tensors",
      scaleSuffix: "weight_scale",
      scaling: { kind: strategy },
    });
  }
  assert.deepEqual(
    (parseCheckpointQuantization(
      ct({ strategy: "block", block_structure: [128, 128] }),
      src,
    ) as Fp8Quantization | null)?.scaling,
    { kind: "block", rows: 128, cols: 128 },
  );
  const refused: [unknown, RegExp][] = [
    [{ quant_method: "bitsandbytes" }, /"bitsandbytes".*--quantization int8\|int4/],
    [{ quant_method: "awq" }, /quantization_config\.bits undefined is not supported: AWQ/],
    [{ bits: 4 }, /quant_method undefined/],
    [
      { quant_method: "fp8", weight_block_size: [128, 128], activation_scheme: "static" },
      /activation_scheme "static" is not supported/,
    ],
    [{ quant_method: "fp8" }, /weight_block_size undefined is not supported/],
    [{ quant_method: "fp8", weight_block_size: [128, 128], fmt: "e5m2" }, /fmt "e5m2"/],
    [{ quant_method: "fp8", weight_block_size: [0, 128] }, /weight_block_size\.0 0/],
    ["fp8", /must be an object/],
    [ct({ strategy: "group", group_size: 128 }).quantization_config, /weights\.strategy "group"/],
    [ct({ strategy: "channel", num_bits: 4 }).quantization_config, /weights\.num_bits 4/],
    [ct({ strategy: "channel", type: "int" }).quantization_config, /weights\.type "int"/],
    [ct({ strategy: "block" }).quantization_config, /block strategy needs a block_structure/],
    [
      ct({ strategy: "channel" }, { kv_cache_scheme: { num_bits: 8 } }).quantization_config,
      /kv_cache_scheme \{"num_bits":8\}/,
    ],
    [
      ct({ strategy: "channel" }, { format: "pack-quantized" }).quantization_config,
      /weights\.type "float" is not supported: pack-quantized/,
    ],
    [
      {
        ...ct({ strategy: "channel" }).quantization_config,
        config_groups: {
          group_0: {
            weights: { num_bits: 8, type: "float", strategy: "channel" },
            input_activations: { num_bits: 8, type: "float", dynamic: false },
          },
        },
      },
      /input_activations \{.*"dynamic":false\} is not supported/,
    ],
  ];
  for (const [q, message] of refused) {
    assert.throws(() => parseCheckpointQuantization({ quantization_config: q }, src), (e) => {
      assert.ok(e instanceof ConfigError);
      assert.match(e.message, /^config\.json: /);
      assert.ok(!e.message.includes("\n"));
      assert.match(e.message, message);
      return true;
    });
  }
});

/**
 * Writes `preset` as an FP8 checkpoint, by default with blocks of 24 (edge blocks in every
 * matrix).
 */
async function fp8Model(
  dir: string,
  preset = "tiny-qwen3",
  seed = 7,
  fp8: Fp8CheckpointLayout = { scheme: "block", block: 24 },
): Promise<void> {
  await makeModel({ out: dir, preset, dtype: "bf16", seed, shards: 2, fp8 });
}

Deno.test("Checkpoint reads an FP8 weight as its bytes' values times their block scales", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await fp8Model(dir);
    const ck = await openCheckpoint(dir);
    try {
      assert.deepEqual((ck.quantization as Fp8Quantization | null)?.scaling, {
        kind: "block",
        rows: 24,
        cols: 24,
      });
      assert.ok(
        ![...ck.tensors.keys()].some((n) => n.endsWith("scale_inv")),
        "scales are no weights",
      );
      const name = "model.layers.1.mlp.gate_proj.weight";
      const t = ck.expectTensor(name, ck.tensor(name).shape);
      assert.equal(t.dtype, "F8_E4M3");
      const [rows, cols] = t.shape as [number, number];
      const want = await fp8WeightRef(ck, name);
      const got = await ck.readTensor(name, "f32");
      assert.equal(got.length, rows * cols);
      for (let i = 0; i < got.length; i++) {
        assert.equal(got[i], Math.fround(want[i]!), `element ${i}`);
      }
      // Chunks of 7 rows cross the 24-row blocks; f16 is the rounded f32 value.
      let seen = 0;
      for await (const chunk of ck.tensorChunks(name, "f16", 7 * cols * 4)) {
        assert.ok(chunk.data instanceof Float16Array);
        assert.ok(chunk.rows <= 7);
        for (let i = 0; i < chunk.data.length; i++) {
          const k = chunk.rowStart * cols + i;
          assert.equal(chunk.data[i], new Float16Array([Math.fround(want[k]!)])[0], `element ${k}`);
        }
        seen += chunk.rows;
      }
      assert.equal(seen, rows);
      // Norms and embeddings stay in the checkpoint dtype.
      assert.equal(ck.tensor("model.embed_tokens.weight").dtype, "BF16");
    } finally {
      ck.close();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Checkpoint.expectTensor() refuses FP8 weights without quantization_config or with a mis-shaped scale", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await fp8Model(dir);
    const configPath = `${dir}/config.json`;
    const config = JSON.parse(await Deno.readTextFile(configPath));
    const name = "model.layers.0.self_attn.o_proj.weight";
    const expectOne = async (pattern: RegExp) => {
      const ck = await openCheckpoint(dir);
      try {
        assert.throws(() => ck.expectTensor(name, ck.tensor(name).shape), (e) => {
          assert.ok(e instanceof Error && !e.message.includes("\n"));
          assert.match(e.message, pattern);
          return true;
        });
      } finally {
        ck.close();
      }
    };
    await Deno.writeTextFile(
      configPath,
      JSON.stringify({ ...config, quantization_config: undefined }),
    );
    await expectOne(
      /^model\.layers\.0\.self_attn\.o_proj\.weight: dtype F8_E4M3 .* no FP8 quantization_config/,
    );
    const q = { ...config.quantization_config, weight_block_size: [32, 32] };
    await Deno.writeTextFile(configPath, JSON.stringify({ ...config, quantization_config: q }));
    await expectOne(
      /^model\.layers\.0\.self_attn\.o_proj\.weight_scale_inv: expected shape \[\d+, \d+\] \(one scale per 32 x 32/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

const BLOCK_24: Fp8CheckpointLayout = { scheme: "block", block: 24 };

for (
  const [preset, quantization, fp8] of [
    ["tiny-qwen3", "none", BLOCK_24],
    ["tiny-qwen2", "none", BLOCK_24],
    ["tiny-llama", "none", BLOCK_24],
    ["tiny-qwen3", "int4", BLOCK_24],
    ["tiny-qwen3", "none", { scheme: "channel" }],
    ["tiny-llama", "none", { scheme: "tensor" }],
  ] as const
) {
  const layout = fp8.scheme === "block" ? "fine-grained (blocks of 24)" : `${fp8.scheme}-scaled`;
  Deno.test(
    `ModelRunner on a ${layout} FP8 ${preset} checkpoint${
      quantization === "none" ? "" : `, quantized again to ${quantization},`
    } generates the float64 reference's greedy tokens`,
    GPU_TEST,
    async () => {
      const dir = await Deno.makeTempDir();
      try {
        const { seed, rng } = testSeed(`fp8 runner ${preset} ${quantization} ${fp8.scheme}`);
        await fp8Model(dir, preset, seed % 1000, fp8);
        const ref = await ReferenceModel.load(
          dir,
          quantization === "none" ? {} : { quantize: quantization },
        );
        const ctx = await testContext({ forceF32: true });
        const runner = await ModelRunner.load(ctx, dir, { ...SOLO_RUNNER_OPTIONS, quantization });
        try {
          const scaled = fp8.scheme === "block"
            ? "per block of 24 x 24"
            : fp8.scheme === "channel"
            ? "per output channel"
            : "per tensor";
          assert.ok(
            runner.weights.notes.some((n) =>
              n.startsWith("FP8 (e4m3) weights") && n.includes(scaled)
            ),
            runner.weights.notes.join("; "),
          );
          await assertGreedyMatchesReference(runner, ref, rng, seed, CHECKPOINT_GREEDY);
        } finally {
          runner.destroy();
        }
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    },
  );
}
