import { throws as assertThrows } from "node:assert/strict";
import type { DType, KvDtype } from "../gpu/dtype.ts";
import type { GpuContext } from "../gpu/context.ts";
import {
  MAX_UNROLLED_PREFILL_GROUP_DIM,
  PagedAttentionPrefill,
  type PagedAttentionPrefillConfig,
  type PagedAttentionPrefillVariant,
  prefillTileRows,
  prefillTileShape,
} from "../kernels/paged_attention_prefill.ts";
import { kvStageDtype } from "../kernels/kv_codec.ts";
import { assertClose, kvTolerance } from "./support/assert_close.ts";
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
import { buildPagedCache, indexedBlockTables, pagedAttentionRef } from "./reference/attention.ts";
import { INDEXED_ROWS } from "../kernels/block_table_stride.ts";

/** One batch: per sequence, the cached prefix before this step and the new query tokens. */
interface Case {
  readonly name: string;
  readonly dtype: KvDtype;
  readonly numQHeads: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly blockSize: number;
  readonly prefixLens: readonly number[];
  readonly queryLens: readonly number[];
  /** Extra f32 elements per query token past the q heads (a fused [q | k | v] row). */
  readonly qPad?: number;
  readonly scale?: number;
  /** Pass the exact tile count to encode (else the bound). */
  readonly exactTiles?: boolean;
  /** Compare with the reference's decode form (queryLens omitted); needs every q_len 1. */
  readonly asDecode?: boolean;
  readonly kernel?: Pick<PagedAttentionPrefillConfig, "workgroupSize" | "keyChunk">;
  /** Build the kernels as on an adapter without shader-f16 ({@linkcode withoutF16}). */
  readonly withoutF16?: boolean;
}

/**
 * `ctx` as an adapter without `shader-f16` makes it: `hasF16` false (an fp8 cache's K and V then
 * staged as f32, kernels/kv_codec.ts kvStageDtype), f32 weights. It shares ctx's device and
 * pipeline cache, under keys of its own (the same key's WGSL differs).
 */
function withoutF16(ctx: GpuContext): GpuContext {
  return Object.create(ctx, {
    hasF16: { value: false },
    weightDtype: { value: "f32" },
    pipeline: {
      value: (key: string, code: () => string, constants?: Record<string, number>) =>
        ctx.pipeline(`without-f16/${key}`, code, constants),
    },
  }) as GpuContext;
}

/** Runs one case on the GPU and checks it against the float64 reference. */
async function check(ctx: GpuContext, c: Case): Promise<void> {
  const { seed, rng } = testSeed(`paged_attention_prefill ${c.name}`);
  const { numQHeads, numKvHeads, headDim, blockSize, dtype } = c;
  const numSeqs = c.queryLens.length;
  const contextLens = c.queryLens.map((q, s) => q + c.prefixLens[s]!);
  const cache = buildPagedCache({
    seqK: contextLens.map((len) => rng.normals(len * numKvHeads * headDim)),
    seqV: contextLens.map((len) => rng.normals(len * numKvHeads * headDim)),
    numKvHeads,
    headDim,
    blockSize,
    dtype,
    rng,
    spareBlocks: 3,
  });
  const numTokens = c.queryLens.reduce((a, b) => a + b, 0);
  const qStride = numQHeads * headDim + (c.qPad ?? 0);
  // Queries scaled so the softmax is far from uniform; the padding between tokens is NaN.
  const q = new Float32Array(numTokens * qStride).fill(NaN);
  for (let t = 0; t < numTokens; t++) {
    q.set(rng.normals(numQHeads * headDim, 2), t * qStride);
  }
  const cuQLens = new Uint32Array(numSeqs + 1);
  for (let s = 0; s < numSeqs; s++) cuQLens[s + 1] = cuQLens[s]! + c.queryLens[s]!;

  const expected = pagedAttentionRef({
    q,
    qStride,
    numQHeads,
    numKvHeads,
    headDim,
    blockSize,
    kCache: cache.k,
    vCache: cache.v,
    blockTables: cache.blockTables,
    btStride: cache.btStride,
    contextLens: cache.contextLens,
    queryLens: c.asDecode ? undefined : c.queryLens,
    scale: c.scale,
  });
  const inputs = {
    q: whole(upload(ctx, q, "q")),
    kCache: whole(upload(ctx, cache.kData, "k_cache")),
    vCache: whole(upload(ctx, cache.vData, "v_cache")),
    blockTables: whole(upload(ctx, cache.blockTables, "block_tables")),
    cuQLens: whole(upload(ctx, cuQLens, "cu_q_lens")),
    contextLens: whole(upload(ctx, cache.contextLens, "context_lens")),
  };
  const indexedTables = whole(
    upload(ctx, indexedBlockTables(cache.blockTables, cache.btStride, rng), "indexed_tables"),
  );
  const kinds: { variant: PagedAttentionPrefillVariant; tiledRows?: number }[] = [
    { variant: "workgroup" },
  ];
  const group = numQHeads / numKvHeads;
  const storage = ctx.limits.maxComputeWorkgroupStorageSize;
  const kernelCtx = c.withoutF16 ? withoutF16(ctx) : ctx;
  // The tile shapes fit the dtype K and V are staged in (fp8: f16 or f32).
  const stage = kvStageDtype(kernelCtx, dtype);
  for (const variant of ["tiled", "blocked"] as const) {
    // Each GPU kernel's default shape, then every other row count that fits.
    if (prefillTileShape(variant, headDim, group, storage, stage) === null) continue;
    kinds.push({ variant });
    for (const tiledRows of prefillTileRows(variant, headDim, group, storage, stage)) {
      kinds.push({ variant, tiledRows });
    }
  }
  if (group * headDim <= MAX_UNROLLED_PREFILL_GROUP_DIM && headDim % 8 === 0) {
    kinds.push({ variant: "unrolled" });
  }
  try {
    for (const kind of kinds) {
      const kernel = new PagedAttentionPrefill(kernelCtx, {
        numQHeads,
        numKvHeads,
        headDim,
        dtype,
        ...c.kernel,
        ...kind,
      });
      const variant = kernel.name;
      const arena = new ParamArena(ctx, 4);
      const out = poisonedF32(ctx, numTokens * numQHeads * headDim);
      const op = kernel.bind(arena, { ...inputs, out: whole(out) }, {
        blockSize,
        btStride: cache.btStride,
        qStride,
        scale: c.scale,
      });
      const tiles = c.exactTiles ? kernel.countTiles(c.queryLens) : undefined;
      const label = `seed ${seed} ${c.name} ${variant} (${dtype}` +
        `${c.withoutF16 ? " without shader-f16" : ""}, Hq ${numQHeads}, ` +
        `Hkv ${numKvHeads}, D ${headDim}, block ${blockSize}, q_lens [${c.queryLens}], ` +
        `prefixes [${c.prefixLens}])`;
      await runPass(ctx, arena, (pass) => op.encode(pass, numSeqs, numTokens, tiles));
      assertClose(await readF32(ctx, out), expected, kvTolerance(dtype), label);
      // The same tables as indexed rows (a header of row offsets; the runner's layout).
      const indexed = kernel.bind(
        arena,
        { ...inputs, blockTables: indexedTables, out: whole(out) },
        {
          blockSize,
          btStride: cache.btStride,
          qStride,
          scale: c.scale,
        },
      );
      indexed.setBlockTableStride(INDEXED_ROWS);
      ctx.device.queue.writeBuffer(
        out,
        0,
        new Float32Array(numTokens * numQHeads * headDim).fill(NaN),
      );
      await runPass(ctx, arena, (pass) => indexed.encode(pass, numSeqs, numTokens, tiles));
      assertClose(await readF32(ctx, out), expected, kvTolerance(dtype), `${label} indexed rows`);
      out.destroy();
      arena.destroy();
    }
  } finally {
    for (const b of Object.values(inputs)) b.buffer.destroy();
    indexedTables.buffer.destroy();
  }
}

/** The brief's mixed batch: q_len 1..64 (not tile multiples) after prefixes of 0..40 tokens. */
const MIXED_Q = [1, 7, 16, 17, 33, 64];
const MIXED_PREFIX = [40, 0, 16, 5, 0, 40];
/** GQA ratios 1, 2, 8; head_dim 64 and 128; block size 16 and 8 / 32. */
const MIXED_SHAPES = [
  { numQHeads: 2, numKvHeads: 2, headDim: 64, blockSize: 16 },
  { numQHeads: 4, numKvHeads: 2, headDim: 128, blockSize: 16 },
  { numQHeads: 8, numKvHeads: 1, headDim: 64, blockSize: 32 },
  { numQHeads: 2, numKvHeads: 1, headDim: 64, blockSize: 8 },
  { numQHeads: 8, numKvHeads: 1, headDim: 128, blockSize: 8 },
  { numQHeads: 3, numKvHeads: 3, headDim: 128, blockSize: 32 },
] as const;

/** The mixed batch of shape `i` of {@linkcode MIXED_SHAPES}, with its KV dtype. */
function mixedCase(dtype: KvDtype, i: number): Case {
  // Rotate the prefixes so every q_len meets several prefix lengths across shapes.
  const prefixLens = MIXED_PREFIX.map((_, s) => MIXED_PREFIX[(s + i) % MIXED_PREFIX.length]!);
  return {
    name: `mixed ${dtype} ${i}`,
    dtype,
    ...MIXED_SHAPES[i]!,
    prefixLens,
    queryLens: MIXED_Q,
    exactTiles: i % 2 === 0,
  };
}

Deno.test(
  "paged_attention_prefill() matches the float64 reference for a mixed varlen batch over shuffled blocks",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const dtypes: DType[] = ctx.hasF16 ? ["f16", "f32"] : ["f32"];
    // Every shape, f16 and f32 KV.
    for (const dtype of dtypes) {
      for (const i of MIXED_SHAPES.keys()) await check(ctx, mixedCase(dtype, i));
    }
  },
);

Deno.test(
  "paged_attention_prefill() matches the float64 reference over an fp8 cache, K and V staged as f16 or f32",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const dtype = "fp8_e4m3";
    // Every variant: the mixed batch at Qwen3-0.6B's GQA 2 x 128 and at GQA 8, K and V staged as
    // f16 where the adapter has shader-f16 (lavapipe), and as f32 without it (GQA 2 x 64).
    await check(ctx, mixedCase(dtype, 1));
    await check(ctx, mixedCase(dtype, 2));
    await check(ctx, { ...mixedCase(dtype, 3), withoutF16: true });
    // head_dim 44 (whole u32s of 4 codes, not the unrolled kernel's loads of 8): the workgroup,
    // tiled and blocked kernels.
    await check(ctx, {
      dtype,
      name: "fp8 d44",
      numQHeads: 4,
      numKvHeads: 4,
      headDim: 44,
      blockSize: 16,
      prefixLens: [5, 0, 40, 16],
      queryLens: [17, 33, 1, 7],
    });
  },
);

Deno.test(
  "paged_attention_prefill() matches the float64 reference for odd head_dim, strided q, a custom scale and other tile sizes",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const dtype = ctx.weightDtype;
    const base = { dtype, prefixLens: [5, 0, 40, 16], queryLens: [17, 33, 1, 7] };
    // Fused [q | k | v] rows: qStride = (Hq + 2 Hkv) * D.
    await check(ctx, {
      ...base,
      name: "d40 fused qkv",
      numQHeads: 4,
      numKvHeads: 2,
      headDim: 40,
      blockSize: 16,
      qPad: 2 * 2 * 40,
    });
    // head_dim 44 is not a multiple of 8: the workgroup kernel only.
    await check(ctx, {
      ...base,
      name: "d44",
      numQHeads: 4,
      numKvHeads: 4,
      headDim: 44,
      blockSize: 16,
    });
    await check(ctx, {
      ...base,
      name: "d80 scale",
      numQHeads: 6,
      numKvHeads: 3,
      headDim: 80,
      blockSize: 8,
      scale: 0.3,
      qPad: 4,
    });
    // Tiles of 5 queries (workgroup 40, group 8) and key chunks of 7 (not block multiples).
    await check(ctx, {
      ...base,
      name: "wg40 kc7",
      numQHeads: 8,
      numKvHeads: 1,
      headDim: 64,
      blockSize: 16,
      kernel: { workgroupSize: 40, keyChunk: 7 },
    });
    // GQA 16: the tiled and blocked kernels at 32 and 16 rows a workgroup (2 and 1 queries a tile).
    await check(ctx, {
      ...base,
      name: "g16",
      numQHeads: 16,
      numKvHeads: 1,
      headDim: 64,
      blockSize: 16,
      exactTiles: true,
    });
    // A group (3) that does not divide the workgroup, and a sequence with no new tokens.
    await check(ctx, {
      dtype,
      name: "wg32 g3 empty seq",
      numQHeads: 6,
      numKvHeads: 2,
      headDim: 128,
      blockSize: 32,
      prefixLens: [3, 20, 0],
      queryLens: [40, 0, 12],
      // 28 keys x (2 x 128 dims + 32 scores) x 4 bytes fit the 32 KiB of lavapipe.
      kernel: { workgroupSize: 32, keyChunk: 28 },
      exactTiles: true,
    });
  },
);

Deno.test(
  "paged_attention_prefill() equals the decode reference when every q_len is 1",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const dtype of ctx.hasF16 ? ["f16", "f32"] as const : ["f32"] as const) {
      await check(ctx, {
        name: `decode ${dtype}`,
        dtype,
        numQHeads: 16,
        numKvHeads: 8,
        headDim: 128,
        blockSize: 16,
        prefixLens: [0, 5, 16, 40, 100, 15],
        queryLens: [1, 1, 1, 1, 1, 1],
        asDecode: true,
      });
    }
  },
);

Deno.test("PagedAttentionPrefill rejects unsupported shapes", GPU_TEST, async () => {
  const ctx = await testContext();
  const make = (config: PagedAttentionPrefillConfig) => new PagedAttentionPrefill(ctx, config);
  assertThrows(() => make({ numQHeads: 6, numKvHeads: 4, headDim: 64 }), RangeError);
  assertThrows(() => make({ numQHeads: 2, numKvHeads: 2, headDim: 66 }), RangeError);
  assertThrows(() => make({ numQHeads: 2, numKvHeads: 2, headDim: 260 }), RangeError);
  assertThrows(
    () => make({ numQHeads: 2, numKvHeads: 2, headDim: 36, variant: "unrolled" }),
    RangeError,
    "head_dim a multiple of 8",
  );
  assertThrows(
    () => make({ numQHeads: 16, numKvHeads: 1, headDim: 64, workgroupSize: 8 }),
    RangeError,
  );
  // 2 x 64 keys x 128 dims of f32 exceed the workgroup storage of every device.
  assertThrows(
    () => make({ numQHeads: 2, numKvHeads: 2, headDim: 128, keyChunk: 64 }),
    RangeError,
  );
  const kernel = make({ numQHeads: 2, numKvHeads: 1, headDim: 64, dtype: "f32" });
  const arena = new ParamArena(ctx, 1);
  const dummy = whole(upload(ctx, new Float32Array(4)));
  const buffers = {
    q: dummy,
    kCache: dummy,
    vCache: dummy,
    blockTables: dummy,
    cuQLens: dummy,
    contextLens: dummy,
    out: dummy,
  };
  assertThrows(
    () => kernel.bind(arena, buffers, { blockSize: 16, btStride: 4, qStride: 100 }),
    RangeError,
  );
  assertThrows(() => kernel.bind(arena, buffers, { blockSize: 0, btStride: 4 }), RangeError);
  // A step's block-table stride is at most the bound one.
  const op = kernel.bind(arena, buffers, { blockSize: 16, btStride: 4 });
  for (const stride of [-1, 5, 1.5]) {
    assertThrows(() => op.setBlockTableStride(stride), RangeError, `stride of ${stride}`);
  }
  op.setBlockTableStride(4);
  op.setBlockTableStride(0);
  dummy.buffer.destroy();
  arena.destroy();
});
