import { throws } from "node:assert/strict";
import { Add } from "../kernels/add.ts";
import { assertClose } from "./support/assert_close.ts";
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

const COUNTS = [1, 7, 33, 1000, 1024, 17 * 1000 + 3];

function addRef(a: Float32Array, b: Float32Array): Float64Array {
  return Float64Array.from(a, (v, i) => v + b[i]!);
}

Deno.test("add() matches the float64 reference out of place for odd sizes", GPU_TEST, async () => {
  const ctx = await testContext();
  const kernel = new Add(ctx);
  for (const count of COUNTS) {
    const { seed, rng } = testSeed(`add out of place ${count}`);
    const a = rng.normals(count, 3);
    const b = rng.normals(count, 3);
    const arena = new ParamArena(ctx, 2);
    const out = poisonedF32(ctx, count);
    const op = kernel.bind(arena, {
      a: whole(upload(ctx, a)),
      b: whole(upload(ctx, b)),
      out: whole(out),
    });
    await runPass(ctx, arena, (pass) => op.encode(pass, count));
    assertClose(await readF32(ctx, out), addRef(a, b), 1e-6, `seed ${seed} count ${count}`);
  }
});

Deno.test(
  "add() in place updates a and leaves elements past count untouched",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const kernel = new Add(ctx);
    for (const count of COUNTS) {
      const { seed, rng } = testSeed(`add in place ${count}`);
      // a is longer than count: the tail must keep its values.
      const a = rng.normals(count + 5, 3);
      const b = rng.normals(count, 3);
      const aBuf = upload(ctx, a);
      const arena = new ParamArena(ctx, 2);
      const op = kernel.bind(arena, { a: whole(aBuf), b: whole(upload(ctx, b)) });
      await runPass(ctx, arena, (pass) => op.encode(pass, count));
      const expected = Float64Array.from(a, (v, i) => i < count ? v + b[i]! : v);
      assertClose(await readF32(ctx, aBuf), expected, 1e-6, `seed ${seed} count ${count}`);
    }
  },
);

Deno.test("add() rejects a count larger than the bound buffers", GPU_TEST, async () => {
  const ctx = await testContext();
  const arena = new ParamArena(ctx, 1);
  const op = new Add(ctx).bind(arena, {
    a: whole(poisonedF32(ctx, 8)),
    b: whole(poisonedF32(ctx, 4)),
  });
  throws(() => op.encode({} as GPUComputePassEncoder, 5), RangeError);
});
