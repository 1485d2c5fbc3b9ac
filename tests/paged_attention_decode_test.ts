import { deepStrictEqual, equal, throws } from "node:assert/strict";
import type { GpuContext } from "../gpu/context.ts";
import type { KvDtype } from "../gpu/dtype.ts";
import { PagedAttentionDecode, workgroupKernelBytes } from "../kernels/paged_attention_decode.ts";
import {
  MAX_UNROLLED_GROUP_DIM,
  type PagedAttentionDecodeVariant,
} from "../kernels/paged_attention_decode_config.ts";
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
import {
  buildPagedCache,
  indexedBlockTables,
  pagedAttentionRef,
  type PagedCache,
} from "./reference/attention.ts";
import { INDEXED_ROWS } from "../kernels/block_table_stride.ts";
import type { Rng } from "./support/random.ts";

/** Context lengths of one batch: crossing block (8, 16, 32) and tile (64) boundaries. */
const LENS = [1, 15, 16, 17, 33, 100, 300];

interface Case {
  hq: number;
  hkv: number;
  headDim: number;
  blockSize: number;
  dtype: KvDtype;
  partitionSize: number;
  /** Multiplies the queries (standard deviation 2): scores in the hundreds need the softmax max. */
  qScale?: number;
}

async function checkCase(c: Case, lens: readonly number[]): Promise<void> {
  const ctx = await testContext();
  if (c.dtype === "f16" && !ctx.hasF16) return;
  const { hq, hkv, headDim, blockSize, dtype, partitionSize } = c;
  const name = `Hq ${hq} Hkv ${hkv} D ${headDim} block ${blockSize} ${dtype} ` +
    `partition ${partitionSize} lens [${lens}]` + (c.qScale === undefined ? "" : ` q x${c.qScale}`);
  const { seed, rng } = testSeed(`paged_attention_decode ${name}`);
  const cache = buildPagedCache({
    seqK: lens.map((len) => rng.array(len * hkv * headDim, -1, 1)),
    seqV: lens.map((len) => rng.array(len * hkv * headDim, -1, 1)),
    numKvHeads: hkv,
    headDim,
    blockSize,
    dtype,
    rng,
    spareBlocks: 3,
    btStride: Math.ceil(Math.max(...lens) / blockSize) + 1,
  });
  // q sits inside a fused [q | k | v] row, as in the engine.
  const qStride = (hq + 2 * hkv) * headDim;
  const q = rng.normals(lens.length * qStride, 2 * (c.qScale ?? 1));
  const expected = pagedAttentionRef({
    q,
    qStride,
    numQHeads: hq,
    numKvHeads: hkv,
    headDim,
    blockSize,
    kCache: cache.k,
    vCache: cache.v,
    blockTables: cache.blockTables,
    btStride: cache.btStride,
    contextLens: cache.contextLens,
  });
  const variants: PagedAttentionDecodeVariant[] = ["workgroup"];
  if ((hq / hkv) * headDim <= MAX_UNROLLED_GROUP_DIM && headDim % 8 === 0) {
    variants.push("unrolled");
  }
  for (const variant of variants) {
    const kernel = new PagedAttentionDecode(ctx, {
      numQHeads: hq,
      numKvHeads: hkv,
      headDim,
      blockSize,
      dtype,
      partitionSize,
      splitThreshold: 200,
      variant,
    });
    await checkKernel(
      ctx,
      kernel,
      lens,
      q,
      qStride,
      cache,
      expected,
      `seed ${seed} ${name} ${variant}`,
      rng,
    );
  }
}

async function checkKernel(
  ctx: GpuContext,
  kernel: PagedAttentionDecode,
  lens: readonly number[],
  q: Float32Array,
  qStride: number,
  cache: PagedCache,
  expected: Float64Array,
  name: string,
  rng: Rng,
): Promise<void> {
  const { numQHeads: hq, headDim, dtype } = kernel;
  const maxLen = Math.max(...lens);
  const scratch = kernel.createScratch(lens.length, maxLen);
  const arena = new ParamArena(ctx, 2);
  const out = poisonedF32(ctx, lens.length * hq * headDim);
  const buffers = {
    q: whole(upload(ctx, q)),
    kCache: whole(upload(ctx, cache.kData, "k_cache")),
    vCache: whole(upload(ctx, cache.vData, "v_cache")),
    blockTables: whole(upload(ctx, cache.blockTables)),
    contextLens: whole(upload(ctx, cache.contextLens)),
    out: whole(out),
    scratch,
  };
  const op = kernel.bind(arena, buffers, { qStride, btStride: cache.btStride });
  // Short partitions (16 to 192 tokens; 16 and 32 shorter than the kernel's 64-position tile)
  // lay the partials out with the scratch's per-batch stride.
  const short = [16, 32, 48, 64, 192].filter((size) =>
    Math.ceil(maxLen / size) <= scratch.partitionsPerSeq(lens.length)
  );
  // At every width the kernel runs (the workgroup kernel's 256: tiles of 256 positions, four
  // invocation sets per output vec4 at GQA 2 and head_dim 128).
  for (const width of kernel.widths) {
    for (const split of [false, true, undefined, ...short]) {
      ctx.device.queue.writeBuffer(out, 0, new Float32Array(lens.length * hq * headDim).fill(NaN));
      await runPass(
        ctx,
        arena,
        (pass) => op.encode(pass, lens.length, maxLen, split, false, width),
      );
      const got = await readF32(ctx, out);
      const mode = split === undefined ? `auto (split ${op.usesSplit(maxLen)})` : `split ${split}`;
      assertClose(got, expected, kvTolerance(dtype), `${name} ${mode} width ${width}`);
    }
  }
  // The same tables as indexed rows (a header of row offsets; the runner's layout).
  const indexedArena = new ParamArena(ctx, 2);
  const indexed = kernel.bind(indexedArena, {
    ...buffers,
    blockTables: whole(upload(ctx, indexedBlockTables(cache.blockTables, cache.btStride, rng))),
  }, { qStride, btStride: cache.btStride });
  indexed.setBlockTableStride(INDEXED_ROWS);
  for (const split of [false, true]) {
    const width = kernel.widths.at(-1)!;
    ctx.device.queue.writeBuffer(out, 0, new Float32Array(lens.length * hq * headDim).fill(NaN));
    await runPass(
      ctx,
      indexedArena,
      (pass) => indexed.encode(pass, lens.length, maxLen, split, false, width),
    );
    assertClose(
      await readF32(ctx, out),
      expected,
      kvTolerance(dtype),
      `${name} indexed ${split} width ${width}`,
    );
  }
  scratch.destroy();
}

const CASES: readonly Case[] = [
  // Qwen3-0.6B: GQA 2, head_dim 128.
  { hq: 16, hkv: 8, headDim: 128, blockSize: 16, dtype: "f16", partitionSize: 64 },
  { hq: 16, hkv: 8, headDim: 128, blockSize: 16, dtype: "f32", partitionSize: 128 },
  // GQA 1 and 8, head_dim 64, other block sizes.
  { hq: 4, hkv: 4, headDim: 64, blockSize: 8, dtype: "f32", partitionSize: 64 },
  { hq: 4, hkv: 4, headDim: 64, blockSize: 16, dtype: "f16", partitionSize: 192 },
  { hq: 16, hkv: 2, headDim: 64, blockSize: 32, dtype: "f16", partitionSize: 64 },
  { hq: 8, hkv: 1, headDim: 128, blockSize: 16, dtype: "f32", partitionSize: 256 },
  // Head dims that are not powers of two and GQA 4, partitions of 512 (split-K with one part);
  // 36 is not a multiple of 8, so only the workgroup kernel takes it.
  { hq: 8, hkv: 2, headDim: 40, blockSize: 16, dtype: "f32", partitionSize: 512 },
  { hq: 8, hkv: 2, headDim: 36, blockSize: 16, dtype: "f16", partitionSize: 64 },
  { hq: 8, hkv: 2, headDim: 80, blockSize: 32, dtype: "f16", partitionSize: 64 },
  // An fp8 (e4m3) cache: Qwen3-0.6B's shape, GQA 8, and head_dim 36 (whole u32s of 4 codes, not
  // the unrolled kernel's loads of 8: the workgroup kernel only).
  { hq: 16, hkv: 8, headDim: 128, blockSize: 16, dtype: "fp8_e4m3", partitionSize: 64 },
  { hq: 16, hkv: 2, headDim: 64, blockSize: 32, dtype: "fp8_e4m3", partitionSize: 128 },
  { hq: 8, hkv: 2, headDim: 36, blockSize: 16, dtype: "fp8_e4m3", partitionSize: 64 },
];

for (const c of CASES) {
  Deno.test(
    `paged_attention decode matches the float64 reference, split-K on and off: Hq ${c.hq} ` +
      `Hkv ${c.hkv} D ${c.headDim} block ${c.blockSize} ${c.dtype} partition ${c.partitionSize}`,
    GPU_TEST,
    () => checkCase(c, LENS),
  );
}

Deno.test(
  "paged_attention decode handles a single sequence and a long context (GQA 2, f16)",
  GPU_TEST,
  async () => {
    const base = { hq: 16, hkv: 8, headDim: 128, blockSize: 16, dtype: "f16" as const };
    await checkCase({ ...base, partitionSize: 512 }, [1100]);
    await checkCase({ ...base, partitionSize: 64 }, [2]);
    // 18 and 10 partials: the merge's groups of 8, the last one partial.
    await checkCase({ ...base, partitionSize: 64 }, [1100, 577]);
  },
);

Deno.test(
  "paged_attention decode stays finite and exact when scores reach the hundreds",
  GPU_TEST,
  async () => {
    // Scores of standard deviation ~115 (exp overflows f32 past ~88): a softmax that did not
    // subtract each query's running maximum would return NaN.
    const base = { hq: 4, hkv: 2, headDim: 64, blockSize: 16, dtype: "f32" as const, qScale: 100 };
    await checkCase({ ...base, partitionSize: 64 }, LENS);
  },
);

Deno.test(
  "PagedAttentionDecode offers the 256-wide kernel only where its workgroup memory fits",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    // Qwen3-0.6B's GQA 2 x 128, fused: 12,168 bytes at 256 wide, within WebGPU's default 16 KiB;
    // GQA 8 x 128 needs 24,456 there (12,936 at 64 wide).
    equal(workgroupKernelBytes(2, 128, 256, true), 12168);
    equal(workgroupKernelBytes(8, 128, 256, true), 24456);
    equal(workgroupKernelBytes(8, 128, 64, true), 12936);
    // The same context with WebGPU's default limit (the adapter's own object otherwise): its
    // members read through to ctx, its pipelines compile there.
    const limits = { ...ctx.limits, maxComputeWorkgroupStorageSize: 16384 };
    const small = Object.create(ctx, {
      limits: { value: limits },
      pipeline: { value: ctx.pipeline.bind(ctx) },
    }) as GpuContext;
    const shape = {
      headDim: 128,
      blockSize: 16,
      variant: "workgroup" as const,
      dtype: "f32" as const,
    };
    const kernel = (numQHeads: number, c: GpuContext) =>
      new PagedAttentionDecode(c, {
        ...shape,
        numQHeads,
        numKvHeads: 2,
        rope: { normDtype: null },
      });
    deepStrictEqual(kernel(4, small).widths, [64, 256]);
    deepStrictEqual(kernel(16, small).widths, [64]);
    deepStrictEqual(
      kernel(16, ctx).widths,
      ctx.limits.maxComputeWorkgroupStorageSize >= 24456 ? [64, 256] : [64],
    );
    throws(() => kernel(16, small).pipelinesAt(256), /at width 256: this workgroup kernel runs 64/);
  },
);

Deno.test("PagedAttentionDecode rejects unsupported shapes and strides", GPU_TEST, async () => {
  const ctx = await testContext();
  const shape = { numQHeads: 16, numKvHeads: 8, headDim: 128, blockSize: 16 };
  throws(() => new PagedAttentionDecode(ctx, { ...shape, numKvHeads: 3 }), RangeError);
  throws(() => new PagedAttentionDecode(ctx, { ...shape, numQHeads: 32, numKvHeads: 2 }), {
    name: "RangeError",
    message: /32 query heads over 2 kv heads/,
  });
  throws(() => new PagedAttentionDecode(ctx, { ...shape, headDim: 42 }), RangeError);
  throws(() => new PagedAttentionDecode(ctx, { ...shape, headDim: 512 }), RangeError);
  throws(() => new PagedAttentionDecode(ctx, { ...shape, partitionSize: 100 }), RangeError);
  throws(() => new PagedAttentionDecode(ctx, { ...shape, headDim: 36, variant: "unrolled" }), {
    name: "RangeError",
    message: /headDim a multiple of 8/,
  });
  const kernel = new PagedAttentionDecode(ctx, { ...shape, dtype: "f32" });
  const scratch = kernel.createScratch(2, 2000);
  const b = whole(upload(ctx, new Float32Array(16)));
  const buffers = {
    q: b,
    kCache: b,
    vCache: b,
    blockTables: b,
    contextLens: b,
    out: b,
    scratch,
  };
  const arena = new ParamArena(ctx, 4);
  throws(() => kernel.bind(arena, buffers, { qStride: 2000, btStride: 4 }), {
    name: "RangeError",
    message: /qStride 2000 must be a multiple of 4 and >= 2048/,
  });
  const op = kernel.bind(arena, buffers, { qStride: 2048, btStride: 4 });
  // A step's block-table stride is at most the bound one, or 0 (indexed rows).
  for (const stride of [-1, 5, 2.5]) {
    throws(() => op.setBlockTableStride(stride), {
      name: "RangeError",
      message: new RegExp(`stride of ${stride}: 0 \\(indexed rows\\) or between 1 and 4`),
    });
  }
  op.setBlockTableStride(3);
  op.setBlockTableStride(0);
  const encoder = ctx.device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  try {
    throws(() => op.encode(pass, 3, 100, true), {
      name: "RangeError",
      message: /exceed the scratch/,
    });
    // 2 sequences x ceil(2000 / 16) short partitions = 250 partials: 40,000 tokens in 16-token
    // partitions need 2,500 (in 512-token ones 79 would fit).
    equal(scratch.pairs, 250);
    throws(() => op.encode(pass, 1, 40000, 16), {
      name: "RangeError",
      message: /exceed the scratch/,
    });
  } finally {
    pass.end();
    ctx.device.queue.submit([encoder.finish()]);
  }
  scratch.destroy();
});

Deno.test(
  "paged_attention decode writes zeros for a sequence with an empty context",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const [hq, hkv, headDim, blockSize] = [4, 2, 64, 16];
    const { seed, rng } = testSeed("paged_attention_decode empty context");
    const lens = [0, 5, 0];
    const cache = buildPagedCache({
      seqK: lens.map((len) => rng.array(len * hkv * headDim)),
      seqV: lens.map((len) => rng.array(len * hkv * headDim)),
      numKvHeads: hkv,
      headDim,
      blockSize,
      dtype: "f32",
      rng,
    });
    const qStride = hq * headDim;
    const q = rng.normals(lens.length * qStride);
    const row = hq * headDim;
    const expected = new Float64Array(lens.length * row);
    expected.set(
      pagedAttentionRef({
        q: q.subarray(qStride, 2 * qStride),
        qStride,
        numQHeads: hq,
        numKvHeads: hkv,
        headDim,
        blockSize,
        kCache: cache.k,
        vCache: cache.v,
        blockTables: cache.blockTables.subarray(cache.btStride, 2 * cache.btStride),
        btStride: cache.btStride,
        contextLens: [5],
      }),
      row,
    );
    const kernel = new PagedAttentionDecode(ctx, {
      numQHeads: hq,
      numKvHeads: hkv,
      headDim,
      blockSize,
      dtype: "f32",
      partitionSize: 64,
    });
    const scratch = kernel.createScratch(lens.length, 5);
    const arena = new ParamArena(ctx, 2);
    const out = poisonedF32(ctx, lens.length * row);
    const op = kernel.bind(arena, {
      q: whole(upload(ctx, q)),
      kCache: whole(upload(ctx, cache.kData)),
      vCache: whole(upload(ctx, cache.vData)),
      blockTables: whole(upload(ctx, cache.blockTables)),
      contextLens: whole(upload(ctx, cache.contextLens)),
      out: whole(out),
      scratch,
    }, { qStride, btStride: cache.btStride });
    for (const split of [false, true]) {
      ctx.device.queue.writeBuffer(out, 0, new Float32Array(lens.length * row).fill(NaN));
      await runPass(ctx, arena, (pass) => op.encode(pass, lens.length, 5, split));
      assertClose(
        await readF32(ctx, out),
        expected,
        1e-4,
        `seed ${seed} lens [${lens}] split ${split}`,
      );
    }
    scratch.destroy();
  },
);
