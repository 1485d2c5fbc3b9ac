/**
 * Benchmarks the element-wise and normalisation kernels at 512 tokens of hidden 1024 (Qwen3-0.6B
 * widths: 16 q heads, 8 kv heads, head_dim 128, fused qkv width 4096), f32 activations, weights
 * in the context's dtype: add, gelu_new, rms_norm (plain, fused residual add, per-head q/k
 * norm) and layer_norm for several workgroup shapes, rope_and_cache (q/k norm, RoPE and the K/V
 * cache write of Qwen3, same shapes) and embedding gather (32768-row table).
 *
 * Run: `deno bench -A bench/elementwise_bench.ts` (norm shapes to compare:
 * `NORM_SHAPES=1x64,8x8,64x1`, lanes per row x rows per workgroup). Printed lines are GPU times from timestamp
 * queries (bench/support.ts timeGpu); "GB/s" counts the minimum bytes each kernel must move
 * (every input read once, every output written once) over the median time, next to the copy
 * bandwidth (read + write) measured in the same run. The `Deno.bench` entries time one
 * submission with the host clock, so they include the ~10 ms wait floor.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../gpu/context.ts";
import { bytesPerElement } from "../gpu/dtype.ts";
import { ParamArena } from "../gpu/params.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import { Add } from "../kernels/add.ts";
import { Embedding } from "../kernels/embedding.ts";
import { GeluNew } from "../kernels/gelu_new.ts";
import { LayerNorm } from "../kernels/layer_norm.ts";
import { type NormShape, RmsNorm } from "../kernels/rms_norm.ts";
import { RopeAndCache } from "../kernels/rope_and_cache.ts";
import {
  benchSubmission,
  copyBandwidthText,
  type KernelCase,
  medianText,
  openKernelBench,
  randomF32,
  timeCase,
  uploadBuffer,
} from "./lib/kernel_bench.ts";

const TOKENS = 512;
const HIDDEN = 1024;
const HQ = 16;
const HKV = 8;
const HEAD_DIM = 128;
const QKV = (HQ + 2 * HKV) * HEAD_DIM;
const VOCAB = 32768;
/**
 * Norm workgroup shapes to compare, `<rowThreads>x<rowsPerWorkgroup>` (env NORM_SHAPES,
 * comma-separated); default: one invocation per row (the lavapipe default) and 64 lanes per row.
 */
const NORM_SHAPES: NormShape[] = (Deno.env.get("NORM_SHAPES") ?? "1x64,64x1").split(",").map(
  (s) => {
    const [t, r] = s.split("x").map(Number);
    return { rowThreads: t, rowsPerWorkgroup: r };
  },
);
const shapeName = (s: NormShape) => `${s.rowThreads} lanes x ${s.rowsPerWorkgroup} rows`;

function weight(ctx: GpuContext, cols: number, label: string): GpuMatrix {
  const data = Float32Array.from({ length: cols }, () => 0.5 + Math.random());
  return GpuMatrix.fromArray(ctx, label, data, 1, cols, ctx.weightDtype);
}

interface Case extends KernelCase {
  readonly name: string;
  /** The minimum bytes the kernel must move (inputs read once, outputs written once). */
  readonly bytes: number;
}

/** The activations every case reads or writes, f32, and the cases' shared parameter arena. */
interface Inputs {
  readonly n: number;
  readonly x: GPUBufferBinding;
  readonly y: GPUBufferBinding;
  readonly res: GPUBufferBinding;
  readonly out: GPUBufferBinding;
  readonly qkv: GPUBufferBinding;
  readonly arena: ParamArena;
}

function inputs(ctx: GpuContext): Inputs {
  const n = TOKENS * HIDDEN;
  const buffer = (count: number, label: string) => ({
    buffer: uploadBuffer(ctx, label, randomF32(count)),
  });
  return {
    n,
    x: buffer(n, "x"),
    y: buffer(n, "y"),
    res: buffer(n, "residual"),
    out: buffer(n, "out"),
    qkv: buffer(TOKENS * QKV, "qkv"),
    arena: new ParamArena(ctx, 64),
  };
}

/** add and gelu_new over the [TOKENS, HIDDEN] activations. */
function activationCases(ctx: GpuContext, io: Inputs): Case[] {
  const { n, x, y, out, arena } = io;
  const add = new Add(ctx).bind(arena, { a: x, b: y, out });
  const gelu = new GeluNew(ctx).bind(arena, { input: x, out });
  return [
    { name: "add out of place", bytes: 3 * n * 4, arena, encode: (p) => add.encode(p, n) },
    { name: "gelu_new", bytes: 2 * n * 4, arena, encode: (p) => gelu.encode(p, n) },
  ];
}

/** rms_norm (plain, fused residual add, per-head q/k) and layer_norm for each norm shape. */
function normCases(ctx: GpuContext, io: Inputs): Case[] {
  const { n, x, res, out, qkv, arena } = io;
  const wBytes = HIDDEN * bytesPerElement(ctx.weightDtype);
  const w = weight(ctx, HIDDEN, "norm.w");
  const qw = weight(ctx, HEAD_DIM, "q_norm");
  const kw = weight(ctx, HEAD_DIM, "k_norm");
  const lnBias = weight(ctx, HIDDEN, "ln.b");
  const list: Case[] = [];
  const add = (name: string, shape: NormShape, bytes: number, encode: Case["encode"]) =>
    list.push({ name: `${name}, ${shapeName(shape)}`, bytes, arena, encode });
  for (const shape of NORM_SHAPES) {
    const op = new RmsNorm(ctx, shape).bind(arena, { weight: w, x, out });
    add("rms_norm", shape, 2 * n * 4 + wBytes, (p) => op.encode(p, TOKENS));
  }
  for (const shape of NORM_SHAPES) {
    const fused = new RmsNorm(ctx, shape).bind(arena, { weight: w, x, residual: res, out });
    add("rms_norm fused add", shape, 4 * n * 4 + wBytes, (p) => fused.encode(p, TOKENS));
  }
  for (const shape of NORM_SHAPES) {
    const rms = new RmsNorm(ctx, shape);
    const qNorm = rms.bind(arena, { weight: qw, x: qkv }, { heads: HQ, tokenStride: QKV });
    const kNorm = rms.bind(arena, { weight: kw, x: qkv }, {
      heads: HKV,
      tokenStride: QKV,
      offset: HQ * HEAD_DIM,
    });
    add(
      "rms_norm q + k per head (2 dispatches)",
      shape,
      2 * TOKENS * (HQ + HKV) * HEAD_DIM * 4,
      (p) => {
        qNorm.encode(p, TOKENS);
        kNorm.encode(p, TOKENS);
      },
    );
  }
  for (const shape of NORM_SHAPES) {
    const ln = new LayerNorm(ctx, shape).bind(arena, { weight: w, bias: lnBias, x, out });
    add("layer_norm", shape, 2 * n * 4 + 2 * wBytes, (p) => ln.encode(p, TOKENS));
  }
  return list;
}

/** Embedding gather from a VOCAB-row table. */
function gatherCases(ctx: GpuContext, io: Inputs): Case[] {
  const { n, out, arena } = io;
  const table = GpuMatrix.create(ctx, "wte", VOCAB, HIDDEN, ctx.weightDtype);
  const ids = Uint32Array.from({ length: TOKENS }, () => Math.floor(Math.random() * VOCAB));
  const emb = new Embedding(ctx).bind(arena, {
    ids: { buffer: uploadBuffer(ctx, "ids", ids) },
    table,
    out,
  });
  return [{
    name: `embedding gather (${VOCAB}-row table)`,
    bytes: n * (4 + bytesPerElement(ctx.weightDtype)),
    arena,
    encode: (p) => emb.encode(p, TOKENS),
  }];
}

/**
 * rope_and_cache with Qwen3's q/k norms for each norm shape: the TOKENS tokens go to distinct
 * slots of a cache of the weight dtype (16-token blocks). Its bytes: qkv read, q written, k and v
 * written to the cache.
 */
function ropeAndCacheCases(ctx: GpuContext, io: Inputs): Case[] {
  const { qkv, arena } = io;
  const dtype = ctx.weightDtype;
  const positions = Uint32Array.from({ length: TOKENS }, (_, i) => 1000 + i);
  const invFreq = Float32Array.from({ length: HEAD_DIM / 2 }, (_, i) => 1e6 ** (-2 * i / HEAD_DIM));
  const slots = Uint32Array.from({ length: TOKENS }, (_, i) => i);
  const cacheBytes = TOKENS * HKV * HEAD_DIM * bytesPerElement(dtype);
  const buffers = {
    qkv,
    positions: { buffer: uploadBuffer(ctx, "positions", positions) },
    invFreq: { buffer: uploadBuffer(ctx, "inv_freq", invFreq) },
    slotMapping: { buffer: uploadBuffer(ctx, "slots", slots) },
    kCache: { buffer: ctx.createBuffer("k_cache", cacheBytes, STORAGE_RW) },
    vCache: { buffer: ctx.createBuffer("v_cache", cacheBytes, STORAGE_RW) },
    qkNorm: { q: weight(ctx, HEAD_DIM, "q_norm"), k: weight(ctx, HEAD_DIM, "k_norm") },
  };
  return NORM_SHAPES.map((shape) => {
    const op = new RopeAndCache(ctx, shape).bind(arena, buffers, {
      numHeads: HQ,
      numKvHeads: HKV,
      headDim: HEAD_DIM,
      blockSize: 16,
      cacheDtype: dtype,
    });
    return {
      name: `rope_and_cache (q/k norm, rope, kv write), ${shapeName(shape)}`,
      bytes: TOKENS * (QKV + HQ * HEAD_DIM) * 4 + 2 * cacheBytes,
      arena,
      encode: (p: GPUComputePassEncoder) => op.encode(p, TOKENS),
    };
  });
}

const { ctx, copyGBs } = await openKernelBench(
  "element-wise kernels",
  { detail: (c) => `; weights ${c.weightDtype}` },
);
console.log(`${TOKENS} tokens x hidden ${HIDDEN} (qkv ${QKV}); ${copyBandwidthText(copyGBs)}`);
const io = inputs(ctx);
const all = [
  ...activationCases(ctx, io),
  ...normCases(ctx, io),
  ...ropeAndCacheCases(ctx, io),
  ...gatherCases(ctx, io),
];
for (const c of all) {
  const t = await timeCase(ctx, () => c, { warmup: 2, repeats: 10 });
  console.log(
    `  ${c.name}: ${medianText(t, 3)}, ` +
      `${(c.bytes / (t.medianMs * 1e6)).toFixed(1)} GB/s vs copy ${copyGBs.toFixed(1)} GB/s ` +
      `(${t.method})`,
  );
}

for (const c of all) {
  benchSubmission(ctx, `${c.name}, ${TOKENS} x ${HIDDEN} (host clock, one submission)`, c);
}
