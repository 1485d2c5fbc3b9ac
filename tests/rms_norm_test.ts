import { equal, throws } from "node:assert/strict";
import { type NormShape, RmsNorm } from "../kernels/rms_norm.ts";
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
import {
  denseRows,
  forEachRow,
  fusedAddRmsNormRef,
  rmsNormRef,
  type RowLayout,
} from "./reference/norms.ts";

const DTYPES: DType[] = ["f32", "f16"];
const SHAPES = [[1, 1], [3, 7], [17, 33], [3, 1000], [17, 1024]] as const;
const EPS = 1e-6;
/**
 * The adapter's default workgroup shape, and cooperating lanes with several rows per workgroup
 * (the barrier path; the row counts here are not multiples of 4).
 */
const NORM_SHAPES: NormShape[] = [{}, { rowThreads: 16, rowsPerWorkgroup: 4 }];

/** Asserts every element outside the rows of `layout` kept its input value exactly. */
function assertUntouched(
  got: Float32Array,
  input: Float32Array,
  layout: RowLayout,
  context: string,
): void {
  const inRow = new Uint8Array(input.length);
  forEachRow(layout, (start) => inRow.fill(1, start, start + layout.cols));
  for (let i = 0; i < input.length; i++) {
    if (inRow[i] === 0 && !Object.is(got[i], input[i])) {
      throw new Error(
        `${context}: element ${i} outside the rows changed: ${input[i]} -> ${got[i]}`,
      );
    }
  }
}

Deno.test(
  "rms_norm() matches the float64 reference for odd shapes, f16 and f32 weights",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const shape of NORM_SHAPES) {
      const kernel = new RmsNorm(ctx, shape);
      for (const dtype of DTYPES) {
        for (const [tokens, cols] of SHAPES) {
          const name = `rms_norm ${JSON.stringify(shape)} ${dtype} [${tokens}, ${cols}]`;
          const { seed, rng } = testSeed(name);
          const x = rng.normals(tokens * cols, 2);
          const w = rng.array(cols, 0.5, 1.5);
          const weight = GpuMatrix.fromArray(ctx, "w", w, 1, cols, dtype);
          const arena = new ParamArena(ctx, 1);
          const out = poisonedF32(ctx, tokens * cols);
          const op = kernel.bind(arena, { weight, x: whole(upload(ctx, x)), out: whole(out) }, {
            eps: EPS,
          });
          await runPass(ctx, arena, (pass) => op.encode(pass, tokens));
          const want = rmsNormRef(x, roundTo(w, dtype), denseRows(tokens, cols), EPS);
          assertClose(await readF32(ctx, out), want, toleranceFor(dtype), `seed ${seed} ${name}`);
        }
      }
    }
  },
);

Deno.test(
  "rms_norm() per-head in place normalises Qwen3's q and k heads and nothing else",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const layouts = [[1, 4, 2, 128], [3, 3, 1, 33], [17, 2, 2, 7], [5, 16, 8, 128]] as const;
    for (const shape of NORM_SHAPES) {
      const kernel = new RmsNorm(ctx, shape);
      for (const dtype of DTYPES) {
        for (const [tokens, hq, hkv, headDim] of layouts) {
          const name = `rms_norm per-head ${
            JSON.stringify(shape)
          } ${dtype} t${tokens} q${hq} kv${hkv} d${headDim}`;
          const { seed, rng } = testSeed(name);
          const stride = (hq + 2 * hkv) * headDim;
          const qkv = rng.normals(tokens * stride, 2);
          const qw = rng.array(headDim, 0.5, 1.5);
          const kw = rng.array(headDim, 0.5, 1.5);
          const buf = upload(ctx, qkv);
          const arena = new ParamArena(ctx, 2);
          const qNorm = kernel.bind(
            arena,
            { weight: GpuMatrix.fromArray(ctx, "q_norm", qw, 1, headDim, dtype), x: whole(buf) },
            { heads: hq, tokenStride: stride, eps: EPS },
          );
          const kNorm = kernel.bind(
            arena,
            { weight: GpuMatrix.fromArray(ctx, "k_norm", kw, 1, headDim, dtype), x: whole(buf) },
            { heads: hkv, tokenStride: stride, offset: hq * headDim, eps: EPS },
          );
          await runPass(ctx, arena, (pass) => {
            qNorm.encode(pass, tokens);
            kNorm.encode(pass, tokens);
          });
          const qLayout = { tokens, heads: hq, cols: headDim, tokenStride: stride, offset: 0 };
          const kLayout = { ...qLayout, heads: hkv, offset: hq * headDim };
          const want = rmsNormRef(
            rmsNormRef(qkv, roundTo(qw, dtype), qLayout, EPS),
            roundTo(kw, dtype),
            kLayout,
            EPS,
          );
          const got = await readF32(ctx, buf);
          assertClose(got, want, toleranceFor(dtype), `seed ${seed} ${name}`);
          // The v block (neither q nor k rows) must be bit-identical.
          assertUntouched(got, qkv, { ...qLayout, heads: hq + hkv }, `seed ${seed} ${name}`);
        }
      }
    }
  },
);

Deno.test(
  "rms_norm() normalises rows that start off a multiple of 4 elements, in place, and nothing else",
  GPU_TEST,
  async () => {
    // Rows of 8 columns (a multiple of 4) from element 2 of each 14-element token: 16-byte
    // accesses would be misaligned, so the kernel must take its scalar form here.
    const ctx = await testContext();
    const kernel = new RmsNorm(ctx);
    for (const dtype of DTYPES) {
      const { seed, rng } = testSeed(`rms_norm offset rows ${dtype}`);
      const layout = { tokens: 5, heads: 1, cols: 8, tokenStride: 14, offset: 2 };
      const input = rng.normals(layout.tokens * layout.tokenStride, 2);
      const w = rng.array(layout.cols, 0.5, 1.5);
      const buf = upload(ctx, input);
      const arena = new ParamArena(ctx, 1);
      const op = kernel.bind(
        arena,
        { weight: GpuMatrix.fromArray(ctx, "w", w, 1, layout.cols, dtype), x: whole(buf) },
        { tokenStride: layout.tokenStride, offset: layout.offset, eps: EPS },
      );
      await runPass(ctx, arena, (pass) => op.encode(pass, layout.tokens));
      const got = await readF32(ctx, buf);
      const want = rmsNormRef(input, roundTo(w, dtype), layout, EPS);
      assertClose(got, want, toleranceFor(dtype), `seed ${seed} ${dtype}`);
      assertUntouched(got, input, layout, `seed ${seed} ${dtype}`);
    }
  },
);

Deno.test(
  "rms_norm() fused residual add matches the reference, out of place and in place",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const shape of NORM_SHAPES) {
      const kernel = new RmsNorm(ctx, shape);
      for (const dtype of DTYPES) {
        for (const [tokens, cols] of SHAPES) {
          for (const inPlace of [false, true]) {
            const name = `rms_norm fused ${inPlace ? "in place" : "out of place"} ${
              JSON.stringify(shape)
            } ${dtype} [${tokens}, ${cols}]`;
            const { seed, rng } = testSeed(name);
            const x = rng.normals(tokens * cols, 1);
            const residual = rng.normals(tokens * cols, 3);
            const w = rng.array(cols, 0.5, 1.5);
            const weight = GpuMatrix.fromArray(ctx, "w", w, 1, cols, dtype);
            const xBuf = upload(ctx, x);
            const resBuf = upload(ctx, residual);
            const out = inPlace ? xBuf : poisonedF32(ctx, tokens * cols);
            const arena = new ParamArena(ctx, 1);
            const op = kernel.bind(
              arena,
              {
                weight,
                x: whole(xBuf),
                residual: whole(resBuf),
                out: inPlace ? undefined : whole(out),
              },
              { eps: EPS },
            );
            await runPass(ctx, arena, (pass) => op.encode(pass, tokens));
            const want = fusedAddRmsNormRef(
              x,
              residual,
              roundTo(w, dtype),
              denseRows(tokens, cols),
              EPS,
            );
            const context = `seed ${seed} ${name}`;
            assertClose(await readF32(ctx, resBuf), want.residual, 1e-6, `${context} residual`);
            assertClose(await readF32(ctx, out), want.out, toleranceFor(dtype), context);
          }
        }
      }
    }
  },
);

Deno.test(
  "rms_norm() gathered add normalises residual + x at the indexed tokens into dense rows and writes nothing else",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const shape of NORM_SHAPES) {
      const kernel = new RmsNorm(ctx, shape);
      for (const dtype of DTYPES) {
        for (const [tokens, cols] of SHAPES) {
          const name = `rms_norm gathered ${JSON.stringify(shape)} ${dtype} [${tokens}, ${cols}]`;
          const { seed, rng } = testSeed(name);
          const x = rng.normals(tokens * cols, 1);
          const residual = rng.normals(tokens * cols, 3);
          const w = rng.array(cols, 0.5, 1.5);
          // Out of order, a repeat (two samples of one token), the last token; one row more in
          // out than gathered, which must stay poisoned.
          const indices = Uint32Array.from(
            { length: Math.min(tokens, 4) },
            (_, i) => [tokens - 1, 0, tokens - 1, tokens >> 1][i]!,
          );
          const rows = indices.length;
          const weight = GpuMatrix.fromArray(ctx, "w", w, 1, cols, dtype);
          const xBuf = upload(ctx, x);
          const resBuf = upload(ctx, residual);
          const out = poisonedF32(ctx, (rows + 1) * cols);
          const arena = new ParamArena(ctx, 1);
          const op = kernel.bind(
            arena,
            {
              weight,
              x: whole(xBuf),
              residual: whole(resBuf),
              out: whole(out),
              indices: whole(upload(ctx, indices)),
            },
            { eps: EPS },
          );
          await runPass(ctx, arena, (pass) => op.encode(pass, rows));
          const gathered = new Float64Array(rows * cols);
          indices.forEach((t, r) => {
            for (let c = 0; c < cols; c++) {
              gathered[r * cols + c] = residual[t * cols + c]! + x[t * cols + c]!;
            }
          });
          const want = rmsNormRef(gathered, roundTo(w, dtype), denseRows(rows, cols), EPS);
          const context = `seed ${seed} ${name}`;
          const got = await readF32(ctx, out);
          assertClose(got.subarray(0, rows * cols), want, toleranceFor(dtype), context);
          equal(
            got.subarray(rows * cols).every(Number.isNaN),
            true,
            `${context}: row past the last`,
          );
          const same = (a: Float32Array, b: ArrayLike<number>) => a.every((v, i) => v === b[i]);
          equal(same(await readF32(ctx, resBuf), residual), true, `${context}: residual written`);
          equal(same(await readF32(ctx, xBuf), x), true, `${context}: x written`);
        }
      }
    }
    const weight = GpuMatrix.fromArray(ctx, "w", new Float32Array(4), 1, 4, "f32");
    const buf = whole(upload(ctx, new Float32Array(8)));
    throws(
      () => new RmsNorm(ctx).bind(new ParamArena(ctx, 1), { weight, x: buf, indices: buf }),
      { name: "TypeError", message: /gathered rows \(indices\) need a residual and an out/ },
    );
  },
);

Deno.test("rms_norm() gives the same results for every workgroup shape", GPU_TEST, async () => {
  const ctx = await testContext();
  const shapes: NormShape[] = [
    { rowThreads: 1, rowsPerWorkgroup: 1 },
    { rowThreads: 1, rowsPerWorkgroup: 256 },
    { rowThreads: 64, rowsPerWorkgroup: 1 },
    { rowThreads: 256, rowsPerWorkgroup: 1 },
    { rowThreads: 2, rowsPerWorkgroup: 8 },
  ];
  for (const shape of shapes) {
    const kernel = new RmsNorm(ctx, shape);
    const [tokens, cols] = [5, 1000];
    const name = `rms_norm ${JSON.stringify(shape)}`;
    const { seed, rng } = testSeed(name);
    const x = rng.normals(tokens * cols, 2);
    const w = rng.array(cols, 0.5, 1.5);
    const weight = GpuMatrix.fromArray(ctx, "w", w, 1, cols, "f32");
    const arena = new ParamArena(ctx, 1);
    const out = poisonedF32(ctx, tokens * cols);
    const op = kernel.bind(arena, { weight, x: whole(upload(ctx, x)), out: whole(out) });
    await runPass(ctx, arena, (pass) => op.encode(pass, tokens));
    const want = rmsNormRef(x, w, denseRows(tokens, cols), 1e-6);
    assertClose(await readF32(ctx, out), want, 1e-4, `seed ${seed} ${name}`);
  }
});

Deno.test(
  "rms_norm() rejects bad weights, layouts, shapes and token counts",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const kernel = new RmsNorm(ctx);
    const arena = new ParamArena(ctx, 4);
    const x = whole(poisonedF32(ctx, 64));
    const twoRows = GpuMatrix.create(ctx, "w2", 2, 8, "f32");
    throws(() => kernel.bind(arena, { weight: twoRows, x }), TypeError);
    const w = GpuMatrix.create(ctx, "w", 1, 8, "f32");
    throws(() => kernel.bind(arena, { weight: w, x }, { heads: 2, tokenStride: 15 }), RangeError);
    const op = kernel.bind(arena, { weight: w, x }, { heads: 2, tokenStride: 20, offset: 4 });
    // 3 tokens end at 4 + 2 * 20 + 16 = 60 <= 64; 4 tokens would end at 80.
    throws(() => op.encode({} as GPUComputePassEncoder, 4), RangeError);
    equal(arena.used, 1);
    throws(() => new RmsNorm(ctx, { rowThreads: 48 }), RangeError);
    throws(() => new RmsNorm(ctx, { rowThreads: 64, rowsPerWorkgroup: 8 }), RangeError);
  },
);
