import { deepEqual as assertEqual, throws as assertThrows } from "node:assert/strict";
import { AssertionError } from "node:assert";
import type { GpuContext } from "../gpu/context.ts";
import { type DType, roundTo } from "../gpu/dtype.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import { Matmul, TILE_CANDIDATES, type TileConfig } from "../kernels/matmul.ts";
import { tileName } from "../kernels/matmul_tile.ts";
import { assertClose, assertUntouchedFrom, toleranceFor } from "./support/assert_close.ts";
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
import { forced, padColsFor, type TestVariant } from "./support/matmul_variants.ts";
import { matmulRef, sumFloorFraction, termFloor } from "./reference/matmul.ts";
import { quantizeRef } from "./reference/quant.ts";
import { type QuantFormat, quantizeRows } from "../gpu/quant.ts";
import { denseRows, fusedAddRmsNormRef, rmsNormRef } from "./reference/norms.ts";

type Shape = readonly [m: number, n: number, k: number];

interface NormCase {
  readonly shape: Shape;
  readonly dtype: DType;
  readonly bias: boolean;
  /** Whether delta is added to the stream first (and the sum written out). */
  readonly residual: boolean;
  /** Forced kernel; undefined runs the gpu policy's choice. */
  readonly variant?: TestVariant;
  /** Binding limit, to split the weight into parts. */
  readonly maxBindingBytes?: number;
  readonly parts?: number;
  /** The tiled kernel's configuration (default TILE). */
  readonly tile?: TileConfig;
  /** int8 / int4 weights (gpu/quant.ts) instead of `dtype` ones; K % 32 == 0. */
  readonly quant?: QuantFormat;
}

const EPS = 1e-5;

/**
 * Runs one case on fresh random inputs: the residual stream h (and delta), a norm weight, a
 * poisoned y and stream output with one spare row, and checks y against
 * `rms(h (+ delta)) * gamma W^T (+ bias)` and the stream output against `h + delta`.
 */
async function check(ctx: GpuContext, c: NormCase): Promise<void> {
  const [m, n, k] = c.shape;
  const form = c.residual ? "rms_residual" : "rms";
  const label = `[${m}, ${n}, ${k}] ${c.dtype} ${c.bias ? "bias" : "no bias"} ` +
    `${c.variant ?? "auto/gpu"} ${form}${c.tile === undefined ? "" : ` tile ${tileName(c.tile)}`}` +
    (c.quant === undefined ? "" : ` ${c.quant} weights`);
  const { seed, rng } = testSeed(label);
  const context = `seed ${seed} ${label}`;
  const h = rng.array(m * k, -2, 2);
  const delta = c.residual ? rng.array(m * k, -1, 1) : undefined;
  const gamma = rng.array(k, 0.5, 1.5);
  const w = rng.array(n * k, -1, 1);
  const bias = c.bias ? rng.array(n, -1, 1) : undefined;
  const padColsTo = padColsFor(c.variant);
  const weight = c.quant === undefined
    ? GpuMatrix.fromArray(ctx, "w", w, n, k, c.dtype, { padColsTo })
    // In a buffer whatever the kernel profile: gemv and tiled do not read words in a texture.
    : GpuMatrix.fromQuantized(ctx, "w", n, k, c.quant, quantizeRows(w, k, c.quant), {
      wordStorage: "buffer",
    });
  const normWeight = GpuMatrix.fromArray(ctx, "gamma", gamma, 1, k, c.dtype);
  if (c.parts !== undefined && weight.parts.length !== c.parts) {
    throw new AssertionError({
      message: `${context}: weight has ${weight.parts.length} parts, expected ${c.parts}`,
    });
  }
  // NaNs after the rows: a kernel that reads past K in the last row without masking fails.
  const padded = (v: Float32Array) => {
    const out = new Float32Array(v.length + 3).fill(NaN);
    out.set(v);
    return upload(ctx, out);
  };
  const hBuf = padded(h);
  const deltaBuf = delta === undefined ? undefined : padded(delta);
  const outBuf = c.residual ? poisonedF32(ctx, (m + 1) * k, "stream") : undefined;
  const yBuf = poisonedF32(ctx, (m + 1) * n);
  const biasBuf = bias === undefined ? undefined : upload(ctx, bias);
  const arena = new ParamArena(ctx, weight.parts.length);
  try {
    const matmul = new Matmul(ctx, { dtype: c.dtype, bias: c.bias, policy: "gpu", tile: c.tile });
    const op = matmul.bind(arena, {
      x: whole(hBuf),
      xForm: form,
      norm: {
        weight: normWeight,
        eps: EPS,
        ...(deltaBuf && outBuf ? { delta: whole(deltaBuf), out: whole(outBuf) } : {}),
      },
      weight,
      bias: biasBuf === undefined ? undefined : whole(biasBuf),
      y: whole(yBuf),
    });
    await runPass(ctx, arena, (pass) => op.encode(pass, m, forced(c.variant)));
    const layout = denseRows(m, k);
    const g = roundTo(gamma, c.dtype);
    const ref = delta === undefined
      ? { residual: Float64Array.from(h), out: rmsNormRef(h, g, layout, EPS) }
      : fusedAddRmsNormRef(delta, h, g, layout, EPS);
    const wRef = c.quant === undefined
      ? roundTo(w, c.dtype)
      : quantizeRef(w, k, c.quant).dequantized;
    const expected = matmulRef(ref.out, wRef, bias, m, n, k);
    const got = await readF32(ctx, yBuf);
    assertUntouchedFrom(got, m * n, `${context} y`);
    const tolerance = c.quant === undefined ? toleranceFor(c.dtype) : toleranceFor("f32");
    const floor = termFloor(ref.out, wRef, bias, m, n, k, sumFloorFraction(k, tolerance));
    assertClose(got.subarray(0, m * n), expected, tolerance, `${context} y`, floor);
    if (outBuf !== undefined) {
      const stream = await readF32(ctx, outBuf);
      assertUntouchedFrom(stream, m * k, `${context} stream`);
      assertClose(stream.subarray(0, m * k), ref.residual, 1e-6, `${context} stream`);
    }
  } finally {
    arena.destroy();
    for (const b of [hBuf, deltaBuf, outBuf, yBuf, biasBuf]) b?.destroy();
    weight.destroy();
    normWeight.destroy();
  }
}

const SHAPES: readonly Shape[] = [
  [1, 1, 1],
  [3, 17, 33],
  [5, 67, 129],
  [16, 40, 64],
  [17, 70, 36],
  [70, 130, 258],
  // K % 8 == 7: an 8-element step's tail with both halves (gemv steps of 8).
  [2, 11, 47],
];

Deno.test(
  "matmul() reads X as the RMSNorm of the residual stream in gemv and tiled when xForm is rms or rms_residual",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const shape of SHAPES) {
      for (const dtype of ["f32", "f16"] as const) {
        for (const residual of [false, true]) {
          const bias = (shape[0] + (residual ? 1 : 0)) % 2 === 0;
          for (
            const variant of ["gemv", "gemv4", "gemv8", "gemv4x8", "tiled", undefined] as const
          ) {
            await check(ctx, { shape, dtype, bias, residual, variant });
          }
        }
      }
    }
  },
);

Deno.test(
  "matmul() reads X as the RMSNorm of the residual stream with int8 / int4 weights in gemv and tiled",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    // gemv with vec4 steps reads quantized weights under a norm X form in the decode steps of
    // tests/quant_model_test.ts.
    const shapes: readonly Shape[] = [[1, 1, 32], [3, 17, 96], [17, 70, 64]];
    for (const shape of shapes) {
      for (const quant of ["int8", "int4"] as const) {
        for (const residual of [false, true]) {
          const bias = (shape[0] + (residual ? 1 : 0)) % 2 === 0;
          for (const variant of ["gemv4x8", "gemv32", "gemv4x32", "tiled"] as const) {
            await check(ctx, { shape, dtype: "f16", bias, residual, variant, quant });
          }
        }
      }
    }
    // A quantized weight split across parts: the stream is still written once.
    const small = await testContext({ maxBindingBytes: 1024 });
    for (const variant of ["gemv32", "gemv4x32", "tiled"] as const) {
      await check(small, {
        shape: [3, 70, 128],
        dtype: "f16",
        bias: true,
        residual: true,
        variant,
        quant: "int8",
        parts: 9,
      });
    }
  },
);

Deno.test(
  "matmul() tiled reads X as the RMSNorm of the residual stream under every tile the tuning tries",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const tile of TILE_CANDIDATES) {
      for (const shape of [[3, 17, 96], [70, 130, 260]] as const) {
        for (const residual of [false, true]) {
          const bias = residual;
          await check(ctx, { shape, dtype: "f16", bias, residual, variant: "tiled", tile });
        }
      }
    }
  },
);

Deno.test(
  "matmul() writes the residual stream once when an rms_residual weight is split across parts",
  GPU_TEST,
  async () => {
    // 4 KiB bindings: a 90 x 60 f32 weight (240 bytes per row) splits into 6 parts.
    const ctx = await testContext({ maxBindingBytes: 4096 });
    for (const variant of ["gemv", "gemv4", "gemv4x8", "tiled"] as const) {
      await check(ctx, {
        shape: [3, 90, 60],
        dtype: "f32",
        bias: true,
        residual: true,
        variant,
        parts: 6,
      });
    }
  },
);

Deno.test("matmul() refuses a norm X form it cannot run", GPU_TEST, async () => {
  const ctx = await testContext();
  const arena = new ParamArena(ctx, 8);
  const h = upload(ctx, new Float32Array(2 * 8));
  const y = poisonedF32(ctx, 2 * 8);
  const weight = GpuMatrix.create(ctx, "w", 8, 8, "f32", { padColsTo: 4 });
  const gamma = GpuMatrix.create(ctx, "gamma", 1, 8, "f32");
  const narrow = GpuMatrix.create(ctx, "narrow", 1, 4, "f32");
  const gpu = new Matmul(ctx, { dtype: "f32", bias: false, policy: "gpu" });
  const cpu = new Matmul(ctx, { dtype: "f32", bias: false, policy: "cpu" });
  const base = { x: whole(h), weight, y: whole(y) } as const;
  try {
    assertEqual([gpu.readsNorm, cpu.readsNorm], [true, false]);
    const norm = { weight: gamma, eps: EPS };
    // The cpu policy's kernels do not read it; a norm needs its form and the form its norm.
    assertThrows(() => cpu.bind(arena, { ...base, xForm: "rms", norm }), TypeError);
    assertThrows(() => gpu.bind(arena, { ...base, xForm: "rms" }), TypeError);
    assertThrows(() => gpu.bind(arena, { ...base, norm }), TypeError);
    assertThrows(
      () => gpu.bind(arena, { ...base, xForm: "rms", norm: { ...norm, weight: narrow } }),
      TypeError,
    );
    // rms_residual needs delta and out, out not the stream it reads.
    assertThrows(() => gpu.bind(arena, { ...base, xForm: "rms_residual", norm }), TypeError);
    const same = { ...norm, delta: whole(y), out: whole(h) };
    assertThrows(() => gpu.bind(arena, { ...base, xForm: "rms_residual", norm: same }), RangeError);
    // A forced kernel without the form fails at encode with a clear error.
    const op = gpu.bind(arena, { ...base, xForm: "rms", norm });
    const encoder = ctx.device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    assertThrows(() => op.encode(pass, 1, { variant: "blocked" }), RangeError);
    pass.end();
    ctx.device.queue.submit([encoder.finish()]);
  } finally {
    for (const b of [h, y]) b.destroy();
    for (const w of [weight, gamma, narrow]) w.destroy();
    arena.destroy();
  }
});
