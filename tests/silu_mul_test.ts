import { SiluMul } from "../kernels/silu_mul.ts";
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
import { siluMulRef } from "./reference/activations.ts";

Deno.test("silu_mul() matches the float64 reference for odd shapes", GPU_TEST, async () => {
  const ctx = await testContext();
  const kernel = new SiluMul(ctx);
  for (const [tokens, inter] of [[1, 1], [3, 37], [17, 300], [2, 3072]] as const) {
    const { seed, rng } = testSeed(`silu_mul ${tokens}x${inter}`);
    const gateUp = rng.array(tokens * 2 * inter, -6, 6);
    const arena = new ParamArena(ctx, 4);
    const out = poisonedF32(ctx, tokens * inter);
    const op = kernel.bind(arena, { gateUp: whole(upload(ctx, gateUp)), out: whole(out) });
    await runPass(ctx, arena, (pass) => op.encode(pass, tokens, inter));
    const got = await readF32(ctx, out);
    assertClose(got, siluMulRef(gateUp, tokens, inter), 1e-5, `seed ${seed} [${tokens}, ${inter}]`);
  }
});
