import assert from "node:assert/strict";
import { GatherRows } from "../kernels/gather_rows.ts";
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

Deno.test(
  "gather_rows() copies the selected rows exactly, repeats included",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const kernel = new GatherRows(ctx);
    for (const [srcRows, rows, cols] of [[1, 1, 1], [9, 4, 33], [40, 17, 1024]] as const) {
      const { seed, rng } = testSeed(`gather ${srcRows} ${rows} ${cols}`);
      const src = rng.array(srcRows * cols);
      const indices = Uint32Array.from({ length: rows }, () => rng.int(0, srcRows - 1));
      const arena = new ParamArena(ctx, 1);
      const out = poisonedF32(ctx, rows * cols);
      const op = kernel.bind(arena, {
        src: whole(upload(ctx, src)),
        indices: whole(upload(ctx, indices)),
        out: whole(out),
      });
      await runPass(ctx, arena, (pass) => op.encode(pass, rows, cols));
      const got = await readF32(ctx, out);
      const expected = new Float32Array(rows * cols);
      indices.forEach((r, i) => expected.set(src.subarray(r * cols, (r + 1) * cols), i * cols));
      assert.deepEqual(got, expected, `seed ${seed} [${srcRows} -> ${rows}, ${cols}]`);
    }
  },
);
