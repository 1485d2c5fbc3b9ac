/**
 * The decode attention's fused variant (kernels/paged_attention_decode_rope.wgsl) of both
 * kernels (`workgroup`, `unrolled`): q/k head norms, RoPE and the new token's K/V write done
 * inside the attention, against the float64
 * references of `rope_and_cache` followed by paged attention (random inputs, GQA 1-4, head dims
 * 64-128, f16 / f32 / fp8 caches, with and without norms, split-K on and off). The new
 * position's K and V start as NaN in the cache, so attention that read them before the write
 * fails; one sequence has no slot (SKIP_SLOT) and keeps its cached values.
 */

import { deepStrictEqual, equal, rejects, throws } from "node:assert/strict";
import { type DType, type KvDtype, toDType } from "../gpu/dtype.ts";
import { readBuffer } from "../gpu/readback.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import {
  PagedAttentionDecode,
  unrolledFusedBytes,
  unrolledFusedFits,
} from "../kernels/paged_attention_decode.ts";
import type { PagedAttentionDecodeVariant } from "../kernels/paged_attention_decode_config.ts";
import type { GpuContext } from "../gpu/context.ts";
import { SKIP_SLOT } from "../kernels/reshape_and_cache.ts";
import { assertClose, assertRoundedWithin, kvTolerance } from "./support/assert_close.ts";
import {
  GPU_TEST,
  HAS_F16,
  ParamArena,
  poisonedF32,
  readF32,
  runPass,
  testContext,
  upload,
  whole,
} from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { buildPagedCache, pagedAttentionRef } from "./reference/attention.ts";
import { ropeAndCacheRef, ropeInvFreqRef } from "./reference/rope.ts";
import { fromKvData, roundToKv } from "./reference/kv_values.ts";
import { e4m3Round } from "./reference/fp8.ts";

interface Case {
  readonly hq: number;
  readonly hkv: number;
  readonly headDim: number;
  readonly blockSize: number;
  readonly dtype: KvDtype;
  /** Qwen3's q/k head norms with weights of this dtype; none when null. */
  readonly norm: DType | null;
  readonly partitionSize: number;
}

/** Context lengths (the new token included): block (16) and tile (64) boundaries, one split. */
const LENS = [1, 16, 17, 65, 300];
/** The sequence whose new token has no cache slot. */
const SKIPPED = 2;

async function checkCase(c: Case, variant: PagedAttentionDecodeVariant): Promise<void> {
  const ctx = await testContext();
  const { hq, hkv, headDim: d, blockSize, dtype } = c;
  const name = `fused ${variant} decode ${JSON.stringify(c)}`;
  const { seed, rng } = testSeed(name);
  const context = `seed ${seed} ${name}`;
  const stride = (hq + 2 * hkv) * d;
  // Every sequence's cached K / V; the new (last) position NaN except in the skipped sequence.
  const seqK = LENS.map((len) => rng.array(len * hkv * d, -1, 1));
  const seqV = LENS.map((len) => rng.array(len * hkv * d, -1, 1));
  LENS.forEach((len, s) => {
    if (s !== SKIPPED) {
      seqK[s]!.fill(NaN, (len - 1) * hkv * d);
      seqV[s]!.fill(NaN, (len - 1) * hkv * d);
    }
  });
  const cache = buildPagedCache({
    seqK,
    seqV,
    numKvHeads: hkv,
    headDim: d,
    blockSize,
    dtype,
    rng,
    btStride: Math.ceil(Math.max(...LENS) / blockSize) + 1,
  });
  const slotMapping = Uint32Array.from(LENS, (len, s) => {
    const block = cache.blockTables[s * cache.btStride + Math.floor((len - 1) / blockSize)]!;
    return s === SKIPPED ? SKIP_SLOT : block * blockSize + ((len - 1) % blockSize);
  });
  const positions = Uint32Array.from(LENS, () => rng.int(0, 40000));
  const qkv = rng.normals(LENS.length * stride, 2);
  const invFreq = Float32Array.from(ropeInvFreqRef(1e6, d));
  const normWeights = c.norm === null ? undefined : {
    q: toDType(rng.array(d, 0.5, 1.5), c.norm),
    k: toDType(rng.array(d, 0.5, 1.5), c.norm),
  };
  const eps = 1e-6;
  // For fp8 the reference writes f32 values to the cache (v exact, k unrounded), rounded below.
  const fp8 = dtype === "fp8_e4m3";
  const want = ropeAndCacheRef(qkv, positions, invFreq, slotMapping, cache, {
    tokens: LENS.length,
    numHeads: hq,
    numKvHeads: hkv,
    headDim: d,
    blockSize,
    dtype: fp8 ? "f32" : dtype,
    eps,
  }, normWeights);
  // The elements the prologue writes: the new token's K and V heads (but the skipped sequence's).
  const written = new Set<number>();
  for (const slot of slotMapping) {
    if (slot === SKIP_SLOT) continue;
    const block = Math.floor(slot / blockSize);
    for (let h = 0; h < hkv; h++) {
      const base = ((block * hkv + h) * blockSize + (slot % blockSize)) * d;
      for (let j = 0; j < d; j++) written.add(base + j);
    }
  }
  // The caches the reference attends to: fp8's written elements rounded.
  const [wantK, wantV] = [Float64Array.from(want.k), Float64Array.from(want.v)];
  for (const i of fp8 ? written : []) {
    const [k, v] = roundToKv([want.k[i]!, want.v[i]!], dtype);
    [wantK[i], wantV[i]] = [k!, v!];
  }
  const attention = (kCache: ArrayLike<number>) =>
    pagedAttentionRef({
      q: want.qkv,
      qStride: stride,
      numQHeads: hq,
      numKvHeads: hkv,
      headDim: d,
      blockSize,
      kCache,
      vCache: wantV,
      blockTables: cache.blockTables,
      btStride: cache.btStride,
      contextLens: cache.contextLens,
    });
  const expected = attention(wantK);

  const kernel = new PagedAttentionDecode(ctx, {
    numQHeads: hq,
    numKvHeads: hkv,
    headDim: d,
    blockSize,
    dtype,
    partitionSize: c.partitionSize,
    variant,
    rope: { normDtype: c.norm, eps },
  });
  const matrix = (label: string, w: ArrayLike<number>) =>
    GpuMatrix.fromArray(ctx, label, Float32Array.from(w), 1, d, c.norm!);
  const scratch = kernel.createScratch(LENS.length, Math.max(...LENS));
  const arena = new ParamArena(ctx, 2);
  const kCache = upload(ctx, cache.kData, "k_cache");
  const vCache = upload(ctx, cache.vData, "v_cache");
  const out = poisonedF32(ctx, LENS.length * hq * d);
  const qkvBuf = upload(ctx, qkv, "qkv");
  const op = kernel.bind(arena, {
    q: whole(qkvBuf),
    kCache: whole(kCache),
    vCache: whole(vCache),
    blockTables: whole(upload(ctx, cache.blockTables)),
    contextLens: whole(upload(ctx, cache.contextLens)),
    out: whole(out),
    scratch,
    rope: {
      positions: whole(upload(ctx, positions)),
      invFreq: whole(upload(ctx, invFreq)),
      slotMapping: whole(upload(ctx, slotMapping)),
      ...(normWeights === undefined
        ? {}
        : { qkNorm: { q: matrix("q_norm", normWeights.q), k: matrix("k_norm", normWeights.k) } }),
    },
  }, { qStride: stride, btStride: cache.btStride });
  equal(op.fusesRope, true, context);
  const read = async (buffer: GPUBuffer) =>
    fromKvData(await readBuffer(ctx, buffer, 0, cache.kData.byteLength), dtype);
  // The initial caches' values, as uploaded.
  const initK = fromKvData(cache.kData.buffer as ArrayBuffer, dtype);
  const initV = fromKvData(cache.vData.buffer as ArrayBuffer, dtype);
  // A K cache element rounds once more than the reference's f64 (the f32 arithmetic); V is copied.
  // fp8: each K element the e4m3 rounding of a value within the f32 tolerance of the reference
  // (assertRoundedWithin).
  const kTolerance = dtype === "f16" ? 1e-3 : 1e-5;
  const kSlack = kTolerance * Math.max(...[...written].map((i) => Math.abs(want.k[i]!)));
  // Every width the kernel runs (the workgroup kernel's 256 here too: its prologue's loops stride
  // by the width).
  const modes = kernel.widths.flatMap((width) =>
    ([false, true, 64] as const).map((split) => ({ split, width }))
  );
  for (const { split, width } of modes) {
    const mode = `${context} split ${split} width ${width}`;
    ctx.device.queue.writeBuffer(kCache, 0, cache.kData as Float32Array<ArrayBuffer>);
    ctx.device.queue.writeBuffer(vCache, 0, cache.vData as Float32Array<ArrayBuffer>);
    ctx.device.queue.writeBuffer(out, 0, new Float32Array(LENS.length * hq * d).fill(NaN));
    await runPass(
      ctx,
      arena,
      (pass) => op.encode(pass, LENS.length, Math.max(...LENS), split, true, width),
    );
    const gotOut = await readF32(ctx, out);
    const [gotK, gotV] = [await read(kCache), await read(vCache)];
    // The written slots within tolerance (K) or exactly (V); every other element untouched.
    if (fp8) {
      assertRoundedWithin(gotK, want.k, written, kSlack, e4m3Round, `${mode}: k slots`);
    } else {
      const slotsK = [...written].map((i) => gotK[i]!);
      assertClose(slotsK, [...written].map((i) => want.k[i]!), kTolerance, `${mode}: k slots`);
    }
    deepStrictEqual(
      [...written].map((i) => gotV[i]!),
      [...written].map((i) => wantV[i]!),
      `${mode}: v slots`,
    );
    // fp8: where the kernel rounded a K element to the other side of a midpoint than the reference
    // (allowed above), attention over the K it wrote: one e4m3 step moves the output past the
    // tolerance.
    const flipped = fp8 && [...written].some((i) => gotK[i] !== wantK[i]);
    assertClose(
      gotOut,
      flipped ? attention(gotK) : expected,
      kvTolerance(dtype),
      `${mode}: output`,
    );
    const untouched = (got: ArrayLike<number>, init: ArrayLike<number>) => {
      for (let i = 0; i < init.length; i++) {
        if (!written.has(i) && !Object.is(got[i], init[i])) return i;
      }
      return -1;
    };
    equal(untouched(gotK, initK), -1, `${mode}: k cache outside the slots`);
    equal(untouched(gotV, initV), -1, `${mode}: v cache outside the slots`);
  }
  // qkv is read only.
  deepStrictEqual(await readF32(ctx, qkvBuf), qkv, `${context}: qkv`);
  scratch.destroy();
  arena.destroy();
}

const CASES: readonly Case[] = [
  // Qwen3-0.6B: GQA 2, head_dim 128, f16 head norms.
  { hq: 16, hkv: 8, headDim: 128, blockSize: 16, dtype: "f16", norm: "f16", partitionSize: 64 },
  { hq: 16, hkv: 8, headDim: 128, blockSize: 16, dtype: "f32", norm: "f32", partitionSize: 128 },
  // Llama / Qwen2 (no head norms): GQA 4 and 1, head dims 64 and 80.
  { hq: 8, hkv: 2, headDim: 64, blockSize: 8, dtype: "f32", norm: null, partitionSize: 64 },
  { hq: 4, hkv: 4, headDim: 80, blockSize: 32, dtype: "f16", norm: null, partitionSize: 192 },
  // An fp8 (e4m3) cache: Qwen3-0.6B's kernel (GQA 2, head_dim 128, f16 head norms) over fewer
  // heads (one case, for this file's run time).
  { hq: 4, hkv: 2, headDim: 128, blockSize: 16, dtype: "fp8_e4m3", norm: "f16", partitionSize: 64 },
  // f16 norms beside an f32 cache.
  { hq: 4, hkv: 2, headDim: 64, blockSize: 16, dtype: "f32", norm: "f16", partitionSize: 64 },
];

for (const variant of ["workgroup", "unrolled"] as const) {
  for (const c of CASES) {
    Deno.test(
      `paged_attention decode (${variant}) fused with RoPE matches rope_and_cache then attention ` +
        `in float64: Hq ${c.hq} Hkv ${c.hkv} D ${c.headDim} ${c.dtype} cache, norm ${
          c.norm ?? "none"
        }`,
      GPU_TEST,
      async () => {
        if (!HAS_F16 && (c.dtype === "f16" || c.norm === "f16")) return;
        await checkCase(c, variant);
      },
    );
  }
}

Deno.test(
  "PagedAttentionDecode refuses a fused variant it cannot build or bind",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const shape = {
      numQHeads: 4,
      numKvHeads: 2,
      headDim: 64,
      blockSize: 16,
      dtype: "f32" as const,
    };
    // The fused unrolled kernel's workgroup memory against an adapter's: Qwen3-0.6B's 2 x 128
    // fits WebGPU's default 16 KiB, 4 x 128 and 8 x 64 (17,332 and 17,476 bytes) need more
    // (lavapipe and the NVIDIA GPUs measured grant 32 / 48 KiB).
    deepStrictEqual([[2, 128], [4, 128], [8, 64]].map(([g, h]) => unrolledFusedBytes(g!, h!)), [
      8940,
      17332,
      17476,
    ]);
    const limited = (bytes: number) =>
      ({ limits: { maxComputeWorkgroupStorageSize: bytes } }) as unknown as GpuContext;
    deepStrictEqual(
      [[2, 128], [4, 128]].map(([g, h]) => unrolledFusedFits(limited(16384), g!, h!)),
      [true, false],
    );
    equal(unrolledFusedFits(limited(17476), 8, 64), true);
    const wide = { ...shape, numQHeads: 16, numKvHeads: 2 };
    equal(new PagedAttentionDecode(ctx, { ...wide, variant: "unrolled" }).rope, null);
    const kernel = new PagedAttentionDecode(ctx, {
      ...shape,
      variant: "workgroup",
      rope: { normDtype: "f32" },
    });
    const scratch = kernel.createScratch(1, 64);
    const arena = new ParamArena(ctx, 2);
    const b = (bytes: number) => whole(ctx.createBuffer("b", bytes, GPUBufferUsage.STORAGE));
    const buffers = {
      q: b(1024),
      kCache: b(1 << 16),
      vCache: b(1 << 16),
      blockTables: b(64),
      contextLens: b(16),
      out: b(1024),
      scratch,
    };
    const layout = { qStride: 512, btStride: 4 };
    // Bound without rope inputs: no fused variant, and asking for it is an error.
    const plain = kernel.bind(arena, buffers, layout);
    equal(plain.fusesRope, false);
    await rejects(
      () => runPass(ctx, arena, (pass) => plain.encode(pass, 1, 8, false, true)),
      /bound without it/,
    );
    const rope = { positions: b(16), invFreq: b(128), slotMapping: b(16) };
    throws(() => kernel.bind(arena, { ...buffers, rope }, layout), /needs f32 q\/k norms/);
    const wrong = GpuMatrix.fromArray(ctx, "q_norm", new Float32Array(32), 1, 32, "f32");
    throws(
      () =>
        kernel.bind(
          arena,
          { ...buffers, rope: { ...rope, qkNorm: { q: wrong, k: wrong } } },
          layout,
        ),
      /must be one \[1, 64\] f32 part/,
    );
    scratch.destroy();
    arena.destroy();
  },
);
