import { throws } from "node:assert/strict";
import { Rope, ropeInvFreq } from "../kernels/rope.ts";
import type { GpuContext } from "../gpu/context.ts";
import { assertClose, relativeError } from "./support/assert_close.ts";
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
import { ropeInvFreqRef, ropeRef, type RopeRefLayout } from "./reference/rope.ts";

interface Case {
  readonly tokens: number;
  readonly hq: number;
  readonly hkv: number;
  readonly headDim: number;
  readonly rotaryDim?: number;
  readonly theta: number;
  /** Positions drawn from [0, maxPos). */
  readonly maxPos: number;
  /** Rotate only the k heads (offset = hq * headDim) instead of q and k together. */
  readonly kOnly?: boolean;
}

/**
 * Rotates the q and k heads (or only the k heads) of a random fused
 * [tokens, (hq + 2 hkv) * headDim] qkv buffer in one dispatch at random, non-contiguous
 * positions and compares the whole buffer with the float64 reference within `tolerance`. Every
 * element outside the rotated pairs (v heads, partial-rotary tails) must be bit-identical.
 * Returns the normwise error.
 */
async function checkCase(ctx: GpuContext, c: Case, tolerance: number): Promise<number> {
  const name = `rope ${JSON.stringify(c)}`;
  const { seed, rng } = testSeed(name);
  const rotaryDim = c.rotaryDim ?? c.headDim;
  const stride = (c.hq + 2 * c.hkv) * c.headDim;
  const firstHead = c.kOnly ? c.hq : 0;
  const heads = c.kOnly ? c.hkv : c.hq + c.hkv;
  const qkv = rng.normals(c.tokens * stride, 1);
  const positions = Uint32Array.from({ length: c.tokens }, () => rng.int(0, c.maxPos - 1));
  if (c.tokens >= 3) {
    positions[0] = 0;
    positions[1] = c.maxPos - 1;
  }
  const invFreq = ropeInvFreq(c.headDim, c.theta, rotaryDim);
  const buf = upload(ctx, qkv);
  const arena = new ParamArena(ctx, 1);
  const op = new Rope(ctx).bind(
    arena,
    {
      qkv: whole(buf),
      positions: whole(upload(ctx, positions)),
      invFreq: whole(upload(ctx, invFreq)),
    },
    { heads, headDim: c.headDim, tokenStride: stride, offset: firstHead * c.headDim, rotaryDim },
  );
  await runPass(ctx, arena, (pass) => op.encode(pass, c.tokens));
  const layout: RopeRefLayout = {
    tokens: c.tokens,
    heads,
    headDim: c.headDim,
    tokenStride: stride,
    offset: firstHead * c.headDim,
    rotaryDim,
  };
  const got = await readF32(ctx, buf);
  const want = ropeRef(qkv, positions, invFreq, layout);
  const context = `seed ${seed} ${name} positions [${positions.slice(0, 6).join(", ")}${
    c.tokens > 6 ? ", ..." : ""
  }]`;
  for (let t = 0; t < c.tokens; t++) {
    for (let j = 0; j < stride; j++) {
      const head = Math.floor(j / c.headDim);
      const rotated = head >= firstHead && head < firstHead + heads && j % c.headDim < rotaryDim;
      const i = t * stride + j;
      if (!rotated && !Object.is(got[i], qkv[i])) {
        throw new Error(`${context}: element ${i} should be untouched: ${qkv[i]} -> ${got[i]}`);
      }
    }
  }
  assertClose(got, want, tolerance, context);
  return relativeError(got, want);
}

Deno.test(
  "rope() matches the float64 reference on fused qkv at non-contiguous positions < 4096",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const cases: Case[] = [
      { tokens: 1, hq: 16, hkv: 8, headDim: 128, theta: 1e6, maxPos: 4096 }, // Qwen3-0.6B
      { tokens: 3, hq: 4, hkv: 2, headDim: 64, theta: 1e4, maxPos: 4096 },
      { tokens: 17, hq: 3, hkv: 1, headDim: 2, theta: 1e4, maxPos: 4096 },
      { tokens: 17, hq: 2, hkv: 2, headDim: 34, theta: 5e5, maxPos: 100 },
      { tokens: 5, hq: 4, hkv: 2, headDim: 64, rotaryDim: 16, theta: 1e4, maxPos: 4096 },
      { tokens: 3, hq: 4, hkv: 2, headDim: 128, theta: 1e6, maxPos: 4096, kOnly: true },
    ];
    for (const c of cases) await checkCase(ctx, c, 1e-4);
  },
);

Deno.test(
  "rope() stays within 1e-5 of the float64 reference at positions up to 32768",
  GPU_TEST,
  async () => {
    // The kernel reduces pos * inv_freq without rounding the product (measured ~4e-7 here);
    // rounding it to f32 first would give ~5e-4.
    const ctx = await testContext();
    await checkCase(
      ctx,
      { tokens: 64, hq: 2, hkv: 1, headDim: 128, theta: 1e6, maxPos: 32768 },
      1e-5,
    );
  },
);

Deno.test("ropeInvFreq() matches theta^(-2i/d) rounded to f32", () => {
  for (const [headDim, theta, rotaryDim] of [[128, 1e6, 128], [64, 1e4, 64], [64, 1e4, 16]]) {
    const got = ropeInvFreq(headDim!, theta!, rotaryDim);
    const want = ropeInvFreqRef(theta!, rotaryDim!);
    assertClose(got, want, 1e-7, `head dim ${headDim} theta ${theta} rotary ${rotaryDim}`);
  }
  throws(() => ropeInvFreq(64, 1e4, 65), RangeError);
  throws(() => ropeInvFreq(64, 1e4, 66), RangeError);
});

Deno.test("rope() rejects bad layouts and oversized token counts", GPU_TEST, async () => {
  const ctx = await testContext();
  const rope = new Rope(ctx);
  const arena = new ParamArena(ctx, 4);
  const buffers = {
    qkv: whole(poisonedF32(ctx, 3 * 64)),
    positions: whole(upload(ctx, new Uint32Array(4))),
    invFreq: whole(upload(ctx, ropeInvFreq(16, 1e4))),
  };
  throws(() => rope.bind(arena, buffers, { heads: 4, headDim: 16, tokenStride: 63 }), RangeError);
  throws(() => rope.bind(arena, buffers, { heads: 2, headDim: 32, tokenStride: 64 }), RangeError);
  const op = rope.bind(arena, buffers, { heads: 4, headDim: 16, tokenStride: 64 });
  throws(() => op.encode({} as GPUComputePassEncoder, 4), RangeError);
});
