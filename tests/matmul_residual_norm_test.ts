/**
 * The `cpu` policy's RMSNorm split over two projections (kernels/matmul_unrolled_residual.wgsl):
 * the output form `"residual_rms"` (y is the residual stream, added to; `h * gamma` and the
 * partial sums of squares of h written beside it) and the X form `"rms_partials"` (each row's
 * dot products scaled by the RMSNorm factor of its partial sums), each against a float64
 * reference on fresh random inputs, and the two chained against the RMSNorm they replace.
 *
 * @module
 */

import { throws as assertThrows } from "node:assert/strict";
import type { GpuContext } from "../gpu/context.ts";
import { type DType, roundTo } from "../gpu/dtype.ts";
import { type QuantFormat, quantizeRows, type WordLayout } from "../gpu/quant.ts";
import { GpuMatrix, type QuantizedMatrixOptions } from "../gpu/tensor.ts";
import { Matmul } from "../kernels/matmul.ts";
import { kernelSource } from "../kernels/matmul_kernels.ts";
import { NORM_PARTIAL_ROWS, normPartialsPerRow } from "../kernels/matmul_bindings.ts";
import { TILE } from "../kernels/matmul_tile.ts";
import { assertClose, assertUntouchedFrom, toleranceFor } from "./support/assert_close.ts";
import {
  GPU_TEST,
  ParamArena,
  poisonedF32,
  readF32,
  runPass,
  testContext,
  upload,
  WEIGHT_DTYPES,
  whole,
} from "./support/gpu.ts";
import { type Rng, testSeed } from "./support/random.ts";
import { matmulRef, sumFloorFraction, termFloor } from "./reference/matmul.ts";
import { quantizeRef } from "./reference/quant.ts";
import { denseRows, fusedAddRmsNormRef } from "./reference/norms.ts";

type Shape = readonly [m: number, n: number, k: number];

/** A weight of a case: plain f16 / f32, or int8 / int4 words in one of the cpu layouts. */
interface WeightKind {
  readonly dtype: DType;
  readonly quant?: QuantFormat;
  readonly layout?: WordLayout;
}

const EPS = 1e-5;

/** `w` `[n, k]` on the device as `kind` says, and the values the kernel multiplies by. */
function makeWeight(
  ctx: GpuContext,
  kind: WeightKind,
  w: Float32Array,
  n: number,
  k: number,
): { weight: GpuMatrix; ref: Float64Array } {
  if (kind.quant === undefined) {
    const weight = GpuMatrix.fromArray(ctx, "w", w, n, k, kind.dtype, { padColsTo: 8 });
    return { weight, ref: Float64Array.from(roundTo(w, kind.dtype)) };
  }
  const options: QuantizedMatrixOptions = kind.layout === "texture"
    ? { wordStorage: "texture" }
    : { wordBlock: kind.layout ?? 1 };
  const weight = GpuMatrix.fromQuantized(
    ctx,
    "w",
    n,
    k,
    kind.quant,
    quantizeRows(w, k, kind.quant),
    options,
  );
  return { weight, ref: Float64Array.from(quantizeRef(w, k, kind.quant).dequantized) };
}

/** The label of a weight kind. */
function kindName(kind: WeightKind): string {
  return kind.quant === undefined ? kind.dtype : `${kind.quant} (words ${kind.layout ?? 1})`;
}

/** X `[m, k]` on the device: in a buffer that may be bound as uniform when `uniform`. */
function uploadX(ctx: GpuContext, x: Float32Array, uniform: boolean): GPUBuffer {
  // One spare row of NaNs: a kernel reading past the last row fails.
  const padded = new Float32Array(x.length + 8).fill(NaN);
  padded.set(x);
  return uniform ? upload(ctx, padded, "x", 65536) : upload(ctx, padded, "x");
}

/** Sums of squares of each row of `h` `[m, n]` in blocks of NORM_PARTIAL_ROWS columns. */
function partialsRef(h: ArrayLike<number>, m: number, n: number): Float64Array {
  const blocks = normPartialsPerRow(n);
  const out = new Float64Array(m * blocks);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      const at = i * blocks + Math.floor(j / NORM_PARTIAL_ROWS);
      out[at] = out[at]! + h[i * n + j]! ** 2;
    }
  }
  return out;
}

/** The seeded generator and failure context of one case. */
function caseSeed(
  [m, n, k]: Shape,
  kind: WeightKind,
  bias: boolean,
  uniform: boolean,
  form: string,
): { rng: Rng; context: string } {
  const label = `[${m}, ${n}, ${k}] ${kindName(kind)} ${bias ? "bias" : "no bias"} ` +
    `X ${uniform ? "uniform" : "storage"} ${form}`;
  const { seed, rng } = testSeed(label);
  return { rng, context: `seed ${seed} ${label}` };
}

/**
 * One case of the output form: y (the stream h, one spare row poisoned), normed and partials
 * poisoned, then `h + x W^T (+ bias)`, `h * gamma` and the partial sums checked against float64.
 */
async function checkResidual(
  ctx: GpuContext,
  shape: Shape,
  kind: WeightKind,
  bias: boolean,
  uniform: boolean,
): Promise<void> {
  const [m, n, k] = shape;
  const { rng, context } = caseSeed(shape, kind, bias, uniform, "residual_rms");
  const x = rng.array(m * k);
  const w = rng.array(n * k);
  const h = rng.array(m * n, -2, 2);
  const gamma = rng.array(n, 0.5, 1.5);
  const b = bias ? rng.array(n) : undefined;
  const { weight, ref: wRef } = makeWeight(ctx, kind, w, n, k);
  const normDtype = kind.dtype;
  const gammaW = GpuMatrix.fromArray(ctx, "gamma", gamma, 1, n, normDtype);
  const stream = new Float32Array((m + 1) * n).fill(NaN);
  stream.set(h);
  const blocks = normPartialsPerRow(n);
  const buffers = {
    x: uploadX(ctx, x, uniform),
    y: upload(ctx, stream, "stream"),
    normed: poisonedF32(ctx, (m + 1) * n, "normed"),
    partials: poisonedF32(ctx, (m + 1) * blocks, "partials"),
    bias: b === undefined ? undefined : upload(ctx, b),
  };
  const arena = new ParamArena(ctx, 1);
  try {
    const matmul = new Matmul(ctx, { dtype: normDtype, bias, policy: "cpu" });
    const op = matmul.bind(arena, {
      x: whole(buffers.x),
      weight,
      ...(buffers.bias === undefined ? {} : { bias: whole(buffers.bias) }),
      y: whole(buffers.y),
      residual: {
        weight: gammaW,
        normed: whole(buffers.normed),
        partials: whole(buffers.partials),
      },
    });
    await runPass(ctx, arena, (pass) => op.encode(pass, m));
    const product = matmulRef(x, wRef, b, m, n, k);
    const hNew = product.map((v, i) => v + h[i]!);
    const g = roundTo(gamma, normDtype);
    const tolerance = kind.quant === undefined ? toleranceFor(kind.dtype) : toleranceFor("f32");
    const floor = termFloor(x, wRef, b, m, n, k, sumFloorFraction(k, tolerance));
    const got = await readF32(ctx, buffers.y);
    assertUntouchedFrom(got, m * n, `${context} stream`);
    assertClose(got.subarray(0, m * n), hNew, tolerance, `${context} stream`, floor);
    const normed = await readF32(ctx, buffers.normed);
    assertUntouchedFrom(normed, m * n, `${context} normed`);
    const normedRef = hNew.map((v, i) => v * g[i % n]!);
    assertClose(normed.subarray(0, m * n), normedRef, tolerance, `${context} normed`, floor);
    const partials = await readF32(ctx, buffers.partials);
    assertUntouchedFrom(partials, m * blocks, `${context} partials`);
    assertClose(
      partials.subarray(0, m * blocks),
      partialsRef(hNew, m, n),
      tolerance,
      `${context} partials`,
    );
  } finally {
    arena.destroy();
    for (const buf of Object.values(buffers)) buf?.destroy();
    weight.destroy();
    gammaW.destroy();
  }
}

/**
 * One case of the X form: X (h * gamma) and random positive partial sums (a poisoned row after
 * them), y poisoned; checks `rsqrt(sum / K + eps) X W^T (+ bias)` against float64.
 */
async function checkRowNorm(
  ctx: GpuContext,
  shape: Shape,
  kind: WeightKind,
  bias: boolean,
  uniform: boolean,
): Promise<void> {
  const [m, n, k] = shape;
  const { rng, context } = caseSeed(shape, kind, bias, uniform, "rms_partials");
  const x = rng.array(m * k, -2, 2);
  const w = rng.array(n * k);
  const b = bias ? rng.array(n) : undefined;
  const blocks = normPartialsPerRow(k);
  const sums = rng.array(m * blocks, 0.1, 3);
  const padded = new Float32Array((m + 1) * blocks).fill(NaN);
  padded.set(sums);
  const { weight, ref: wRef } = makeWeight(ctx, kind, w, n, k);
  const buffers = {
    x: uploadX(ctx, x, uniform),
    partials: upload(ctx, padded, "partials"),
    y: poisonedF32(ctx, (m + 1) * n),
    bias: b === undefined ? undefined : upload(ctx, b),
  };
  const arena = new ParamArena(ctx, 1);
  try {
    const matmul = new Matmul(ctx, { dtype: kind.dtype, bias, policy: "cpu" });
    const op = matmul.bind(arena, {
      x: whole(buffers.x),
      xForm: "rms_partials",
      rowNorm: { eps: EPS, partials: whole(buffers.partials) },
      weight,
      ...(buffers.bias === undefined ? {} : { bias: whole(buffers.bias) }),
      y: whole(buffers.y),
    });
    await runPass(ctx, arena, (pass) => op.encode(pass, m));
    const scale = Array.from({ length: m }, (_, i) => {
      let sum = 0;
      for (let j = 0; j < blocks; j++) sum += sums[i * blocks + j]!;
      return 1 / Math.sqrt(sum / k + EPS);
    });
    const plain = matmulRef(x, wRef, undefined, m, n, k);
    const expected = plain.map((v, i) => v * scale[Math.floor(i / n)]! + (b?.[i % n] ?? 0));
    const scaledX = x.map((v, i) => v * scale[Math.floor(i / k)]!);
    const tolerance = kind.quant === undefined ? toleranceFor(kind.dtype) : toleranceFor("f32");
    const floor = termFloor(scaledX, wRef, b, m, n, k, sumFloorFraction(k, tolerance));
    const got = await readF32(ctx, buffers.y);
    assertUntouchedFrom(got, m * n, `${context} y`);
    assertClose(got.subarray(0, m * n), expected, tolerance, `${context} y`, floor);
  } finally {
    arena.destroy();
    for (const buf of Object.values(buffers)) buf?.destroy();
    weight.destroy();
  }
}

/**
 * The weight kinds of shape `i` of K `k`: plain of each dtype; when K % 32 == 0 also int8 or
 * int4 (alternating by shape) in a random cpu layout, its norm weight f16 or f32.
 */
function kindsFor(i: number, k: number, rng: Rng): WeightKind[] {
  const plain = WEIGHT_DTYPES.map((dtype) => ({ dtype }));
  if (k % 32 !== 0) return plain;
  const layouts: WordLayout[] = ["texture", 1, 16];
  const quant = {
    dtype: WEIGHT_DTYPES[rng.int(0, WEIGHT_DTYPES.length - 1)]!,
    quant: i % 2 === 0 ? "int4" : "int8",
    layout: layouts[rng.int(0, layouts.length - 1)]!,
  } as const;
  return [...plain, quant];
}

const SHAPES: readonly Shape[] = [
  [1, 1, 32],
  [3, 67, 64],
  [1, 130, 96],
  // M past one block of 16 X rows (grid z), N past two workgroups of 128 rows.
  [17, 300, 32],
  // K % 8 == 4: the K tail; K % 4 == 2: X read as scalars.
  [5, 129, 36],
  [4, 70, 42],
  [2, 256, 128],
];

/**
 * Runs `check` on every shape and weight kind (a fresh seed for the kinds' choice per `name`),
 * with a bias and a uniform X binding on shapes that `bias` and `uniform` pick by index.
 */
async function eachCase(
  name: string,
  check: typeof checkResidual,
  bias: (i: number) => boolean,
  uniform: (i: number) => boolean,
): Promise<void> {
  const ctx = await testContext();
  const { rng } = testSeed(`${name} kinds`);
  for (const [i, shape] of SHAPES.entries()) {
    for (const kind of kindsFor(i, shape[2], rng)) {
      await check(ctx, shape, kind, bias(i), uniform(i));
    }
  }
}

Deno.test(
  "matmul() adds to the residual stream and writes the next norm's input when y is residual_rms",
  GPU_TEST,
  () => eachCase("residual_rms", checkResidual, (i) => i % 2 === 0, (i) => i % 3 !== 1),
);

Deno.test(
  "matmul() scales each row by the RMSNorm factor of its partial sums when X is rms_partials",
  GPU_TEST,
  () => eachCase("rms_partials", checkRowNorm, (i) => i % 2 === 1, (i) => i % 3 !== 2),
);

Deno.test(
  "matmul() residual_rms then rms_partials computes rmsNorm(h + x W1^T) W2^T",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    // [m, hidden, k1, n2]: hidden not a multiple of NORM_PARTIAL_ROWS, one, and past two.
    const cases = [[1, 200, 64, 33], [9, 128, 40, 70], [3, 300, 96, 128]] as const;
    for (const [m, hidden, k1, n2] of cases) {
      for (const dtype of WEIGHT_DTYPES) {
        const label = `chain m ${m} hidden ${hidden} k1 ${k1} n2 ${n2} ${dtype}`;
        const { seed, rng } = testSeed(label);
        const context = `seed ${seed} ${label}`;
        const x = rng.array(m * k1);
        const h = rng.array(m * hidden, -2, 2);
        const w1 = rng.array(hidden * k1);
        const w2 = rng.array(n2 * hidden);
        const gamma = rng.array(hidden, 0.5, 1.5);
        const one = makeWeight(ctx, { dtype }, w1, hidden, k1);
        const two = makeWeight(ctx, { dtype }, w2, n2, hidden);
        const gammaW = GpuMatrix.fromArray(ctx, "gamma", gamma, 1, hidden, dtype);
        const buffers = {
          x: uploadX(ctx, x, true),
          stream: upload(ctx, h, "stream"),
          normed: ctx.createBuffer("normed", m * hidden * 4, STORAGE_RW_UNIFORM),
          partials: poisonedF32(ctx, m * normPartialsPerRow(hidden), "partials"),
          y: poisonedF32(ctx, m * n2),
        };
        const arena = new ParamArena(ctx, 2);
        try {
          const matmul = new Matmul(ctx, { dtype, bias: false, policy: "cpu" });
          const first = matmul.bind(arena, {
            x: whole(buffers.x),
            weight: one.weight,
            y: whole(buffers.stream),
            residual: {
              weight: gammaW,
              normed: whole(buffers.normed),
              partials: whole(buffers.partials),
            },
          });
          const second = matmul.bind(arena, {
            x: whole(buffers.normed),
            xForm: "rms_partials",
            rowNorm: { eps: EPS, partials: whole(buffers.partials) },
            weight: two.weight,
            y: whole(buffers.y),
          });
          await runPass(ctx, arena, (pass) => {
            first.encode(pass, m);
            second.encode(pass, m);
          });
          const delta = matmulRef(x, one.ref, undefined, m, hidden, k1);
          const g = roundTo(gamma, dtype);
          const norm = fusedAddRmsNormRef(delta, h, g, denseRows(m, hidden), EPS);
          const expected = matmulRef(norm.out, two.ref, undefined, m, n2, hidden);
          const got = await readF32(ctx, buffers.y);
          const floor = termFloor(
            norm.out,
            two.ref,
            undefined,
            m,
            n2,
            hidden,
            sumFloorFraction(hidden, toleranceFor(dtype)),
          );
          assertClose(got, expected, toleranceFor(dtype), `${context} y`, floor);
          const stream = await readF32(ctx, buffers.stream);
          assertClose(stream, norm.residual, toleranceFor(dtype), `${context} stream`);
        } finally {
          arena.destroy();
          for (const buf of Object.values(buffers)) buf.destroy();
          one.weight.destroy();
          two.weight.destroy();
          gammaW.destroy();
        }
      }
    }
  },
);

Deno.test(
  "matmul() refuses residual_rms and rms_partials call sites it cannot run",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const n = 40;
    const k = 32;
    const weight = GpuMatrix.fromArray(ctx, "w", new Float32Array(n * k), n, k, "f32", {
      padColsTo: 8,
    });
    // Two parts of 24 and 16 rows.
    const split = GpuMatrix.fromArray(ctx, "split", new Float32Array(n * k), n, k, "f32", {
      padColsTo: 8,
      maxPartBytes: 24 * k * 4,
    });
    const gamma = GpuMatrix.fromArray(ctx, "gamma", new Float32Array(n).fill(1), 1, n, "f32");
    const narrow = GpuMatrix.fromArray(ctx, "narrow", new Float32Array(n - 1), 1, n - 1, "f32");
    const buf = (label: string) => ctx.createBuffer(label, 4 * n * k, STORAGE_RW_UNIFORM);
    const x = buf("x");
    const y = buf("y");
    const normed = buf("normed");
    const partials = buf("partials");
    const arena = new ParamArena(ctx, 8);
    try {
      const cpu = new Matmul(ctx, { dtype: "f32", bias: false, policy: "cpu" });
      const gpu = new Matmul(ctx, { dtype: "f32", bias: false, policy: "gpu" });
      const residual = { weight: gamma, normed: whole(normed), partials: whole(partials) };
      const base = { x: whole(x), weight, y: whole(y) };
      const rowNorm = { eps: EPS, partials: whole(partials) };
      assertThrows(() => gpu.bind(arena, { ...base, residual }), TypeError);
      assertThrows(
        () => gpu.bind(arena, { ...base, xForm: "rms_partials", rowNorm }),
        TypeError,
      );
      assertThrows(() => cpu.bind(arena, { ...base, xForm: "rms_partials" }), TypeError);
      assertThrows(() => cpu.bind(arena, { ...base, rowNorm }), TypeError);
      assertThrows(() => cpu.bind(arena, { ...base, weight: split, residual }), RangeError);
      assertThrows(
        () => cpu.bind(arena, { ...base, residual: { ...residual, weight: narrow } }),
        TypeError,
      );
      assertThrows(
        () => cpu.bind(arena, { ...base, residual: { ...residual, normed: whole(y) } }),
        RangeError,
      );
      assertThrows(
        () => cpu.bind(arena, { ...base, residual: { ...residual, partials: whole(normed) } }),
        RangeError,
      );
      assertThrows(
        () =>
          kernelSource(
            "gemv",
            1,
            "f32",
            false,
            false,
            "plain",
            "f32",
            TILE,
            1,
            4,
            0,
            1,
            64,
            "residual_rms",
          ),
        RangeError,
      );
      assertThrows(
        () => kernelSource("tiled", 1, "f32", false, false, "rms_partials"),
        RangeError,
      );
      // What it can run, it binds: the split weight with X rms_partials (no partial sums written).
      cpu.bind(arena, { ...base, weight: split, xForm: "rms_partials", rowNorm });
      cpu.bind(arena, { ...base, residual });
    } finally {
      arena.destroy();
      for (const b of [x, y, normed, partials]) b.destroy();
      for (const m of [weight, split, gamma, narrow]) m.destroy();
    }
  },
);

const STORAGE_RW_UNIFORM = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC |
  GPUBufferUsage.COPY_DST | GPUBufferUsage.UNIFORM;
