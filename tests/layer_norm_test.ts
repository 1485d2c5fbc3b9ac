import { throws } from "node:assert/strict";
import { LayerNorm } from "../kernels/layer_norm.ts";
import type { NormShape } from "../kernels/rms_norm.ts";
import { type DType, roundTo } from "../gpu/dtype.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
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
import { layerNormRef } from "./reference/norms.ts";

const DTYPES: DType[] = ["f32", "f16"];
const SHAPES = [[1, 1], [3, 7], [17, 33], [3, 1000], [17, 1024]] as const;

Deno.test(
  "layer_norm() matches the float64 reference for odd shapes, f16 and f32 weights",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    // The adapter's default shape, and cooperating lanes with several rows per workgroup.
    const normShapes: NormShape[] = [{}, { rowThreads: 16, rowsPerWorkgroup: 4 }];
    for (const shape of normShapes) {
      const kernel = new LayerNorm(ctx, shape);
      for (const dtype of DTYPES) {
        for (const [rows, cols] of SHAPES) {
          const name = `layer_norm ${JSON.stringify(shape)} ${dtype} [${rows}, ${cols}]`;
          const { seed, rng } = testSeed(name);
          // A large common offset per row checks that the variance is computed around the mean.
          const x = rng.normals(rows * cols, 2);
          for (let r = 0; r < rows; r++) {
            const shift = rng.uniform(-50, 50);
            for (let c = 0; c < cols; c++) x[r * cols + c]! += shift;
          }
          const w = rng.array(cols, 0.5, 1.5);
          const b = rng.array(cols, -0.5, 0.5);
          const weight = GpuMatrix.fromArray(ctx, "ln.w", w, 1, cols, dtype);
          const bias = GpuMatrix.fromArray(ctx, "ln.b", b, 1, cols, dtype);
          const arena = new ParamArena(ctx, 1);
          const out = poisonedF32(ctx, rows * cols);
          const op = kernel.bind(arena, {
            weight,
            bias,
            x: whole(upload(ctx, x)),
            out: whole(out),
          });
          await runPass(ctx, arena, (pass) => op.encode(pass, rows));
          const want = layerNormRef(x, roundTo(w, dtype), roundTo(b, dtype), rows, cols, 1e-5);
          assertClose(await readF32(ctx, out), want, toleranceFor(dtype), `seed ${seed} ${name}`);
        }
      }
    }
  },
);

Deno.test(
  "layer_norm() gives the same results for every workgroup shape",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const shapes: NormShape[] = [
      { rowThreads: 1, rowsPerWorkgroup: 1 },
      { rowThreads: 1, rowsPerWorkgroup: 256 },
      { rowThreads: 64, rowsPerWorkgroup: 1 },
      { rowThreads: 256, rowsPerWorkgroup: 1 },
      { rowThreads: 2, rowsPerWorkgroup: 8 },
    ];
    for (const shape of shapes) {
      const kernel = new LayerNorm(ctx, shape);
      const [rows, cols] = [5, 1000];
      const name = `layer_norm ${JSON.stringify(shape)}`;
      const { seed, rng } = testSeed(name);
      const x = rng.normals(rows * cols, 2);
      const w = rng.array(cols, 0.5, 1.5);
      const b = rng.array(cols, -0.5, 0.5);
      const arena = new ParamArena(ctx, 1);
      const out = poisonedF32(ctx, rows * cols);
      const op = kernel.bind(arena, {
        weight: GpuMatrix.fromArray(ctx, "ln.w", w, 1, cols, "f32"),
        bias: GpuMatrix.fromArray(ctx, "ln.b", b, 1, cols, "f32"),
        x: whole(upload(ctx, x)),
        out: whole(out),
      });
      await runPass(ctx, arena, (pass) => op.encode(pass, rows));
      assertClose(
        await readF32(ctx, out),
        layerNormRef(x, w, b, rows, cols, 1e-5),
        1e-4,
        `seed ${seed} ${name}`,
      );
    }
  },
);

Deno.test(
  "layer_norm() rejects mismatched weight and bias and too many rows",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const kernel = new LayerNorm(ctx);
    const arena = new ParamArena(ctx, 2);
    const x = whole(poisonedF32(ctx, 32));
    const out = whole(poisonedF32(ctx, 32));
    const weight = GpuMatrix.create(ctx, "w", 1, 8, "f32");
    throws(
      () => kernel.bind(arena, { weight, bias: GpuMatrix.create(ctx, "b", 1, 9, "f32"), x, out }),
      TypeError,
    );
    const op = kernel.bind(arena, {
      weight,
      bias: GpuMatrix.create(ctx, "b", 1, 8, "f32"),
      x,
      out,
    });
    throws(() => op.encode({} as GPUComputePassEncoder, 5), RangeError);
  },
);
