import { deepEqual as assertEqual, throws as assertThrows } from "node:assert/strict";
import { AssertionError } from "node:assert";
import type { GpuContext } from "../gpu/context.ts";
import { type DType, roundTo } from "../gpu/dtype.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import {
  Matmul,
  type MatmulPolicy,
  TILE,
  TILE_CANDIDATES,
  type TileConfig,
  type XForm,
} from "../kernels/matmul.ts";
import { tileCols, tileName, tileRows } from "../kernels/matmul_tile.ts";
import { assertClose, toleranceFor } from "./support/assert_close.ts";
import {
  GPU_TEST,
  ParamArena,
  poisonedF32,
  readF32,
  runPass,
  testContext,
  upload,
  whole,
} from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { forced, padColsFor, TEST_VARIANTS, type TestVariant } from "./support/matmul_variants.ts";
import { matmulRef, termFloor } from "./reference/matmul.ts";
import { siluMulRef } from "./reference/activations.ts";

type Shape = readonly [m: number, n: number, k: number];

interface Case {
  readonly shape: Shape;
  readonly dtype: DType;
  readonly bias: boolean;
  /** Forced kernel; undefined runs the policy's choice. */
  readonly variant?: TestVariant;
  readonly policy?: MatmulPolicy;
  /** Row stride of y (default n); columns past n must stay poisoned. */
  readonly ldy?: number;
  /** Expected number of weight parts (checks that the split really happens). */
  readonly parts?: number;
  /** How the kernel reads X (default plain); "swiglu" binds a `[M, 2K]` gate|up buffer. */
  readonly xForm?: XForm;
  /** The tiled kernel's configuration (default the policy's TILE). */
  readonly tile?: TileConfig;
  /**
   * X in a buffer with UNIFORM usage of at least this many bytes (`unrolled` may then read it
   * through a uniform binding); undefined: a storage-only buffer.
   */
  readonly uniformXBytes?: number;
  /** Whether the kernel must read X through a uniform binding (checked when given). */
  readonly expectUniformX?: boolean;
  /** The K slices the kernel must run with (split-K; checked when given). */
  readonly expectSplit?: number;
}

const kernels = new Map<string, Matmul>();

function kernelFor(ctx: GpuContext, c: Case): Matmul {
  const t = c.tile ?? TILE;
  const key = `${c.dtype}/${c.bias}/${c.policy ?? "default"}/${ctx.maxBindingBytes}/` +
    tileName(t);
  let kernel = kernels.get(key);
  if (kernel === undefined) {
    kernel = new Matmul(ctx, { dtype: c.dtype, bias: c.bias, policy: c.policy, tile: c.tile });
    kernels.set(key, kernel);
  }
  return kernel;
}

/** Runs one case on fresh random inputs with a poisoned y and checks every element of y. */
async function check(ctx: GpuContext, name: string, c: Case): Promise<void> {
  const [m, n, k] = c.shape;
  const ldy = c.ldy ?? n;
  const label = `${name} [${m}, ${n}, ${k}] ${c.dtype} ${c.bias ? "bias" : "no bias"} ` +
    `${c.variant ?? `auto/${c.policy ?? "default"}`} ldy ${ldy}` +
    (c.xForm === "swiglu" ? " x swiglu" : "") +
    (c.tile === undefined ? "" : ` tile ${tileName(c.tile)}`) +
    (c.uniformXBytes === undefined ? "" : ` uniform-capable X of ${c.uniformXBytes} bytes`);
  const { seed, rng } = testSeed(label);
  const context = `seed ${seed} ${label}`;
  // The buffer the kernel reads, and the X it stands for (SwiGLU: gate and up in [-3, 3], where
  // silu is far from linear).
  const swiglu = c.xForm === "swiglu";
  const xIn = swiglu ? rng.array(m * 2 * k, -3, 3) : rng.array(m * k, -1, 1);
  const x = swiglu ? siluMulRef(xIn, m, k) : xIn;
  const w = rng.array(n * k, -1, 1);
  const bias = c.bias ? rng.array(n, -1, 1) : undefined;
  // Kernels reading 8-element steps need a row stride that is a multiple of 8; others get 4.
  const padColsTo = padColsFor(c.variant);
  const weight = GpuMatrix.fromArray(ctx, "w", w, n, k, c.dtype, { padColsTo });
  if (c.parts !== undefined && weight.parts.length !== c.parts) {
    throw new AssertionError({
      message: `${context}: weight has ${weight.parts.length} parts, expected ${c.parts}`,
    });
  }
  // Three NaNs after X: a kernel that reads past K in the last row without masking fails.
  const xPadded = new Float32Array(xIn.length + 3).fill(NaN);
  xPadded.set(xIn);
  const xBuf = upload(ctx, xPadded, "x", c.uniformXBytes);
  const yBuf = poisonedF32(ctx, m * ldy);
  const biasBuf = bias === undefined ? undefined : upload(ctx, bias);
  try {
    const arena = new ParamArena(ctx, weight.parts.length);
    const op = kernelFor(ctx, c).bind(arena, {
      x: whole(xBuf),
      weight,
      bias: biasBuf === undefined ? undefined : whole(biasBuf),
      y: whole(yBuf),
      ldy,
      xForm: c.xForm,
    });
    if (c.expectUniformX !== undefined) {
      const config = op.configFor(m, forced(c.variant));
      assertEqual(config.xUniform > 0, c.expectUniformX, `${context}: ${config.key}`);
    }
    if (c.expectSplit !== undefined) {
      const config = op.configFor(m, forced(c.variant));
      assertEqual(config.split, c.expectSplit, `${context}: ${config.key}`);
    }
    await runPass(ctx, arena, (pass) => op.encode(pass, m, forced(c.variant)));
    const got = await readF32(ctx, yBuf);
    const expected = matmulRef(x, roundTo(w, c.dtype), bias, m, n, k);
    const inside = new Float32Array(m * n);
    for (let i = 0; i < m; i++) {
      inside.set(got.subarray(i * ldy, i * ldy + n), i * n);
      for (let j = n; j < ldy; j++) {
        if (!Number.isNaN(got[i * ldy + j]!)) {
          throw new AssertionError({
            message: `${context}: y[${i}, ${j}] outside the N = ${n} columns was written`,
          });
        }
      }
    }
    // A few outputs cancel to near zero on random inputs (one output of K = 1: x w + b).
    const floor = termFloor(x, roundTo(w, c.dtype), bias, m, n, k);
    assertClose(inside, expected, toleranceFor(c.dtype), context, floor);
    arena.destroy();
  } finally {
    weight.destroy();
    xBuf.destroy();
    yBuf.destroy();
    biasBuf?.destroy();
  }
}

const SHAPES: readonly Shape[] = [
  [1, 1, 1],
  [3, 17, 33],
  [5, 67, 129],
  [70, 130, 260],
  [1, 1000, 1024],
  [13, 300, 255],
  // K % 8 of 5 and 6: every length of an 8-element step's tail (gemv steps of 8, unrolled).
  [4, 23, 45],
  [2, 9, 30],
];
const VARIANTS = TEST_VARIANTS;
const DTYPES: readonly DType[] = ["f32", "f16"];

Deno.test(
  "matmul() matches the float64 reference for every kernel when M, N, K are not tile multiples",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const shape of SHAPES) {
      for (const dtype of DTYPES) {
        for (const variant of VARIANTS) {
          // Bias on/off alternates with the kernel so every kernel sees both across dtypes.
          const bias = (VARIANTS.indexOf(variant) + DTYPES.indexOf(dtype)) % 2 === 0;
          await check(ctx, "forced", { shape, dtype, bias, variant });
        }
      }
    }
  },
);

Deno.test(
  "matmul() picks a correct kernel for decode and prefill M under both policies",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const policy of ["cpu", "gpu"] as const) {
      for (const shape of [[1, 96, 64], [8, 50, 31], [16, 33, 40], [17, 70, 36]] as const) {
        for (const dtype of DTYPES) {
          await check(ctx, "auto", { shape, dtype, bias: shape[0] % 2 === 1, policy });
        }
      }
    }
  },
);

Deno.test(
  "matmul() tiled matches the float64 reference under every tile shape the tuning bench tries",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const pipelines = new Set<GPUComputePipeline>();
    for (const tile of TILE_CANDIDATES) {
      // The tile reaches the kernel: its grid covers tm wy rows of X and tn wx rows of W, and it
      // compiles a pipeline of its own (a double-buffered tile once shared its twin's, cached
      // under the same key).
      const config = kernelFor(ctx, { shape: [1, 1, 1], dtype: "f32", bias: false, tile })
        .choose(100, 64, 64, 64, "tiled");
      assertEqual(
        [config.mPerGroup, config.rowsPerGroup],
        [tileRows(tile) * tile.wy, tileCols(tile) * tile.wx],
      );
      assertEqual(pipelines.has(config.pipeline), false, `${tileName(tile)} reuses a pipeline`);
      pipelines.add(config.pipeline);
      for (const shape of [[1, 1, 1], [5, 67, 129], [70, 130, 260]] as const) {
        for (const dtype of DTYPES) {
          const bias = (shape[0] + DTYPES.indexOf(dtype)) % 2 === 1;
          await check(ctx, "tile", { shape, dtype, bias, variant: "tiled", tile });
          await check(ctx, "tile", {
            shape,
            dtype,
            bias,
            variant: "tiled",
            tile,
            xForm: "swiglu",
          });
        }
      }
    }
  },
);

Deno.test(
  "matmul() runs a split-K tile unsplit when its partials do not fit or the weight has several parts",
  GPU_TEST,
  async () => {
    // 4 KiB bindings: the partial buffer holds 1,024 floats (4 slices x M rows x (ldy + 1)).
    const ctx = await testContext({ maxBindingBytes: 4096 });
    for (const tile of [{ wx: 16, wy: 16, bk: 16, sk: 4 }, { wx: 16, wy: 4, bk: 16, sk: 4 }]) {
      const c = { dtype: "f16", bias: true, variant: "tiled", tile } as const;
      // 4 x 2 x 21 floats fit: split (one part of 20 x 64 halves).
      await check(ctx, "fits", { ...c, shape: [2, 20, 64], expectSplit: 4 });
      // 4 x 40 x 21 do not: the same tile unsplit.
      await check(ctx, "too many rows", { ...c, shape: [40, 20, 64], expectSplit: 1 });
      // 90 x 60 f32 weights in 6 parts: unsplit (the reduce covers one part).
      await check(ctx, "parts", {
        ...c,
        dtype: "f32",
        shape: [3, 90, 60],
        parts: 6,
        expectSplit: 1,
      });
    }
  },
);

Deno.test(
  "new Matmul() rejects a tile whose staging does not divide evenly or whose K split is not 1, 2, 4 or 8",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const tiles: TileConfig[] = [
      { wx: 16, wy: 16, bk: 12 },
      { wx: 32, wy: 8, bk: 4 },
      { wx: 64, wy: 32, bk: 16 },
      { wx: 16, wy: 16, bk: 16, tm: 6 },
      // 8 x 4 blocks staging 64 lines of 33 + 17 vec4s: 51,200 bytes of workgroup memory.
      { wx: 16, wy: 16, bk: 64, tm: 8 },
      { wx: 16, wy: 16, bk: 16, tn: 6 },
      // 8 x 8 blocks staging 32 lines of 33 + 65 vec4s: 50,176 bytes.
      { wx: 32, wy: 16, bk: 32, tm: 8, tn: 8 },
      // 16 lines of 33 + 33 vec4s fit once (16,896 bytes), not double-buffered (33,792).
      { wx: 16, wy: 16, bk: 16, tm: 8, tn: 8, db: true },
      // K slices other than 1, 2, 4 or 8.
      { wx: 16, wy: 16, bk: 16, sk: 3 },
      { wx: 16, wy: 16, bk: 16, sk: 0 },
    ];
    for (const tile of tiles) {
      assertThrows(() => new Matmul(ctx, { dtype: "f32", bias: false, tile }), {
        name: "RangeError",
        message: new RegExp(`^Cannot use matmul tile ${tileName(tile)}:`),
      });
    }
  },
);

const SWIGLU_SHAPES: readonly Shape[] = [
  [1, 1, 1],
  [3, 17, 33],
  [17, 67, 129],
  [1, 40, 64],
  [70, 30, 36],
  [13, 30, 255],
];

Deno.test(
  "matmul() reads X as silu(gate) * up of a [M, 2K] gate|up buffer in every kernel when xForm is swiglu",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const shape of SWIGLU_SHAPES) {
      for (const dtype of DTYPES) {
        for (const variant of VARIANTS) {
          const bias = (VARIANTS.indexOf(variant) + DTYPES.indexOf(dtype)) % 2 === 1;
          await check(ctx, "forced", { shape, dtype, bias, variant, xForm: "swiglu" });
        }
        for (const policy of ["cpu", "gpu"] as const) {
          await check(ctx, "auto", { shape, dtype, bias: false, policy, xForm: "swiglu" });
        }
      }
    }
  },
);

Deno.test(
  "matmul() covers every column of a weight split across several parts, into a wider y",
  GPU_TEST,
  async () => {
    // 4 KiB bindings: a 90 x 60 f32 weight (240 bytes per row) splits into 6 parts.
    const ctx = await testContext({ maxBindingBytes: 4096 });
    for (const variant of [...VARIANTS, undefined]) {
      await check(ctx, "split", {
        shape: [3, 90, 60],
        dtype: "f32",
        bias: true,
        variant,
        parts: 6,
      });
      await check(ctx, "split", {
        shape: [21, 90, 58],
        dtype: "f16",
        bias: false,
        variant,
        parts: 3,
        ldy: 97,
      });
      await check(ctx, "split", {
        shape: [5, 90, 36],
        dtype: "f32",
        bias: false,
        variant,
        parts: 4,
        xForm: "swiglu",
      });
    }
  },
);

Deno.test(
  "matmul() unrolled reads X through a uniform binding exactly when the M rows fit in one",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    // 1,088 bytes of X bind as a uniform array of 64 vec4s: 16 rows of K = 16 (4 vec4s each),
    // 8 SwiGLU rows (gate and up: 8 vec4s each). One more row runs the storage binding.
    for (const dtype of DTYPES) {
      for (const policy of ["cpu", "gpu"] as const) {
        for (
          const [m, xForm, uniform] of [
            [1, "plain", true],
            [16, "plain", true],
            [17, "plain", false],
            [3, "swiglu", true],
            [8, "swiglu", true],
            [9, "swiglu", false],
          ] as const
        ) {
          await check(ctx, "uniform", {
            shape: [m, 37, 16],
            dtype,
            bias: m % 2 === 1,
            variant: "unrolled",
            policy,
            xForm,
            uniformXBytes: 1088,
            expectUniformX: uniform,
          });
        }
      }
      // Odd shapes through the policy (cpu: unrolled), 256 vec4s of X; a K that is not a
      // multiple of 4 reads scalars, never a uniform.
      for (
        const [shape, uniform] of [
          [[1, 1000, 1024], true],
          [[5, 67, 136], true],
          [[13, 30, 255], false],
          [[2, 9, 30], false],
        ] as const
      ) {
        await check(ctx, "uniform", {
          shape,
          dtype,
          bias: false,
          policy: "cpu",
          uniformXBytes: 4096,
          expectUniformX: uniform,
        });
      }
    }
  },
);

Deno.test("matmul() rejects mismatched buffers and row counts", GPU_TEST, async () => {
  const ctx = await testContext();
  const arena = new ParamArena(ctx, 8);
  const kernel = new Matmul(ctx, { dtype: "f32", bias: false });
  const x = upload(ctx, new Float32Array(2 * 10));
  const y = poisonedF32(ctx, 2 * 8);
  const unpadded = GpuMatrix.create(ctx, "unpadded", 8, 10, "f32");
  const half = GpuMatrix.create(ctx, "half", 8, 10, "f16", { padColsTo: 4 });
  const good = GpuMatrix.create(ctx, "good", 8, 10, "f32", { padColsTo: 4 });
  try {
    assertThrows(
      () => kernel.bind(arena, { x: whole(x), weight: unpadded, y: whole(y) }),
      RangeError,
    );
    assertThrows(() => kernel.bind(arena, { x: whole(x), weight: half, y: whole(y) }), TypeError);
    assertThrows(
      () => kernel.bind(arena, { x: whole(x), weight: good, y: whole(y), bias: whole(y) }),
      TypeError,
    );
    assertThrows(
      () => kernel.bind(arena, { x: whole(x), weight: good, y: whole(y), ldy: 7 }),
      RangeError,
    );
    const op = kernel.bind(arena, { x: whole(x), weight: good, y: whole(y) });
    // A SwiGLU X row is 2K = 20 values: x holds one.
    const swiglu = kernel.bind(arena, { x: whole(x), weight: good, y: whole(y), xForm: "swiglu" });
    assertEqual([op.maxRows, swiglu.maxRows], [2, 1]);
    const encoder = ctx.device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    assertThrows(() => op.encode(pass, 3), RangeError);
    assertThrows(() => op.encode(pass, 0), RangeError);
    assertThrows(() => swiglu.encode(pass, 2), RangeError);
    // Row stride 12: unrolled and gemv steps of 8 need whole 8-element steps.
    assertThrows(() => op.encode(pass, 1, { variant: "unrolled" }), RangeError);
    assertThrows(() => op.encode(pass, 1, { variant: "gemv", gemvStep: 8 }), {
      name: "RangeError",
      message: /gemv steps of 8: weight row stride 12 is not a multiple of 8/,
    });
    assertThrows(() => op.encode(pass, 1, { variant: "gemv", gemvStep: 6 }), {
      name: "RangeError",
      message: /steps of 6 weights/,
    });
    pass.end();
    // Never leave a command buffer unsubmitted (Deno panics); the empty pass is valid.
    ctx.device.queue.submit([encoder.finish()]);
  } finally {
    for (const b of [x, y]) b.destroy();
    for (const w of [unpadded, half, good]) w.destroy();
    arena.destroy();
  }
});
