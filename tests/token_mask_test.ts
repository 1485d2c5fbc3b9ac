/**
 * `token_mask` (kernels/token_mask.ts): the logits of forbidden tokens become MASKED_LOGIT in
 * exactly the constrained rows, every other logit is left bit for bit.
 */

import assert from "node:assert/strict";
import { MASKED_LOGIT, maskWords, TokenMask } from "../kernels/token_mask.ts";
import {
  GPU_TEST,
  ParamArena,
  readF32,
  runPass,
  testContext,
  upload,
  whole,
} from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";

Deno.test(
  "token_mask() masks the forbidden tokens of the listed rows only, for odd vocabularies",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const kernel = new TokenMask(ctx);
    for (const [rows, vocab] of [[1, 1], [3, 37], [5, 1000], [4, 151_936]] as const) {
      const { seed, rng } = testSeed(`token_mask ${rows} x ${vocab}`);
      const logits = rng.array(rows * vocab, -5, 5);
      // Mask a random subset of the rows (at least one), in shuffled order.
      const masked = rng.permutation(rows).slice(0, rng.int(1, rows));
      // One spare word per mask: kernels must use the stride they are given.
      const words = maskWords(vocab) + 1;
      const masks = new Uint32Array(masked.length * words);
      for (let i = 0; i < masks.length; i++) masks[i] = rng.int(0, 0xffffffff) >>> 0;
      const logitsBuf = upload(ctx, logits);
      const arena = new ParamArena(ctx, 1);
      try {
        const op = kernel.bind(arena, {
          logits: whole(logitsBuf),
          masks: whole(upload(ctx, masks)),
          rows: whole(upload(ctx, Uint32Array.from(masked))),
        });
        await runPass(ctx, arena, (pass) => op.encode(pass, masked.length, vocab, words));
        const got = await readF32(ctx, logitsBuf);
        const expected = Float32Array.from(logits);
        masked.forEach((row, m) => {
          for (let v = 0; v < vocab; v++) {
            const allowed = (masks[m * words + (v >> 5)]! >>> (v & 31)) & 1;
            if (allowed === 0) expected[row * vocab + v] = MASKED_LOGIT;
          }
        });
        assert.deepEqual(got, expected, `seed ${seed}: ${rows} x ${vocab}, rows ${masked}`);
      } finally {
        arena.destroy();
        logitsBuf.destroy();
      }
    }
    assert.throws(() => {
      const enc = ctx.device.createCommandEncoder();
      const pass = enc.beginComputePass();
      try {
        kernel.bind(new ParamArena(ctx, 1), {
          logits: whole(upload(ctx, new Float32Array(64))),
          masks: whole(upload(ctx, new Uint32Array(2))),
          rows: whole(upload(ctx, new Uint32Array(1))),
        }).encode(pass, 1, 64, 1);
      } finally {
        pass.end();
        ctx.device.queue.submit([enc.finish()]);
      }
    }, /2 words|cannot cover/);
  },
);
