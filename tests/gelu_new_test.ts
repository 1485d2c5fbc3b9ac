import { throws } from "node:assert/strict";
import { GeluNew } from "../kernels/gelu_new.ts";
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
import { geluNewRef } from "./reference/activations.ts";

const COUNTS = [1, 7, 33, 1000, 1024, 17 * 3072 + 5];

/**
 * Uniform inputs in [-8, 8] with a few huge values (tanh saturation must not give NaN) and
 * x[0] = 3.
 */
function inputs(name: string, count: number): { seed: number; x: Float32Array } {
  const { seed, rng } = testSeed(name);
  const x = rng.array(count, -8, 8);
  for (const v of [-1e4, -40, 40, 1e4]) x[rng.int(0, count - 1)] = v;
  // Anchor the [-3, 3] check's scale: gelu(3) ~ 3.
  x[0] = 3;
  return { seed, x };
}

Deno.test(
  "gelu_new() matches the float64 reference out of place for odd sizes",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const kernel = new GeluNew(ctx);
    for (const count of COUNTS) {
      const { seed, x } = inputs(`gelu_new out of place ${count}`, count);
      const arena = new ParamArena(ctx, 2);
      const out = poisonedF32(ctx, count);
      const op = kernel.bind(arena, { input: whole(upload(ctx, x)), out: whole(out) });
      await runPass(ctx, arena, (pass) => op.encode(pass, count));
      // Normwise against the largest |gelu(x)|; the huge inputs dominate it, so also check the
      // inputs in [-3, 3] on their own (measured error there ~1.3e-7 on lavapipe).
      const got = await readF32(ctx, out);
      const want = geluNewRef(x);
      assertClose(got, want, 1e-6, `seed ${seed} count ${count}`);
      const small = Array.from(x.keys()).filter((i) => Math.abs(x[i]!) <= 3);
      assertClose(
        small.map((i) => got[i]!),
        small.map((i) => want[i]!),
        1e-6,
        `seed ${seed} count ${count}, inputs in [-3, 3]`,
      );
    }
  },
);

Deno.test(
  "gelu_new() in place matches the reference and leaves the tail untouched",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const kernel = new GeluNew(ctx);
    for (const count of [1, 33, 1000]) {
      const { seed, x } = inputs(`gelu_new in place ${count}`, count + 3);
      const buf = upload(ctx, x);
      const arena = new ParamArena(ctx, 2);
      const op = kernel.bind(arena, { input: whole(buf) });
      await runPass(ctx, arena, (pass) => op.encode(pass, count));
      const gelu = geluNewRef(x);
      const expected = Float64Array.from(x, (v, i) => i < count ? gelu[i]! : v);
      assertClose(await readF32(ctx, buf), expected, 1e-6, `seed ${seed} count ${count}`);
    }
  },
);

Deno.test("gelu_new() rejects a count larger than the bound buffers", GPU_TEST, async () => {
  const ctx = await testContext();
  const op = new GeluNew(ctx).bind(new ParamArena(ctx, 1), {
    input: whole(poisonedF32(ctx, 8)),
    out: whole(poisonedF32(ctx, 4)),
  });
  throws(() => op.encode({} as GPUComputePassEncoder, 5), RangeError);
});
