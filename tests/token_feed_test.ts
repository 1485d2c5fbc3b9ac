import { deepStrictEqual as assertEquals, throws as assertThrows } from "node:assert/strict";
import { packSampleParams, Sample } from "../kernels/sample.ts";
import { sampledRef, TokenFeed } from "../kernels/token_feed.ts";
import {
  GPU_TEST,
  ParamArena,
  poisonedF32,
  poisonedU32,
  readU32,
  runPass,
  testContext,
  upload,
  whole,
} from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { argmaxRef, tokenFeedRef } from "./reference/sample.ts";

Deno.test("token_feed() mixes host ids and sampled ids", GPU_TEST, async () => {
  const ctx = await testContext();
  const kernel = new TokenFeed(ctx);
  for (const [tokens, numSampled] of [[1, 1], [37, 5], [300, 64], [70000, 256]] as const) {
    const { seed, rng } = testSeed(`token_feed ${tokens}`);
    const sampled = Uint32Array.from({ length: numSampled }, () => rng.int(0, 151935));
    const hostIds = Uint32Array.from(
      { length: tokens },
      () => rng.next() < 0.4 ? sampledRef(rng.int(0, numSampled - 1)) : rng.int(0, 0x7fffffff),
    );
    const arena = new ParamArena(ctx, 2);
    const ids = poisonedU32(ctx, tokens, "ids");
    const op = kernel.bind(arena, {
      hostIds: whole(upload(ctx, hostIds)),
      sampled: whole(upload(ctx, sampled)),
      ids: whole(ids),
    });
    await runPass(ctx, arena, (pass) => op.encode(pass, tokens));
    assertEquals(
      Array.from(await readU32(ctx, ids, tokens)),
      Array.from(tokenFeedRef(hostIds, sampled)),
      `seed ${seed} tokens ${tokens}`,
    );
  }
});

Deno.test(
  "token_feed() feeds the tokens sampled in the same submission without a readback",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("token_feed after sample");
    const vocab = 5000;
    const seqs = 3;
    const logits = rng.normals(seqs * vocab, 2);
    const arena = new ParamArena(ctx, 4);
    const tokens = poisonedU32(ctx, seqs, "sampled");
    const sample = new Sample(ctx).bind(arena, {
      logits: whole(upload(ctx, logits)),
      params: whole(upload(ctx, new Uint32Array(packSampleParams([{}, {}, {}])))),
      tokens: whole(tokens),
      logprobs: whole(poisonedF32(ctx, seqs)),
    });
    // A prefill chunk of sequence 3 (host ids) next to decode tokens of sequences 2 and 0.
    const hostIds = Uint32Array.from([11, 12, 13, sampledRef(2), sampledRef(0)]);
    const ids = poisonedU32(ctx, hostIds.length, "ids");
    const feed = new TokenFeed(ctx).bind(arena, {
      hostIds: whole(upload(ctx, hostIds)),
      sampled: whole(tokens),
      ids: whole(ids),
    });
    await runPass(ctx, arena, (pass) => {
      sample.encode(pass, seqs, vocab);
      feed.encode(pass, hostIds.length);
    });
    const greedy = [0, 1, 2].map((s) => argmaxRef(logits.subarray(s * vocab, (s + 1) * vocab)));
    assertEquals(
      Array.from(await readU32(ctx, ids)),
      [11, 12, 13, greedy[2], greedy[0]],
      `seed ${seed}`,
    );
  },
);

Deno.test("sampledRef() sets bit 31 and rejects bad sequence indices", () => {
  assertEquals(sampledRef(0), 0x80000000);
  assertEquals(sampledRef(5), 0x80000005);
  assertThrows(() => sampledRef(-1), RangeError);
  assertThrows(() => sampledRef(2 ** 31), RangeError);
});
