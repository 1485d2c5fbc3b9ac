/**
 * int8 / int4 weights (gpu/quant.ts): the packing matches the format as written
 * (tests/reference/quant.ts), and every matmul kernel, under both kernel profiles, multiplies by
 * the dequantized weights `w' = q * s` as a float64 reference does (odd M and N, K a multiple of
 * 32, poisoned outputs, weights split across parts).
 */

import assert from "node:assert/strict";
import { type GpuContext, STORAGE_RW } from "../gpu/context.ts";
import {
  blockScales,
  deviceScaleIndex,
  GROUP,
  type QuantFormat,
  quantizeRows,
  TEXTURE_LAYER_ROWS,
  WORD_BLOCK_ROWS,
  type WordLayout,
} from "../gpu/quant.ts";
import { GpuMatrix, type QuantizedMatrixOptions } from "../gpu/tensor.ts";
import { Matmul, TILE_CANDIDATES, type XForm } from "../kernels/matmul.ts";
import { kernelSource } from "../kernels/matmul_kernels.ts";
import { TILE, tileName } from "../kernels/matmul_tile.ts";
import { assertClose } from "./support/assert_close.ts";
import {
  GPU_TEST,
  ParamArena,
  poisonedF32,
  readF32,
  readU32,
  runPass,
  testContext,
  upload,
  whole,
} from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { forced, QUANT_TEST_VARIANTS, type TestVariant } from "./support/matmul_variants.ts";
import { matmulRef, sumFloorFraction, termFloor } from "./reference/matmul.ts";
import { siluMulRef } from "./reference/activations.ts";
import { quantizeRef, unpackRef } from "./reference/quant.ts";

const FORMATS: readonly QuantFormat[] = ["int8", "int4"];

Deno.test("quantizeRows() packs the values and f16 scales the format's text defines", () => {
  for (const format of FORMATS) {
    const { seed, rng } = testSeed(`quantizeRows ${format}`);
    const cols = 96;
    const values = rng.array(5 * cols, -2, 2);
    // Edge cases: an all-zero group, a group with exact ties (w / s = k + 0.5), a lone large
    // value, tiny values that underflow the f16 scale.
    values.fill(0, 0, 32);
    for (let i = 32; i < 64; i++) values[i] = (i % 2 === 0 ? 1 : -1) * ((i % 8) + 0.5);
    values[32] = format === "int4" ? 7 : 127;
    values[100] = 1000;
    for (let i = 128; i < 160; i++) values[i] = 1e-9 * (i - 140);
    const got = quantizeRows(values, cols, format);
    const ref = quantizeRef(values, cols, format);
    assert.deepEqual([...got.scales], [...ref.scales], `seed ${seed} ${format}: scales`);
    assert.deepEqual(
      [...unpackRef(got.words, format === "int4" ? 4 : 8)],
      [...ref.q],
      `seed ${seed} ${format}: packed values`,
    );
    assert.equal(got.words.length, (values.length * (format === "int4" ? 4 : 8)) / 32);
  }
  assert.throws(() => quantizeRows(new Float32Array(40), 40, "int4"), /multiple of 32/);
  assert.throws(() => quantizeRows([1e9, ...new Array(31).fill(0)], 32, "int4"), /overflows f16/);
});

Deno.test("blockScales() lays a part's scales out in blocks of 8 rows, the last one padded with zeros", () => {
  const rows = 11;
  const groups = 3;
  const scales = Float16Array.from({ length: rows * groups }, (_, i) => i + 1);
  const blocked = blockScales(scales, rows, groups);
  assert.equal(blocked.length, 16 * groups);
  // Block 0: group 0's scales of rows 0..7, then group 1's, group 2's; block 1: rows 8..15.
  assert.deepEqual([...blocked.subarray(0, 8)], [1, 4, 7, 10, 13, 16, 19, 22]);
  assert.deepEqual([...blocked.subarray(8, 16)], [2, 5, 8, 11, 14, 17, 20, 23]);
  assert.deepEqual([...blocked.subarray(24, 32)], [25, 28, 31, 0, 0, 0, 0, 0]);
  for (let r = 0; r < rows; r++) {
    for (let g = 0; g < groups; g++) {
      assert.equal(blocked[deviceScaleIndex(r, g, groups)], scales[r * groups + g]);
    }
  }
  assert.equal(blocked.filter((v) => v === 0).length, 5 * groups);
  assert.throws(() => blockScales(scales, rows, 4), RangeError);
});

Deno.test(
  "GpuMatrix.writeWords() lays int8 / int4 rows out in blocks of 16 rows, whatever the chunks",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const format of FORMATS) {
      const { seed, rng } = testSeed(`word blocks ${format}`);
      const rows = 37;
      const cols = 64;
      const u = format === "int4" ? 4 : 8; // words per group
      const perRow = 2 * u;
      const words = Uint32Array.from({ length: rows * perRow }, () => rng.int(1, 0xffffffff));
      // Parts of 32 rows (two blocks): rows 32..36 are a second part, one partial block.
      const m = GpuMatrix.createQuantized(ctx, "w", rows, cols, format, {
        wordBlock: 16,
        maxPartBytes: 32 * perRow * 4,
      });
      try {
        assert.deepEqual(m.parts.map((p) => [p.rowStart, p.rows]), [[0, 32], [32, 5]]);
        // Chunks that start and end inside blocks and cross the parts' boundary.
        for (const [lo, hi] of [[0, 5], [5, 21], [21, 35], [35, 37]] as const) {
          m.writeWords(ctx.device.queue, lo, words.subarray(lo * perRow, hi * perRow));
        }
        for (const part of m.parts) {
          // Block b, group g: the group's words of the block's 16 rows, row by row (zeros past
          // the part's last row).
          const expected = new Uint32Array(Math.ceil(part.rows / 16) * 16 * perRow);
          let i = 0;
          for (let b = 0; b < expected.length / (16 * perRow); b++) {
            for (let g = 0; g < 2; g++) {
              for (let r = 16 * b; r < 16 * b + 16; r++, i += u) {
                if (r >= part.rows) continue;
                const src = (part.rowStart + r) * perRow + g * u;
                expected.set(words.subarray(src, src + u), i);
              }
            }
          }
          const got = await readU32(ctx, part.buffer);
          assert.deepEqual([...got], [...expected], `seed ${seed} ${format} part ${part.rowStart}`);
        }
      } finally {
        m.destroy();
      }
    }
  },
);

type Shape = readonly [m: number, n: number, k: number];

/**
 * The matrix options of a case: its word layout when given; else the kernel profile's where the
 * kernel can read it (words in a texture: `unrolled` under the cpu policy only), else a buffer.
 */
function layoutOptions(
  kernel: Matmul,
  variant: TestVariant | undefined,
  layout: WordLayout | undefined,
): QuantizedMatrixOptions {
  if (layout === "texture") return { wordStorage: "texture" };
  if (layout !== undefined) return { wordBlock: layout };
  const readsTexture = kernel.policy === "cpu" && (variant ?? "unrolled") === "unrolled";
  return readsTexture ? {} : { wordStorage: "buffer" };
}

async function check(
  ctx: GpuContext,
  kernel: Matmul,
  format: QuantFormat,
  shape: Shape,
  variant: TestVariant | undefined,
  parts?: number,
  xForm: XForm = "plain",
  uniformX?: { readonly bytes: number; readonly expected: boolean },
  layout?: WordLayout,
  everyCode = false,
): Promise<void> {
  const [m, n, k] = shape;
  const label = `quant matmul ${format} [${m}, ${n}, ${k}] ${variant ?? `auto/${kernel.policy}`} ` +
    (everyCode ? "random words (every code) " : "") +
    `bias ${kernel.bias}` + (xForm === "swiglu" ? " x swiglu" : "") +
    (layout === undefined ? "" : ` word layout ${layout}`) +
    (variant === "tiled" ? ` tile ${tileName(kernel.tile)}` : "") +
    (uniformX === undefined ? "" : ` uniform-capable X of ${uniformX.bytes} bytes`);
  const { seed, rng } = testSeed(label);
  const context = `seed ${seed} ${label}`;
  // The buffer the kernel reads (SwiGLU: a [M, 2K] gate|up in [-3, 3]) and the X it stands for.
  const xIn = xForm === "swiglu" ? rng.array(m * 2 * k, -3, 3) : rng.array(m * k, -1, 1);
  const x = xForm === "swiglu" ? siluMulRef(xIn, m, k) : xIn;
  const w = rng.array(n * k, -1, 1);
  const bias = kernel.bias ? rng.array(n, -1, 1) : undefined;
  // Words of random bits hold every code, -128 (int8) and -8 (int4) included, as a checkpoint's
  // codes may (engine/model/packed_int.ts); quantizeRows never writes -128.
  const bits = format === "int4" ? 4 : 8;
  const codes = everyCode
    ? {
      words: Uint32Array.from({ length: (n * k * bits) / 32 }, () => rng.int(0, 0xffffffff)),
      scales: Float16Array.from({ length: (n * k) / GROUP }, () => rng.uniform(0.001, 0.02)),
    }
    : quantizeRows(w, k, format);
  const weight = GpuMatrix.fromQuantized(
    ctx,
    "w",
    n,
    k,
    format,
    codes,
    layoutOptions(kernel, variant, layout),
  );
  if (parts !== undefined) assert.equal(weight.parts.length, parts, context);
  if (layout !== undefined) assert.equal(weight.wordLayout, layout, context);
  const xPadded = new Float32Array(xIn.length + 3).fill(NaN);
  xPadded.set(xIn);
  const xBuf = upload(ctx, xPadded, "x", uniformX?.bytes);
  const yBuf = poisonedF32(ctx, m * n);
  const biasBuf = bias === undefined ? undefined : upload(ctx, bias);
  const arena = new ParamArena(ctx, weight.parts.length);
  try {
    const op = kernel.bind(arena, {
      x: whole(xBuf),
      weight,
      bias: biasBuf === undefined ? undefined : whole(biasBuf),
      y: whole(yBuf),
      xForm,
    });
    if (uniformX !== undefined) {
      const config = op.configFor(m, forced(variant));
      assert.equal(config.xUniform > 0, uniformX.expected, `${context}: ${config.key}`);
    }
    await runPass(ctx, arena, (pass) => op.encode(pass, m, forced(variant)));
    const got = await readF32(ctx, yBuf);
    const wRef = everyCode
      ? Float64Array.from(
        unpackRef(codes.words, bits),
        (q, i) => q * codes.scales[Math.floor(i / GROUP)]!,
      )
      : quantizeRef(w, k, format).dequantized;
    const expected = matmulRef(x, wRef, bias, m, n, k);
    // One output of [1, 1, 32] can cancel to near zero (seed 850073341 with a bias, in CI): the
    // error is then measured against the terms' size, enough of it for what a K-term f32 sum
    // rounds off (1e-3 of the terms allowed about 2 ulp: seed 2945905039, int4 [1, 1, 32] x
    // swiglu, in CI, 2.8e-6 off of -0.0282).
    const floor = termFloor(x, wRef, bias, m, n, k, sumFloorFraction(k, 1e-4));
    assertClose(got, expected, 1e-4, context, floor);
  } finally {
    arena.destroy();
    weight.destroy();
    xBuf.destroy();
    yBuf.destroy();
    biasBuf?.destroy();
  }
}

const SHAPES: readonly Shape[] = [[1, 1, 32], [3, 17, 96], [5, 67, 160], [40, 130, 256], [
  17,
  37,
  64,
]];
const VARIANTS = QUANT_TEST_VARIANTS;

Deno.test(
  "matmul() multiplies by dequantized int8 / int4 weights in every kernel, in either word layout",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const bias of [false, true]) {
      // An f16 instance: quantized weights are accepted whatever the plain dtype.
      const kernel = new Matmul(ctx, { dtype: "f16", bias });
      for (const format of FORMATS) {
        for (const shape of SHAPES) {
          // Each word layout (gpu/quant.ts): the profile's by default, all on 130 rows (8
          // blocks of 16 and a partial one); a texture for `unrolled` under the cpu policy only.
          for (const variant of VARIANTS) {
            const layouts = shape[1] !== 130
              ? [undefined]
              : variant === "unrolled" && kernel.policy === "cpu"
              ? [1, 16, "texture"] as const
              : [1, 16] as const;
            for (const block of layouts) {
              await check(
                ctx,
                kernel,
                format,
                shape,
                variant,
                undefined,
                "plain",
                undefined,
                block,
              );
            }
          }
        }
      }
    }
  },
);

Deno.test(
  "matmul() decodes every int8 / int4 code, -128 included, in every kernel under both policies",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const policy of ["cpu", "gpu"] as const) {
      const kernel = new Matmul(ctx, { dtype: "f16", bias: false, policy });
      for (const format of FORMATS) {
        for (const shape of [[1, 17, 96], [5, 67, 160], [40, 130, 256]] as const) {
          for (const variant of [...VARIANTS, undefined]) {
            await check(
              ctx,
              kernel,
              format,
              shape,
              variant,
              undefined,
              "plain",
              undefined,
              undefined,
              true,
            );
          }
        }
      }
    }
  },
);

Deno.test(
  "matmul() unrolled reads X through a uniform binding with int8 / int4 weights when the rows fit",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const bias of [false, true]) {
      const kernel = new Matmul(ctx, { dtype: "f16", bias, policy: "cpu" });
      for (const format of FORMATS) {
        // 4,096 + 64 bytes of X bind as 256 vec4s: 16 rows of K = 64, 8 SwiGLU rows; 5 rows
        // of K = 160 (40 vec4s), 3 SwiGLU rows.
        for (
          const [shape, xForm, expected] of [
            [[1, 17, 64], "plain", true],
            [[16, 37, 64], "plain", true],
            [[17, 37, 64], "plain", false],
            [[8, 30, 64], "swiglu", true],
            [[9, 30, 64], "swiglu", false],
            [[5, 67, 160], "plain", true],
            [[3, 67, 160], "swiglu", true],
            [[4, 67, 160], "swiglu", false],
          ] as const
        ) {
          await check(ctx, kernel, format, shape, "unrolled", undefined, xForm, {
            bytes: 4096 + 64,
            expected,
          });
        }
      }
    }
  },
);

Deno.test(
  "matmul() tiled multiplies by dequantized int8 / int4 weights under every tile the tuning tries",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const tile of TILE_CANDIDATES) {
      const kernel = new Matmul(ctx, { dtype: "f16", bias: tile.bk === 16, policy: "gpu", tile });
      for (const format of FORMATS) {
        for (const shape of [[3, 17, 96], [40, 130, 256]] as const) {
          await check(ctx, kernel, format, shape, "tiled");
        }
      }
    }
  },
);

Deno.test(
  "matmul() reads X as silu(gate) * up of a gate|up buffer with int8 / int4 weights in every kernel",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const policy of ["cpu", "gpu"] as const) {
      const kernel = new Matmul(ctx, { dtype: "f16", bias: policy === "gpu", policy });
      for (const format of FORMATS) {
        for (const shape of SHAPES) {
          for (const variant of [...VARIANTS, undefined]) {
            // Forced kernels once, under the first policy.
            if (variant !== undefined && policy === "gpu") continue;
            await check(ctx, kernel, format, shape, variant, undefined, "swiglu");
          }
        }
      }
    }
  },
);

Deno.test(
  "matmul() picks a kernel for quantized weights under both policies, split across parts",
  GPU_TEST,
  async () => {
    // 1 KiB bindings: a 70 x 128 int8 weight (128 bytes per row) splits into 9 parts, row by
    // row (a block of 16 rows does not fit); 2.5 KiB bindings hold 20 int8 rows, one block of 16
    // (5 parts), or 40 int4 rows, two blocks (3 parts).
    for (const [bytes, wordBlock] of [[1024, 1], [2560, 16]] as const) {
      const ctx = await testContext({ maxBindingBytes: bytes });
      for (const policy of ["cpu", "gpu"] as const) {
        const kernel = new Matmul(ctx, { dtype: "f32", bias: true, policy });
        for (const format of FORMATS) {
          const parts = wordBlock === 1 ? (format === "int8" ? 9 : 5) : (format === "int8" ? 5 : 3);
          for (const m of [1, 7, 16, 33]) {
            await check(
              ctx,
              kernel,
              format,
              [m, 70, 128],
              undefined,
              parts,
              "plain",
              undefined,
              wordBlock,
            );
          }
          // Whole-group gemv steps index groups from each part's start.
          if (policy === "gpu") {
            for (const variant of ["gemv32", "gemv4x32"] as const) {
              await check(
                ctx,
                kernel,
                format,
                [3, 70, 128],
                variant,
                parts,
                "plain",
                undefined,
                wordBlock,
              );
            }
          }
        }
      }
    }
  },
);

Deno.test(
  "GpuMatrix.createQuantized() refuses widths that are not whole groups",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    assert.throws(() => GpuMatrix.createQuantized(ctx, "w", 4, GROUP + 8, "int4"), /groups of 32/);
    const m = GpuMatrix.createQuantized(ctx, "w", 3, 64, "int4", { wordBlock: 1 });
    const b = GpuMatrix.createQuantized(ctx, "w", 3, 64, "int4", { wordBlock: 16 });
    try {
      // 32 bytes of words per row; the scales of 8 rows (3 padded to a block of 8), 2 per row.
      assert.equal(m.byteSize, 3 * 32 + 8 * 2 * 2);
      // In word blocks, the words of 16 rows (3 padded to a block of 16).
      assert.equal(b.byteSize, 16 * 32 + 8 * 2 * 2);
      assert.throws(() => m.writeWords(ctx.device.queue, 2, new Uint32Array(16)), RangeError);
      assert.throws(() => m.writeScales(ctx.device.queue, new Float16Array(5)), RangeError);
      // One block of 16 rows of 32 bytes exceeds a 500-byte part.
      assert.throws(
        () =>
          GpuMatrix.createQuantized(ctx, "w", 40, 64, "int4", { wordBlock: 16, maxPartBytes: 500 }),
        /16 row\(s\) of 32 bytes exceed the binding limit of 500/,
      );
    } finally {
      m.destroy();
      b.destroy();
    }
  },
);

/** Texels of `layers` layers of a `width` x `height` rgba32uint texture, as u32 in row order. */
async function readTexture(
  ctx: GpuContext,
  texture: GPUTexture,
  width: number,
  height: number,
  layers: number,
): Promise<Uint32Array> {
  const rowBytes = Math.ceil((width * 16) / 256) * 256;
  const staging = ctx.createBuffer("texture readback", rowBytes * height * layers, STORAGE_RW);
  try {
    const encoder = ctx.device.createCommandEncoder();
    encoder.copyTextureToBuffer(
      { texture },
      { buffer: staging, bytesPerRow: rowBytes, rowsPerImage: height },
      [width, height, layers],
    );
    ctx.device.queue.submit([encoder.finish()]);
    const padded = await readU32(ctx, staging);
    const out = new Uint32Array(width * 4 * height * layers);
    for (let row = 0; row < height * layers; row++) {
      out.set(
        padded.subarray((row * rowBytes) / 4, (row * rowBytes) / 4 + width * 4),
        row * width * 4,
      );
    }
    return out;
  } finally {
    staging.destroy();
  }
}

Deno.test(
  "GpuMatrix.writeWords() puts int8 / int4 rows in a texture in blocks of 16 rows, 512 blocks a layer, whatever the chunks",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const B = WORD_BLOCK_ROWS;
    const height = TEXTURE_LAYER_ROWS / B;
    for (const format of FORMATS) {
      const { seed, rng } = testSeed(`word texture ${format}`);
      // Two whole layers and a third holding one block of 5 rows (11 missing).
      const rows = 2 * TEXTURE_LAYER_ROWS + 5;
      const cols = 64;
      const perRow = format === "int4" ? 8 : 16; // words per row: 2 or 4 texels
      const units = perRow / 4;
      const words = Uint32Array.from({ length: rows * perRow }, () => rng.int(1, 0xffffffff));
      const m = GpuMatrix.createQuantized(ctx, "w", rows, cols, format, { wordStorage: "texture" });
      try {
        assert.equal(m.wordLayout, "texture");
        assert.equal(m.parts.length, 1);
        const texture = m.parts[0]!.texture!;
        assert.deepEqual([texture.width, texture.height, texture.layers], [B * units, height, 3]);
        // Chunks that start and end inside blocks (100, 8,190, 8,195, 16,001), cover blocks 511
        // and 512 in part on both sides of the layer boundary at row 8,192, hold whole blocks
        // only (8,208..16,000) or one row, and whole blocks across the next layer boundary up to
        // the last row (16,384..16,388: the last block, 5 rows).
        const cuts = [0, 100, 8190, 8195, 8208, 16000, 16001, rows];
        for (let i = 0; i + 1 < cuts.length; i++) {
          const [lo, hi] = [cuts[i]!, cuts[i + 1]!];
          m.writeWords(ctx.device.queue, lo, words.subarray(lo * perRow, hi * perRow));
        }
        const got = await readTexture(ctx, texture.texture, B * units, height, 3);
        // Unit u of row r: texel (16 u + r % 16, b % 512) of layer b / 512, b = r / 16; the
        // missing rows of the last block are zero.
        const expected = new Uint32Array(3 * height * B * units * 4);
        for (let r = 0; r < rows; r++) {
          const b = Math.floor(r / B);
          for (let u = 0; u < units; u++) {
            const texel = b * B * units + B * u + (r % B);
            expected.set(words.subarray(r * perRow + 4 * u, r * perRow + 4 * u + 4), 4 * texel);
          }
        }
        assert.deepEqual(got, expected, `seed ${seed} ${format}`);
        // 2 or 4 texels of 16 bytes per row, three layers of 512 blocks of 16 rows; scales of
        // 16,389 rows padded to 16,392, two per row.
        assert.equal(m.byteSize, 3 * TEXTURE_LAYER_ROWS * perRow * 4 + 16392 * 2 * 2);
        assert.throws(() => m.parts[0]!.buffer, /in a texture/);
        assert.throws(() => m.writeWords(ctx.device.queue, rows - 1, words), RangeError);
      } finally {
        m.destroy();
      }
    }
  },
);

Deno.test(
  "matmul() unrolled multiplies by int8 / int4 words from a texture of several layers",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const bias of [false, true]) {
      const kernel = new Matmul(ctx, { dtype: "f16", bias, policy: "cpu" });
      for (const format of FORMATS) {
        // 3 layers of 512 blocks of 16 rows (the last block 10 rows), 2 layers (8 and 5 rows).
        for (const shape of [[1, 16410, 32], [7, 8200, 96], [17, 8213, 64]] as const) {
          await check(ctx, kernel, format, shape, "unrolled", 1, "plain", undefined, "texture");
        }
        await check(
          ctx,
          kernel,
          format,
          [5, 8210, 64],
          "unrolled",
          1,
          "swiglu",
          undefined,
          "texture",
        );
      }
    }
  },
);

Deno.test(
  "words in a texture are refused by every kernel but unrolled, and by the gpu policy",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const variant of ["gemv", "tiled", "blocked"] as const) {
      assert.throws(
        () =>
          kernelSource(variant, 1, "int4", false, false, "plain", "f32", TILE, 1, 4, 0, "texture"),
        new RegExp(`Cannot build matmul ${variant} for int4 words in a texture`),
      );
    }
    assert.throws(
      () =>
        kernelSource("unrolled", 1, "f16", false, true, "plain", "f32", TILE, 1, 4, 0, "texture"),
      /Cannot build matmul for f16 weights in word layout texture/,
    );
    assert.throws(
      () =>
        GpuMatrix.createQuantized(ctx, "w", 3, 64, "int4", {
          wordStorage: "texture",
          wordBlock: 16,
        }),
      TypeError,
    );
    const weight = GpuMatrix.createQuantized(ctx, "w", 8, 64, "int4", { wordStorage: "texture" });
    const arena = new ParamArena(ctx, 1);
    const x = upload(ctx, new Float32Array(64));
    const y = poisonedF32(ctx, 8);
    try {
      const gpu = new Matmul(ctx, { dtype: "f16", bias: false, policy: "gpu" });
      assert.throws(
        () => gpu.bind(arena, { x: whole(x), weight, y: whole(y) }),
        /its words are in a texture, which only the cpu policy's kernel reads/,
      );
      const cpu = new Matmul(ctx, { dtype: "f16", bias: false, policy: "cpu" });
      const op = cpu.bind(arena, { x: whole(x), weight, y: whole(y) });
      assert.throws(() => op.configFor(1, { variant: "gemv" }), /in a texture/);
    } finally {
      for (const b of [weight, arena, x, y]) b.destroy();
    }
  },
);

Deno.test(
  "matmul() refuses gemv steps of a whole group when weights are f16 or f32",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const dtype of ["f16", "f32"] as const) {
      assert.throws(
        () => kernelSource("gemv", 1, dtype, false, false, "plain", "f32", TILE, 1, 32),
        /Cannot build matmul gemv with steps of 32 for f(16|32) weights/,
      );
      const kernel = new Matmul(ctx, { dtype, bias: false, policy: "gpu" });
      const weight = GpuMatrix.create(ctx, "w", 8, 64, dtype, { padColsTo: 8 });
      const arena = new ParamArena(ctx, 1);
      const x = upload(ctx, new Float32Array(64));
      const y = poisonedF32(ctx, 8);
      try {
        const op = kernel.bind(arena, { x: whole(x), weight, y: whole(y) });
        assert.throws(
          () => op.configFor(1, { variant: "gemv", gemvStep: 32 }),
          /Cannot encode matmul with gemv steps of 32: f(16|32) weights/,
        );
      } finally {
        for (const b of [weight, arena, x, y]) b.destroy();
      }
    }
  },
);

Deno.test("kernelSource() builds gemv with the invocations per row asked for, whole groups with their own, and refuses others", () => {
  const tprOf = (code: string) => /const TPR = (\d+)u;/.exec(code)?.[1];
  for (const [step, tpr] of [[4, 64], [4, 32], [8, 32]] as const) {
    const { code } = kernelSource(
      "gemv",
      1,
      "int4",
      false,
      false,
      "plain",
      "f32",
      TILE,
      1,
      step,
      0,
      1,
      tpr,
    );
    assert.equal(tprOf(code), String(tpr), `steps of ${step}`);
  }
  // Steps of a whole group run 32 a row whatever is asked.
  const q32 = kernelSource("gemv", 1, "int4", false, false, "plain", "f32", TILE, 1, 32, 0, 1, 64);
  assert.equal(tprOf(q32.code), "32");
  assert.throws(
    () => kernelSource("gemv", 1, "f16", false, false, "plain", "f32", TILE, 1, 4, 0, 1, 16),
    /Cannot build matmul gemv with 16 invocations per row/,
  );
});

Deno.test("kernelSource() refuses a tiled K step that is not whole 8-weight loads when weights are int8 / int4", () => {
  // A valid tile for f16 weights (bk % 4 == 0) whose K step splits the 8 weights one load stages.
  const tile = { wx: 4, wy: 4, bk: 4 };
  assert.ok(kernelSource("tiled", 0, "f16", false, false, "plain", "f32", tile).code.length > 0);
  for (const format of FORMATS) {
    assert.throws(
      () => kernelSource("tiled", 0, format, false, false, "plain", "f32", tile),
      /4x4 bk4 with int[48] weights: needs bk % 8 == 0/,
    );
    const code = kernelSource("tiled", 0, format, false, false, "plain", "f32", TILE).code;
    assert.match(code, /load_w8/);
    assert.doesNotMatch(code, /^ *\/\/ W STAGING BEGIN/m);
    assert.doesNotMatch(code, /= load_w4\(/);
  }
});
