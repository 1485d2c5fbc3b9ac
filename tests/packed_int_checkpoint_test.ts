/**
 * GPTQ, AWQ and compressed-tensors `pack-quantized` checkpoints (engine/model/packed_int.ts):
 * `quantization_config` accepted as Qwen's and llm-compressor's releases write it or refused in
 * one line, the packing against words written by hand from AutoGPTQ's, AutoAWQ's and
 * compressed-tensors' definitions, the checkpoint reader against an independent float64
 * dequantization (tests/reference/packed_int.ts, which reads the files itself), the codes kept
 * bit for bit in int4 / int8 where the format holds them, one-line refusals of malformed
 * weights, and greedy generation against the float64 reference on the dequantized weights.
 */

import assert from "node:assert/strict";
import { openCheckpoint } from "../engine/model/checkpoint.ts";
import {
  type CheckpointQuantization,
  type PackedIntQuantization,
  parseCheckpointQuantization,
  resolveQuantization,
} from "../engine/model/checkpoint_quantization.ts";
import { CheckpointError, ConfigError } from "../engine/model/errors.ts";
import {
  dequantizePackedRows,
  exactQuantizedRows,
  type PackedWeight,
} from "../engine/model/packed_int.ts";
import {
  encodeTensorData,
  SafetensorsFile,
  writeSafetensors,
} from "../engine/model/safetensors.ts";
import { ModelRunner } from "../engine/model_runner.ts";
import { makeModel } from "../tools/make_model.ts";
import type { PackedIntLayout } from "../tools/packed_int_weights.ts";
import { ReferenceModel } from "./reference/model.ts";
import { packedWeightRef } from "./reference/packed_int.ts";
import { unpackRef } from "./reference/quant.ts";
import { GPU_TEST, testContext } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import {
  assertGreedyMatchesReference,
  CHECKPOINT_GREEDY,
  SOLO_RUNNER_OPTIONS,
} from "./support/solo_run.ts";

/** Asserts that `fn` throws `kind` with a one-line message matching `pattern`. */
function assertOneLine(
  fn: () => unknown,
  kind: new (...args: never[]) => Error,
  pattern: RegExp,
): void {
  assert.throws(fn, (e) => {
    assert.ok(e instanceof kind, String(e));
    assert.ok(!e.message.includes("\n"), e.message);
    assert.match(e.message, pattern);
    return true;
  });
}

Deno.test("parseCheckpointQuantization() reads GPTQ and AWQ configs as Qwen's releases write them, and refuses their variants in one line", () => {
  const src = "config.json";
  // Qwen2.5-7B-Instruct-GPTQ-Int4's quantization_config (optimum's fields, abridged).
  const qwenGptq = {
    batch_size: 1,
    bits: 4,
    block_name_to_quantize: null,
    damp_percent: 0.01,
    desc_act: false,
    exllama_config: { version: 1 },
    group_size: 128,
    modules_in_block_to_quantize: null,
    quant_method: "gptq",
    sym: true,
    true_sequential: true,
    use_exllama: true,
  };
  assert.deepEqual(parseCheckpointQuantization({ quantization_config: qwenGptq }, src), {
    method: "gptq",
    layout: "gptq",
    bits: 4,
    groupSize: 128,
    actOrder: false,
    symmetric: true,
    zeroOffset: 1,
  });
  assert.deepEqual(
    parseCheckpointQuantization({
      quantization_config: {
        ...qwenGptq,
        bits: 8,
        group_size: -1,
        desc_act: true,
        sym: false,
        checkpoint_format: "gptq_v2",
      },
    }, src),
    {
      method: "gptq",
      layout: "gptq",
      bits: 8,
      groupSize: null,
      actOrder: true,
      symmetric: false,
      zeroOffset: 0,
    },
  );
  // Qwen3-8B-AWQ's.
  const qwenAwq = {
    bits: 4,
    group_size: 128,
    modules_to_not_convert: null,
    quant_method: "awq",
    version: "gemm",
    zero_point: true,
  };
  assert.deepEqual(parseCheckpointQuantization({ quantization_config: qwenAwq }, src), {
    method: "awq",
    layout: "awq",
    bits: 4,
    groupSize: 128,
    actOrder: false,
    symmetric: false,
    zeroOffset: 0,
  });
  // llm-compressor's W4A16 scheme (RedHatAI's `-quantized.w4a16` models), abridged.
  const w4a16 = (weights: Record<string, unknown> = {}, extra: Record<string, unknown> = {}) => ({
    quant_method: "compressed-tensors",
    format: "pack-quantized",
    quantization_status: "compressed",
    config_groups: {
      group_0: {
        targets: ["Linear"],
        weights: {
          num_bits: 4,
          type: "int",
          symmetric: true,
          strategy: "group",
          group_size: 128,
          actorder: "weight",
          dynamic: false,
          observer: "minmax",
          ...weights,
        },
        input_activations: null,
        output_activations: null,
        format: "pack-quantized",
      },
    },
    ignore: ["lm_head"],
    kv_cache_scheme: null,
    sparsity_config: {},
    ...extra,
  });
  assert.deepEqual(parseCheckpointQuantization({ quantization_config: w4a16() }, src), {
    method: "compressed-tensors",
    layout: "pack-quantized",
    bits: 4,
    groupSize: 128,
    actOrder: false,
    symmetric: true,
    zeroOffset: 0,
  });
  assert.deepEqual(
    parseCheckpointQuantization({
      quantization_config: w4a16({
        num_bits: 8,
        strategy: "channel",
        group_size: null,
        symmetric: false,
        actorder: "group",
      }),
    }, src),
    {
      method: "compressed-tensors",
      layout: "pack-quantized",
      bits: 8,
      groupSize: null,
      actOrder: true,
      symmetric: false,
      zeroOffset: 0,
    },
  );
  const refused: [unknown, RegExp][] = [
    [w4a16({ num_bits: 2 }), /weights\.num_bits 2 is not supported: pack-quantized/],
    [w4a16({ strategy: "tensor" }), /weights\.strategy "tensor"/],
    [w4a16({ strategy: "group", group_size: null }), /the group strategy needs a group_size/],
    [
      w4a16({}, { kv_cache_scheme: { num_bits: 8, type: "float" } }),
      /kv_cache_scheme \{.*\} is not supported: pack-quantized/,
    ],
    [
      {
        ...w4a16(),
        config_groups: {
          group_0: {
            weights: w4a16().config_groups.group_0.weights,
            input_activations: { num_bits: 8, type: "int", dynamic: true },
          },
        },
      },
      /input_activations \{.*\} is not supported/,
    ],
    [{ ...qwenGptq, bits: 3 }, /quantization_config\.bits 3 is not supported: GPTQ/],
    [{ ...qwenGptq, group_size: 0 }, /group_size 0/],
    [{ ...qwenGptq, group_size: undefined }, /group_size undefined/],
    [{ ...qwenGptq, checkpoint_format: "marlin" }, /checkpoint_format "marlin"/],
    [{ ...qwenGptq, dynamic: { "-:.*lm_head": {} } }, /dynamic \{.*\} is not supported/],
    [{ ...qwenAwq, version: "gemv" }, /version "gemv" is not supported: AWQ/],
    [{ ...qwenAwq, zero_point: false }, /zero_point false/],
    [{ ...qwenAwq, bits: 8 }, /bits 8/],
    [{ quant_method: "bitsandbytes", load_in_4bit: true }, /quant_method "bitsandbytes".*AWQ/],
  ];
  for (const [q, message] of refused) {
    assertOneLine(
      () => parseCheckpointQuantization({ quantization_config: q }, src),
      ConfigError,
      message,
    );
  }
});

/** A `PackedWeight` of one group, for words written by hand. */
function handWeight(
  quantization: PackedIntQuantization,
  rows: number,
  cols: number,
  qweight: number[],
  qzeros: number[],
  scales: number[],
): PackedWeight {
  return {
    quantization,
    rows,
    cols,
    qweight: Uint32Array.from(qweight),
    qzeros: Uint32Array.from(qzeros),
    scales: Float32Array.from(scales),
    groupOf: new Int32Array(cols),
  };
}

Deno.test("dequantizePackedRows() reads GPTQ codes along the inputs and AWQ codes in AutoAWQ's interleaved order", () => {
  const gptq: PackedIntQuantization = {
    method: "gptq",
    layout: "gptq",
    bits: 4,
    groupSize: null,
    actOrder: false,
    symmetric: true,
    zeroOffset: 1,
  };
  // GPTQ, one output, 8 inputs: input i's code i in bits 4i..4i+3 of the word; the zero stored
  // as 7 means 8 (the gptq format keeps zero - 1); 8 outputs share the zeros' word.
  const g = handWeight(gptq, 8, 8, [], [0x77777777], [0.5, 1, 1, 1, 1, 1, 1, 1]);
  const words = new Uint32Array(8);
  words[0] = 0x76543210; // output 0: codes 0..7 for inputs 0..7
  const gw = { ...g, qweight: words };
  const out = new Float32Array(8 * 8);
  dequantizePackedRows(gw, 0, out);
  assert.deepEqual([...out.subarray(0, 8)], [-4, -3.5, -3, -2.5, -2, -1.5, -1, -0.5]);
  assert.deepEqual([...out.subarray(8, 16)], Array(8).fill(-8), "code 0, zero 8, scale 1");
  // gptq_v2 keeps the zero as it is.
  const v2 = { ...gw, quantization: { ...gptq, zeroOffset: 0 as const } };
  dequantizePackedRows(v2, 0, out);
  assert.deepEqual([...out.subarray(0, 8)], [-3.5, -3, -2.5, -2, -1.5, -1, -0.5, 0]);

  // AWQ, one input, 8 outputs: AutoAWQ packs value k of a word from output [0, 2, 4, 6, 1, 3,
  // 5, 7][k]; outputs with codes 0..7 and zeros 0 so pack to 0x75316420, and so do the zeros.
  const awq: PackedIntQuantization = {
    ...gptq,
    method: "awq",
    layout: "awq",
    symmetric: false,
    zeroOffset: 0,
  };
  const a = handWeight(awq, 8, 1, [0x75316420], [0], Array(8).fill(0.25));
  const col = new Float32Array(8);
  dequantizePackedRows(a, 0, col);
  assert.deepEqual([...col], [0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75]);
  dequantizePackedRows(
    { ...a, qweight: Uint32Array.of(0), qzeros: Uint32Array.of(0x75316420) },
    0,
    col,
  );
  assert.deepEqual([...col], [0, -0.25, -0.5, -0.75, -1, -1.25, -1.5, -1.75]);

  // compressed-tensors, 2 outputs, 8 inputs: weight_packed [2, 1], input j's unsigned code in
  // bits 4j.. of its row's word; symmetric codes are that minus 8 (no zero point tensor).
  const ct: PackedIntQuantization = {
    ...gptq,
    method: "compressed-tensors",
    layout: "pack-quantized",
    zeroOffset: 0,
  };
  const c = {
    ...handWeight(ct, 2, 8, [0x76543210, 0xfedcba98], [], [1, 0.5]),
    qzeros: null,
  };
  const rows2 = new Float32Array(16);
  dequantizePackedRows(c, 0, rows2);
  assert.deepEqual([...rows2], [-8, -7, -6, -5, -4, -3, -2, -1, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5]);
  // With zero points: weight_zero_point [1, 1] packs outputs 0 and 1 along its rows (zero 9
  // and 6 unsigned: +1 and -2 signed).
  const z = { ...c, qzeros: Uint32Array.of(0x69), quantization: { ...ct, symmetric: false } };
  dequantizePackedRows(z, 0, rows2);
  assert.deepEqual([...rows2.subarray(0, 3)], [-9, -8, -7]);
  assert.deepEqual([...rows2.subarray(8, 11)], [1, 1.5, 2]);
});

/** The checkpoints of these tests: tiny presets, two shards, every layout variant. */
const LAYOUTS: readonly [string, PackedIntLayout][] = [
  ["tiny-qwen3", { method: "gptq", bits: 4, groupSize: 32 }],
  ["tiny-llama", { method: "gptq", bits: 8, groupSize: -1, symmetric: false, v2: true }],
  ["tiny-qwen2", { method: "gptq", bits: 4, groupSize: 32, symmetric: false, actOrder: true }],
  ["tiny-qwen2", { method: "awq", bits: 4, groupSize: 64 }],
  ["tiny-qwen3", { method: "compressed-tensors", bits: 4, groupSize: 32 }],
  ["tiny-llama", { method: "compressed-tensors", bits: 8, groupSize: -1, symmetric: false }],
  [
    "tiny-qwen2",
    { method: "compressed-tensors", bits: 4, groupSize: 32, symmetric: false, actOrder: true },
  ],
];

function describe(layout: PackedIntLayout): string {
  if (layout.method === "awq") return `AWQ (groups of ${layout.groupSize})`;
  const name = layout.method === "gptq" ? "GPTQ" : "pack-quantized";
  return `${name} ${layout.bits}-bit (${
    layout.groupSize === -1 ? "one group per row" : `groups of ${layout.groupSize}`
  }${layout.symmetric === false ? ", zero points" : ""}${layout.actOrder ? ", act-order" : ""}${
    layout.v2 ? ", gptq_v2" : ""
  })`;
}

async function withPacked(
  preset: string,
  layout: PackedIntLayout,
  seed: number,
  fn: (dir: string) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir();
  try {
    await makeModel({ out: dir, preset, dtype: "bf16", seed, shards: 2, packedInt: layout });
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

for (const [preset, layout] of LAYOUTS) {
  Deno.test(`Checkpoint reads a ${describe(layout)} ${preset} checkpoint as the float64 reference's dequantized weights`, async () => {
    await withPacked(preset, layout, 11, async (dir) => {
      const ck = await openCheckpoint(dir);
      try {
        const q = ck.quantization as PackedIntQuantization;
        const names = [...ck.tensors.keys()];
        assert.ok(
          !names.some((n) => /\.(qweight|qzeros|scales|g_idx|weight_[a-z_]+)$/.test(n)),
          "parts are no weights",
        );
        const packed = names.filter((n) => ck.tensor(n).dtype.endsWith(`_I${layout.bits}`));
        assert.equal(packed.length, 7 * ck.config.numLayers, "every projection");
        for (const name of packed) {
          const t = ck.expectTensor(name, ck.tensor(name).shape);
          const [rows, cols] = t.shape as [number, number];
          const want = await packedWeightRef(dir, name, q);
          assert.deepEqual([want.rows, want.cols], [rows, cols], name);
          const got = await ck.readTensor(name, "f32");
          for (let i = 0; i < got.length; i++) {
            assert.equal(got[i], want.data[i], `${name} element ${i}`);
          }
          // Chunks of 3 rows, in f16: the rounded values.
          let seen = 0;
          for await (const chunk of ck.tensorChunks(name, "f16", 3 * cols * 4)) {
            assert.ok(chunk.data instanceof Float16Array && chunk.rows <= 3);
            for (let i = 0; i < chunk.data.length; i++) {
              const k = chunk.rowStart * cols + i;
              assert.equal(chunk.data[i], Math.f16round(want.data[k]!), `${name} element ${k}`);
            }
            seen += chunk.rows;
          }
          assert.equal(seen, rows);
        }
      } finally {
        ck.close();
      }
    });
  });
}

Deno.test("exactQuantizedRows() keeps GPTQ's symmetric 4-bit codes in int4 and every 4- or 8-bit code in int8, bit for bit, and says why not otherwise", async () => {
  const expectations: [string, PackedIntLayout, { int4: RegExp | null; int8: RegExp | null }][] = [
    ["tiny-qwen3", LAYOUTS[0]![1], { int4: null, int8: null }],
    // 8-bit with zero points: code - zero spans -255..255.
    ["tiny-llama", LAYOUTS[1]![1], { int4: /outside int4's -8\.\.7/, int8: /outside int8's/ }],
    ["tiny-qwen2", LAYOUTS[2]![1], {
      int4: /inputs 0\.\.31 span the checkpoint's groups \d+ and \d+/,
      int8: /span the checkpoint's groups/,
    }],
    ["tiny-qwen2", LAYOUTS[3]![1], { int4: /code - zero (8|-9) at row/, int8: null }],
    // 8-bit symmetric: codes 0..255 around 128, -128 included.
    ["tiny-qwen3", { method: "gptq", bits: 8, groupSize: 32 }, { int4: /outside/, int8: null }],
    ["tiny-qwen3", LAYOUTS[4]![1], { int4: null, int8: null }],
    ["tiny-llama", LAYOUTS[5]![1], { int4: /outside/, int8: /outside int8's/ }],
    ["tiny-qwen3", { method: "compressed-tensors", bits: 8, groupSize: 32 }, {
      int4: /outside/,
      int8: null,
    }],
  ];
  for (const [preset, layout, want] of expectations) {
    await withPacked(preset, layout, 5, async (dir) => {
      const ck = await openCheckpoint(dir);
      try {
        const q = ck.quantization as PackedIntQuantization;
        const name = "model.layers.1.mlp.down_proj.weight";
        const w = (await ck.packedWeight(name))!;
        const ref = await packedWeightRef(dir, name, q);
        let sawMin = false;
        for (const format of ["int4", "int8"] as const) {
          const got = exactQuantizedRows(w, format);
          const context = `${describe(layout)} ${format}`;
          if (want[format] !== null) {
            assert.equal(typeof got, "string", context);
            assert.match(got as string, want[format]!, context);
            continue;
          }
          if (typeof got === "string") assert.fail(`${context}: ${got}`);
          // The format's words and scales give back the checkpoint's values exactly.
          const codes = unpackRef(got.words, format === "int4" ? 4 : 8);
          for (let i = 0; i < codes.length; i++) {
            const value: number = codes[i]! * got.scales[Math.floor(i / 32)]!;
            assert.equal(value, ref.data[i], `${context} element ${i}`);
            if (codes[i] === -128) sawMin = true;
          }
        }
        if (layout.bits === 8 && layout.symmetric !== false) assert.ok(sawMin, "a -128 code");
        assert.equal(await ck.packedWeight("model.norm.weight"), null);
      } finally {
        ck.close();
      }
    });
  }
});

Deno.test("Checkpoint refuses a GPTQ weight whose parts do not match its config or whose g_idx names no group, in one line", async () => {
  await withPacked("tiny-qwen3", { method: "gptq", bits: 4, groupSize: 32 }, 3, async (dir) => {
    const configPath = `${dir}/config.json`;
    const config = JSON.parse(await Deno.readTextFile(configPath));
    const name = "model.layers.0.self_attn.o_proj.weight";
    const expectOne = async (pattern: RegExp, via: "expect" | "read" = "expect") => {
      const ck = await openCheckpoint(dir);
      try {
        if (via === "expect") {
          assertOneLine(() => ck.expectTensor(name, [64, 128]), CheckpointError, pattern);
        } else {
          await assert.rejects(() => ck.packedWeight(name), (e) => {
            assert.ok(e instanceof CheckpointError && !e.message.includes("\n"));
            assert.match(e.message, pattern);
            return true;
          });
        }
      } finally {
        ck.close();
      }
    };
    const withConfig = (q: Record<string, unknown>) =>
      Deno.writeTextFile(
        configPath,
        JSON.stringify({ ...config, quantization_config: { ...config.quantization_config, ...q } }),
      );
    // 8-bit codes would make the qweight a [64, 64] weight.
    await withConfig({ bits: 8 });
    await expectOne(
      /^model\.layers\.0\.self_attn\.o_proj\.weight: expected shape \[64, 128\], found \[64, 64\] \(its qweight \[16, 64\]\)/,
    );
    await withConfig({ group_size: 64 });
    await expectOne(
      /^model\.layers\.0\.self_attn\.o_proj\.qzeros: expected shape \[2, 8\] \(GPTQ 4-bit, 2 groups, weight \[64, 128\]\), found \[4, 8\]/,
    );
    await withConfig({});
    // A g_idx entry past the last group.
    const shard = [...Deno.readDirSync(dir)].map((e) => e.name).filter((n) =>
      n.endsWith(".safetensors")
    );
    for (const file of shard) {
      const f = await SafetensorsFile.open(`${dir}/${file}`);
      const t = f.tensors.get("model.layers.0.self_attn.o_proj.g_idx");
      f.close();
      if (t === undefined) continue;
      const h = await Deno.open(`${dir}/${file}`, { write: true });
      await h.seek(t.fileOffset + 4 * 5, Deno.SeekMode.Start);
      await h.write(new Uint8Array(Int32Array.of(9).buffer));
      h.close();
    }
    await expectOne(/g_idx: input 5 is in group 9, but there are 4 groups/, "read");
  });
  // GPT-2 has no GPTQ path here.
  const dir = await Deno.makeTempDir();
  try {
    await makeModel({ out: dir, preset: "tiny-gpt2", dtype: "f32", seed: 1 });
    const config = JSON.parse(await Deno.readTextFile(`${dir}/config.json`));
    await Deno.writeTextFile(
      `${dir}/config.json`,
      JSON.stringify({
        ...config,
        quantization_config: { quant_method: "gptq", bits: 4, group_size: 128 },
      }),
    );
    await assert.rejects(() => openCheckpoint(dir), /GPTQ weights are read for the Llama-family/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** Runs: checkpoint, `--quantization`, and whether the engine keeps the codes as they are. */
const RUNS: readonly [string, PackedIntLayout, "none" | "int8" | "int4", boolean][] = [
  ["tiny-qwen3", LAYOUTS[0]![1], "none", false],
  ["tiny-qwen3", LAYOUTS[0]![1], "int4", true],
  ["tiny-llama", { method: "gptq", bits: 8, groupSize: 32 }, "int8", true],
  ["tiny-llama", LAYOUTS[1]![1], "int8", false],
  ["tiny-qwen2", LAYOUTS[2]![1], "none", false],
  ["tiny-qwen2", LAYOUTS[3]![1], "int8", true],
  ["tiny-qwen2", LAYOUTS[3]![1], "int4", false],
  ["tiny-qwen3", LAYOUTS[4]![1], "int4", true],
  ["tiny-qwen2", LAYOUTS[6]![1], "none", false],
];

for (const [preset, layout, quantization, kept] of RUNS) {
  Deno.test(
    `ModelRunner on a ${describe(layout)} ${preset} checkpoint${
      quantization === "none"
        ? ""
        : kept
        ? `, its codes kept in ${quantization},`
        : `, quantized again to ${quantization},`
    } generates the float64 reference's greedy tokens`,
    GPU_TEST,
    async () => {
      const { seed, rng } = testSeed(`packed runner ${preset} ${describe(layout)} ${quantization}`);
      await withPacked(preset, layout, seed % 1000, async (dir) => {
        const ref = await ReferenceModel.load(
          dir,
          quantization === "none" ? {} : { quantize: quantization, keepPacked: kept },
        );
        const ctx = await testContext({ forceF32: true });
        const runner = await ModelRunner.load(ctx, dir, { ...SOLO_RUNNER_OPTIONS, quantization });
        try {
          const notes = runner.weights.notes.join("; ");
          const head = layout.method === "awq"
            ? "AWQ 4-bit weights"
            : layout.method === "gptq"
            ? `GPTQ ${layout.bits}-bit`
            : `compressed-tensors pack-quantized ${layout.bits}-bit`;
          assert.ok(runner.weights.notes[0]?.startsWith(head), notes);
          if (quantization === "none") assert.match(notes, /dequantized while loading to f32/);
          else if (kept) {
            assert.match(notes, new RegExp(`codes and scales in ${quantization}, exactly`));
          } else {
            assert.match(notes, new RegExp(`dequantized and quantized again to ${quantization}`));
          }
          await assertGreedyMatchesReference(runner, ref, rng, seed, CHECKPOINT_GREEDY);
        } finally {
          runner.destroy();
        }
      });
    },
  );
}

Deno.test("resolveQuantization() makes auto a packed checkpoint's exact format where there is one, int8 else, and none for other checkpoints", () => {
  const gptq4 = parseCheckpointQuantization({
    quantization_config: { quant_method: "gptq", bits: 4, group_size: 128, sym: true },
  }, "c")!;
  const cases: [CheckpointQuantization | null, string][] = [
    [null, "none"],
    [
      parseCheckpointQuantization({
        quantization_config: { quant_method: "fp8", weight_block_size: [128, 128] },
      }, "c"),
      "none",
    ],
    [gptq4, "int4"],
    [{ ...gptq4, symmetric: false } as CheckpointQuantization, "int8"],
    [{ ...gptq4, actOrder: true } as CheckpointQuantization, "int8"],
    [{ ...gptq4, actOrder: true, groupSize: null } as CheckpointQuantization, "int4"],
    [{ ...gptq4, bits: 8 } as CheckpointQuantization, "int8"],
  ];
  for (const [q, want] of cases) {
    assert.equal(resolveQuantization("auto", q), want, JSON.stringify(q));
    // An explicit choice stands.
    assert.equal(resolveQuantization("none", q), "none");
    assert.equal(resolveQuantization("int4", q), "int4");
  }
});

Deno.test(
  "ModelRunner loads a packed checkpoint in its own format by default (quantization auto)",
  GPU_TEST,
  async () => {
    const cases: [string, PackedIntLayout | undefined, string, RegExp | null][] = [
      ["tiny-qwen3", LAYOUTS[0]![1], "int4", /codes and scales in int4, exactly/],
      ["tiny-qwen2", LAYOUTS[3]![1], "int8", /codes and scales in int8, exactly/],
      ["tiny-qwen2", LAYOUTS[2]![1], "int8", /dequantized and quantized again to int8/],
      ["tiny-qwen3", undefined, "none", null],
    ];
    const ctx = await testContext({ forceF32: true });
    for (const [preset, layout, want, note] of cases) {
      const dir = await Deno.makeTempDir();
      try {
        await makeModel({
          out: dir,
          preset,
          dtype: "bf16",
          seed: 2,
          ...(layout !== undefined ? { packedInt: layout } : {}),
        });
        const runner = await ModelRunner.load(ctx, dir, SOLO_RUNNER_OPTIONS);
        try {
          assert.equal(runner.weights.quantization, want, `${preset} ${JSON.stringify(layout)}`);
          if (note === null) assert.deepEqual(runner.weights.notes, []);
          else assert.match(runner.weights.notes.join("; "), note);
        } finally {
          runner.destroy();
        }
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    }
  },
);

Deno.test(
  "ModelRunner leaves out the all-zero biases old GPTQ files carry beside packed weights, and refuses a non-zero one",
  GPU_TEST,
  async () => {
    await withPacked("tiny-llama", LAYOUTS[0]![1], 4, async (dir) => {
      // As AutoGPTQ / GPTQ-for-LLaMa wrote them: a bias for every projection, in a shard of its own.
      const indexPath = `${dir}/model.safetensors.index.json`;
      const index = JSON.parse(await Deno.readTextFile(indexPath));
      const config = JSON.parse(await Deno.readTextFile(`${dir}/config.json`));
      const biases = Object.keys(index.weight_map)
        .filter((n) => n.endsWith("_proj.qweight"))
        .map((n) => n.replace(/qweight$/, "bias"));
      const write = async (nonZero: boolean) => {
        await writeSafetensors(
          `${dir}/model-biases.safetensors`,
          biases.map((name, k) => {
            const rows = name.includes("mlp.gate") || name.includes("mlp.up")
              ? config.intermediate_size
              : name.includes("k_proj") || name.includes("v_proj")
              ? config.num_key_value_heads * (config.hidden_size / config.num_attention_heads)
              : config.hidden_size;
            const values = new Float32Array(rows);
            if (nonZero && k === 3) values[1] = 0.5;
            return {
              name,
              dtype: "F16",
              shape: [rows],
              data: () => encodeTensorData(values, "F16"),
            };
          }),
        );
        for (const b of biases) index.weight_map[b] = "model-biases.safetensors";
        await Deno.writeTextFile(indexPath, JSON.stringify(index));
      };
      const ctx = await testContext({ forceF32: true });
      await write(false);
      const runner = await ModelRunner.load(ctx, dir, SOLO_RUNNER_OPTIONS);
      try {
        assert.match(
          runner.weights.notes.join("; "),
          new RegExp(`${biases.length} all-zero bias tensor\\(s\\) beside packed weights left out`),
        );
      } finally {
        runner.destroy();
      }
      await write(true);
      await assert.rejects(
        () => ModelRunner.load(ctx, dir, SOLO_RUNNER_OPTIONS),
        new RegExp(
          `1 weight\\(s\\) the LlamaForCausalLM config does not account for: ${
            biases[3]!.replaceAll(".", "\\.")
          } `,
        ),
      );
    });
  },
);
