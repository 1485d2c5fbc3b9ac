/**
 * Benchmarks `paged_attention_prefill` at Qwen3-0.6B shapes (16 query heads, 8 kv heads,
 * head_dim 128, block size 16, KV in the context's weight dtype):
 *   - one sequence of 512 new tokens, no cached prefix;
 *   - 4 sequences of 128 new tokens after 256 cached tokens each (chunked prefill).
 *
 * Run: `deno bench -A bench/attention_prefill_bench.ts`. The printed lines are GPU times from
 * timestamp queries (bench/support.ts timeGpu); effective GFLOP/s counts
 * `4 * Hq * head_dim` FLOPs per causal (query, key) pair (QK^T and PV, 2 FLOPs per MAC), i.e. the
 * masked half of a square is not counted. The `Deno.bench` entries time one submission with the
 * host clock, so they include the ~10 ms wait floor.
 *
 * Each shape runs the profile's default kernel, then the `workgroup` kernel (CPU profile) and
 * the `tiled` and `blocked` ones at their default shapes and other row counts (`tiled br16`,
 * `blocked br8`, ...). Set `PREFILL_SWEEP=1` to also print a sweep of workgroup sizes and key
 * chunks.
 *
 * @module
 */

import { STORAGE_RW } from "../gpu/context.ts";
import type { GpuContext } from "../gpu/context.ts";
import { toDType } from "../gpu/dtype.ts";
import { ParamArena } from "../gpu/params.ts";
import {
  PagedAttentionPrefill,
  type PagedAttentionPrefillConfig,
  prefillTileRows,
} from "../kernels/paged_attention_prefill.ts";
import {
  benchSubmission,
  type KernelCase,
  medianText,
  openKernelBench,
  timeCase,
  uploadBuffer,
} from "./lib/kernel_bench.ts";

const HQ = 16;
const HKV = 8;
const HEAD_DIM = 128;
const BLOCK = 16;

interface Shape {
  readonly name: string;
  readonly queryLens: readonly number[];
  readonly prefixLens: readonly number[];
}

const SHAPES: readonly Shape[] = [
  { name: "1 seq x 512 new, no prefix", queryLens: [512], prefixLens: [0] },
  {
    name: "4 seqs x 128 new, 256 cached each",
    queryLens: [128, 128, 128, 128],
    prefixLens: [256, 256, 256, 256],
  },
];

/** Causal (query, key) pairs of a shape: query i of a sequence sees prefix + i + 1 keys. */
function causalPairs(shape: Shape): number {
  let pairs = 0;
  shape.queryLens.forEach((q, s) => {
    pairs += q * shape.prefixLens[s]! + (q * (q + 1)) / 2;
  });
  return pairs;
}

/** A bound kernel over random data for `shape`, ready to encode. */
function setup(
  ctx: GpuContext,
  shape: Shape,
  kernelOptions: Pick<
    PagedAttentionPrefillConfig,
    "workgroupSize" | "keyChunk" | "variant" | "tiledRows"
  > = {},
): KernelCase & { readonly variant: string } {
  const numSeqs = shape.queryLens.length;
  const ctxLens = shape.queryLens.map((q, s) => q + shape.prefixLens[s]!);
  const blocksPer = ctxLens.map((n) => Math.ceil(n / BLOCK));
  const btStride = Math.max(...blocksPer);
  const numBlocks = blocksPer.reduce((a, b) => a + b, 0);
  // Blocks handed out in reverse order: non-contiguous like a real allocator's.
  const blockTables = new Uint32Array(numSeqs * btStride);
  let next = numBlocks;
  blocksPer.forEach((n, s) => {
    for (let j = 0; j < n; j++) blockTables[s * btStride + j] = --next;
  });
  const numTokens = shape.queryLens.reduce((a, b) => a + b, 0);
  const qStride = (HQ + 2 * HKV) * HEAD_DIM; // q inside the fused [q | k | v] projection
  const random = (n: number) => Float32Array.from({ length: n }, () => Math.random() * 2 - 1);
  const cacheElems = numBlocks * HKV * BLOCK * HEAD_DIM;
  const cuQLens = new Uint32Array(numSeqs + 1);
  shape.queryLens.forEach((q, s) => (cuQLens[s + 1] = cuQLens[s]! + q));
  const buffers = {
    q: { buffer: uploadBuffer(ctx, "q", random(numTokens * qStride)) },
    kCache: { buffer: uploadBuffer(ctx, "k", toDType(random(cacheElems), ctx.weightDtype)) },
    vCache: { buffer: uploadBuffer(ctx, "v", toDType(random(cacheElems), ctx.weightDtype)) },
    blockTables: { buffer: uploadBuffer(ctx, "block_tables", blockTables) },
    cuQLens: { buffer: uploadBuffer(ctx, "cu_q_lens", cuQLens) },
    contextLens: { buffer: uploadBuffer(ctx, "context_lens", Uint32Array.from(ctxLens)) },
    out: { buffer: ctx.createBuffer("out", numTokens * HQ * HEAD_DIM * 4, STORAGE_RW) },
  };
  const kernel = new PagedAttentionPrefill(ctx, {
    numQHeads: HQ,
    numKvHeads: HKV,
    headDim: HEAD_DIM,
    ...kernelOptions,
  });
  const arena = new ParamArena(ctx, 1);
  const op = kernel.bind(arena, buffers, { blockSize: BLOCK, btStride, qStride });
  const tiles = kernel.countTiles(shape.queryLens);
  return {
    arena,
    variant: kernel.name,
    encode: (pass: GPUComputePassEncoder) => op.encode(pass, numSeqs, numTokens, tiles),
    destroy: () => {
      for (const b of Object.values(buffers)) b.buffer.destroy();
      arena.destroy();
    },
  };
}

const { ctx } = await openKernelBench("paged_attention_prefill", {
  detail: (c) => `; KV ${c.weightDtype}`,
  copyBandwidth: false,
});
console.log(`Hq ${HQ}, Hkv ${HKV}, head_dim ${HEAD_DIM}, block ${BLOCK}; FLOPs = 4*Hq*D*pairs`);

async function report(shape: Shape, options: Parameters<typeof setup>[2] = {}, repeats = 5) {
  let variant = "";
  const make = () => {
    const s = setup(ctx, shape, options);
    variant = s.variant === "workgroup"
      ? `workgroup, wg ${options.workgroupSize ?? 64}, kc ${options.keyChunk ?? 16}`
      : s.variant;
    return s;
  };
  const t = await timeCase(ctx, make, { warmup: 1, repeats });
  const flops = 4 * HQ * HEAD_DIM * causalPairs(shape);
  console.log(
    `  ${shape.name} [${variant}]: ${medianText(t, 2)}, ` +
      `${(flops / (t.medianMs * 1e6)).toFixed(2)} GFLOP/s ` +
      `effective, ${causalPairs(shape)} causal pairs (${t.method})`,
  );
}

for (const shape of SHAPES) {
  await report(shape);
  // The GPU kernels beside the profile's default, in the same run.
  if (ctx.isCpuProfile) await report(shape, { variant: "workgroup" });
  // The tiled and blocked kernels at each row count (the prefill tuner measures them too).
  const storage = ctx.limits.maxComputeWorkgroupStorageSize;
  for (const variant of ["tiled", "blocked"] as const) {
    await report(shape, { variant });
    for (
      const tiledRows of prefillTileRows(variant, HEAD_DIM, HQ / HKV, storage, ctx.weightDtype)
    ) {
      await report(shape, { variant, tiledRows });
    }
  }
}
if (Deno.env.get("PREFILL_SWEEP") === "1") {
  for (const workgroupSize of [32, 64, 128]) {
    for (const keyChunk of [8, 16, 32]) {
      await report(SHAPES[0]!, { workgroupSize, keyChunk, variant: "workgroup" }, 3);
    }
  }
}

for (const shape of SHAPES) {
  benchSubmission(
    ctx,
    `paged_attention_prefill ${shape.name} (host clock, one submission)`,
    setup(ctx, shape),
  );
}
