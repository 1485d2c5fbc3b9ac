import { deepStrictEqual, throws } from "node:assert/strict";
import type { GpuContext } from "../gpu/context.ts";
import { type DType, kvBytesPerElement, type KvDtype, toDType } from "../gpu/dtype.ts";
import { readBuffer } from "../gpu/readback.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import { SKIP_SLOT } from "../kernels/reshape_and_cache.ts";
import { RopeAndCache } from "../kernels/rope_and_cache.ts";
import type { NormShape } from "../kernels/rms_norm.ts";
import { assertClose, assertRoundedWithin, relativeError } from "./support/assert_close.ts";
import {
  GPU_TEST,
  ParamArena,
  readF32,
  runPass,
  testContext,
  upload,
  WEIGHT_DTYPES,
  whole,
} from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { ropeAndCacheRef, ropeInvFreqRef } from "./reference/rope.ts";
import { fromKvData, roundToKv, toKvData } from "./reference/kv_values.ts";
import { e4m3Round } from "./reference/fp8.ts";

interface Case {
  readonly tokens: number;
  readonly hq: number;
  readonly hkv: number;
  readonly headDim: number;
  readonly blockSize: number;
  readonly theta: number;
  /** Positions drawn from [0, maxPos). */
  readonly maxPos: number;
  /** Qwen3's q/k head norms, with weights of this dtype; none when omitted. */
  readonly norm?: DType;
  /** Epsilon of the norms; default 1e-6 (Qwen3's). */
  readonly eps?: number;
}

/** Both profiles' workgroup shapes (1 lane x 64 rows: cpu; 64 x 1: gpu) and one in between. */
const SHAPES: NormShape[] = [
  { rowThreads: 1, rowsPerWorkgroup: 64 },
  { rowThreads: 64, rowsPerWorkgroup: 1 },
  { rowThreads: 8, rowsPerWorkgroup: 8 },
];

/**
 * Tolerances (normwise relative error) of q and of the k cache; v is copied exactly. An fp8 k
 * cache is checked element by element instead, with the f32 one's tolerance as its slack
 * (assertRoundedWithin).
 */
function tolerance(cache: KvDtype): { q: number; k: number } {
  // q stays f32 (measured ~1e-7 at positions < 32768); the k cache adds one f16 rounding
  // (<= 2^-11 relative) when the cache is f16.
  return { q: 1e-5, k: cache === "f16" ? 1e-3 : 1e-5 };
}

/**
 * Runs one case on random inputs: a random fused qkv, random distinct cache slots (every third
 * token SKIP_SLOT), random non-contiguous positions, caches filled with random values. Checks q
 * against the float64 reference, k / v and the cache slots not written bit for bit (v, untouched
 * slots) or within tolerance (k), and the k / v part of qkv unchanged. Returns the q error.
 */
async function checkCase(
  ctx: GpuContext,
  c: Case,
  cache: KvDtype,
  shape: NormShape,
): Promise<number> {
  const name = `rope_and_cache ${cache} cache ${JSON.stringify(c)} shape ${JSON.stringify(shape)}`;
  const { seed, rng } = testSeed(name);
  const context = `seed ${seed} ${name}`;
  const d = c.headDim;
  const stride = (c.hq + 2 * c.hkv) * d;
  const numBlocks = Math.ceil((c.tokens + 3) / c.blockSize) + 1;
  const qkv = rng.normals(c.tokens * stride, 2);
  const positions = Uint32Array.from({ length: c.tokens }, () => rng.int(0, c.maxPos - 1));
  if (c.tokens >= 3) [positions[0], positions[1]] = [0, c.maxPos - 1];
  const slots = rng.permutation(numBlocks * c.blockSize);
  const slotMapping = Uint32Array.from(
    { length: c.tokens },
    (_, t) => (t % 3 === 1 ? SKIP_SLOT : slots[t]!),
  );
  const cacheLen = numBlocks * c.hkv * c.blockSize * d;
  // The initial caches: their bytes from random values, and the values they hold.
  const [kRaw, vRaw] = [rng.array(cacheLen, -1, 1), rng.array(cacheLen, -1, 1)];
  const [kInit, vInit] = [roundToKv(kRaw, cache), roundToKv(vRaw, cache)];
  const invFreq = Float32Array.from(ropeInvFreqRef(c.theta, d));
  const normWeights = c.norm === undefined ? undefined : {
    q: toDType(rng.array(d, 0.5, 1.5), c.norm),
    k: toDType(rng.array(d, 0.5, 1.5), c.norm),
  };
  const eps = c.eps ?? 1e-6;
  const qkvBuf = upload(ctx, qkv, "qkv");
  const kCache = upload(ctx, toKvData(kRaw, cache), "k_cache");
  const vCache = upload(ctx, toKvData(vRaw, cache), "v_cache");
  const matrix = (label: string, w: ArrayLike<number>) =>
    GpuMatrix.fromArray(ctx, label, Float32Array.from(w), 1, d, c.norm!);
  const arena = new ParamArena(ctx, 1);
  const op = new RopeAndCache(ctx, shape).bind(arena, {
    qkv: whole(qkvBuf),
    positions: whole(upload(ctx, positions)),
    invFreq: whole(upload(ctx, invFreq)),
    slotMapping: whole(upload(ctx, slotMapping)),
    kCache: whole(kCache),
    vCache: whole(vCache),
    ...(normWeights === undefined
      ? {}
      : { qkNorm: { q: matrix("q_norm", normWeights.q), k: matrix("k_norm", normWeights.k) } }),
  }, {
    numHeads: c.hq,
    numKvHeads: c.hkv,
    headDim: d,
    blockSize: c.blockSize,
    cacheDtype: cache,
    eps,
  });
  await runPass(ctx, arena, (pass) => op.encode(pass, c.tokens));
  // For fp8 the reference writes f32 values to the cache (v exact, k unrounded), rounded below.
  // (Rounding the f32 k to e4m3 differs from rounding the float64 one only within 2^-24 relative
  // of a midpoint, far inside the k check's slack.)
  const fp8 = cache === "fp8_e4m3";
  const want = ropeAndCacheRef(
    qkv,
    positions,
    invFreq,
    slotMapping,
    { k: kInit, v: vInit },
    {
      tokens: c.tokens,
      numHeads: c.hq,
      numKvHeads: c.hkv,
      headDim: d,
      blockSize: c.blockSize,
      dtype: fp8 ? "f32" : cache,
      eps,
    },
    normWeights,
  );
  const got = await readF32(ctx, qkvBuf);
  const read = async (buffer: GPUBuffer) =>
    fromKvData(await readBuffer(ctx, buffer, 0, cacheLen * kvBytesPerElement(cache)), cache);
  const [gotK, gotV] = [await read(kCache), await read(vCache)];
  // Exact: the k and v heads of qkv, every v cache element, the k cache outside written slots.
  const mismatches: string[] = [];
  const note = (what: string, i: number, a: number, b: number) => {
    if (!Object.is(a, b) && mismatches.length < 5) mismatches.push(`${what}[${i}] ${a} != ${b}`);
  };
  for (let i = 0; i < got.length; i++) if (i % stride >= c.hq * d) note("qkv", i, got[i]!, qkv[i]!);
  const written = new Set<number>();
  for (const s of slotMapping) {
    if (s === SKIP_SLOT) continue;
    const block = Math.floor(s / c.blockSize);
    for (let h = 0; h < c.hkv; h++) {
      const at = ((block * c.hkv + h) * c.blockSize + (s % c.blockSize)) * d;
      for (let j = 0; j < d; j++) written.add(at + j);
    }
  }
  // The written v elements rounded to fp8 (the rest of want.v is vInit, already rounded).
  const wantV = fp8 ? Float64Array.from(want.v) : want.v;
  if (fp8) { for (const i of written) wantV[i] = roundToKv([want.v[i]!], cache)[0]!; }
  for (let i = 0; i < cacheLen; i++) note("v cache", i, gotV[i]!, wantV[i]!);
  for (let i = 0; i < cacheLen; i++) if (!written.has(i)) note("k cache", i, gotK[i]!, kInit[i]!);
  deepStrictEqual(mismatches, [], `${context}: elements that must be exact differ`);
  const tol = tolerance(cache);
  const qIndex = Array.from(
    { length: c.tokens * c.hq * d },
    (_, i) => Math.floor(i / (c.hq * d)) * stride + (i % (c.hq * d)),
  );
  const gotQ = qIndex.map((i) => got[i]!);
  const wantQ = qIndex.map((i) => want.qkv[i]!);
  assertClose(gotQ, wantQ, tol.q, `${context}: q`);
  const kIndex = [...written].sort((a, b) => a - b);
  if (fp8) {
    const slack = tolerance("f32").k * Math.max(...kIndex.map((i) => Math.abs(want.k[i]!)));
    assertRoundedWithin(gotK, want.k, kIndex, slack, e4m3Round, `${context}: k cache`);
  } else {
    assertClose(
      kIndex.map((i) => gotK[i]!),
      kIndex.map((i) => want.k[i]!),
      tol.k,
      `${context}: k cache`,
    );
  }
  return relativeError(gotQ, wantQ);
}

const CASES: Case[] = [
  // Qwen3-0.6B heads (16 q, 8 kv, head_dim 128), a 5-token chunk.
  { tokens: 5, hq: 16, hkv: 8, headDim: 128, blockSize: 16, theta: 1e6, maxPos: 4096, norm: "f32" },
  // Odd head and token counts, GQA 7:1, head_dim 64.
  { tokens: 13, hq: 7, hkv: 1, headDim: 64, blockSize: 8, theta: 1e4, maxPos: 4096, norm: "f32" },
  // Llama / Qwen2: no q/k norm; one decode token.
  { tokens: 1, hq: 3, hkv: 3, headDim: 128, blockSize: 16, theta: 5e5, maxPos: 4096 },
  { tokens: 9, hq: 5, hkv: 1, headDim: 64, blockSize: 4, theta: 1e4, maxPos: 100 },
  // A head_dim that is not a multiple of 4 (the kernel only needs it even); an eps that matters
  // beside the mean square (~4).
  {
    tokens: 3,
    hq: 2,
    hkv: 1,
    headDim: 34,
    blockSize: 16,
    theta: 1e4,
    maxPos: 4096,
    norm: "f32",
    eps: 1,
  },
];

for (const cache of WEIGHT_DTYPES) {
  Deno.test(
    `rope_and_cache() matches the float64 reference with and without q/k norm, ${cache} cache, every workgroup shape`,
    GPU_TEST,
    async () => {
      const ctx = await testContext();
      for (const shape of SHAPES) {
        for (const c of CASES) {
          await checkCase(ctx, c.norm === undefined ? c : { ...c, norm: cache }, cache, shape);
        }
      }
    },
  );
}

Deno.test(
  "rope_and_cache() writes e4m3 codes of the float64 reference to an fp8 cache, every workgroup shape",
  GPU_TEST,
  async () => {
    // The first three cases (Qwen3-0.6B's chunk, GQA 7:1, a decode token; head_dims multiples
    // of 8; the fourth left out for the file's run time), q/k norms of the weights' dtype.
    const ctx = await testContext();
    for (const shape of SHAPES) {
      for (const c of CASES.slice(0, 3)) {
        await checkCase(
          ctx,
          c.norm === undefined ? c : { ...c, norm: ctx.weightDtype },
          "fp8_e4m3",
          shape,
        );
      }
    }
  },
);

Deno.test(
  "rope_and_cache() stays within 1e-5 of the float64 reference at positions up to 32768",
  GPU_TEST,
  async () => {
    // The angle pos * inv_freq is reduced without rounding the product (measured ~4e-7 here);
    // rounding it to f32 first would give ~5e-4.
    const ctx = await testContext();
    for (const shape of SHAPES) {
      const c: Case = {
        tokens: 64,
        hq: 2,
        hkv: 1,
        headDim: 128,
        blockSize: 16,
        theta: 1e6,
        maxPos: 32768,
      };
      await checkCase(ctx, c, "f32", shape);
    }
  },
);

Deno.test(
  "rope_and_cache() takes norm weights of another dtype than the cache",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    if (!ctx.hasF16) return;
    const c: Case = {
      tokens: 7,
      hq: 4,
      hkv: 2,
      headDim: 64,
      blockSize: 8,
      theta: 1e6,
      maxPos: 4096,
    };
    for (const shape of SHAPES) {
      await checkCase(ctx, { ...c, norm: "f32" }, "f16", shape);
      await checkCase(ctx, { ...c, norm: "f16" }, "f32", shape);
    }
  },
);

Deno.test(
  "rope_and_cache() rejects bad shapes, fp8 caches of odd head dims and oversized token counts",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const kernel = new RopeAndCache(ctx);
    const arena = new ParamArena(ctx, 4);
    const buffers = {
      qkv: whole(upload(ctx, new Float32Array(3 * 4 * 16))),
      positions: whole(upload(ctx, new Uint32Array(4))),
      invFreq: whole(upload(ctx, new Float32Array(8))),
      slotMapping: whole(upload(ctx, new Uint32Array(4))),
      kCache: whole(upload(ctx, new Float32Array(64))),
      vCache: whole(upload(ctx, new Float32Array(64))),
    };
    const shape = {
      numHeads: 2,
      numKvHeads: 1,
      headDim: 16,
      blockSize: 4,
      cacheDtype: "f32",
    } as const;
    throws(() => kernel.bind(arena, buffers, { ...shape, headDim: 15 }), RangeError);
    throws(() => kernel.bind(arena, buffers, { ...shape, headDim: 32 }), RangeError); // invFreq
    throws(() => kernel.bind(arena, buffers, { ...shape, numKvHeads: 0 }), RangeError);
    const weight = GpuMatrix.fromArray(ctx, "w", new Float32Array(8), 1, 8, "f32");
    throws(
      () => kernel.bind(arena, { ...buffers, qkNorm: { q: weight, k: weight } }, shape),
      RangeError,
    );
    // An fp8 cache needs whole vec4 halves of a head: 6 and 12 are refused (an f32 cache takes
    // them, one element per access), 16 binds.
    for (const headDim of [6, 12]) {
      throws(() => kernel.bind(arena, buffers, { ...shape, headDim, cacheDtype: "fp8_e4m3" }), {
        name: "RangeError",
        message: new RegExp(
          `fp8 KV cache needs a head dim that is a multiple of 8, got ${headDim}`,
        ),
      });
      kernel.bind(new ParamArena(ctx, 1), buffers, { ...shape, headDim });
    }
    kernel.bind(new ParamArena(ctx, 1), buffers, { ...shape, cacheDtype: "fp8_e4m3" });
    const op = kernel.bind(arena, buffers, shape);
    throws(() => op.encode({} as GPUComputePassEncoder, 4), RangeError);
    op.encode({} as GPUComputePassEncoder, 0); // nothing to encode
  },
);
