/**
 * Benchmarks the element-wise and normalisation kernels at 512 tokens of hidden 1024 (Qwen3-0.6B
 * widths: 16 q heads, 8 kv heads, head_dim 128, fused qkv width 4096), f32 activations, weights
 * in the context's dtype: add, gelu_new, rms_norm (plain, fused residual add, per-head q/k
 * norm) and layer_norm for several workgroup shapes, embedding gather (32768-row table) and rope.
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
import { Rope, ropeInvFreq } from "../kernels/rope.ts";
import { benchContext, describeMachine, measureCopyBandwidth, timeGpu } from "./support.ts";

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

function random(ctx: GpuContext, count: number, label: string): GPUBuffer {
  const data = Float32Array.from({ length: count }, () => Math.random() * 2 - 1);
  const b = ctx.createBuffer(label, data.byteLength, STORAGE_RW);
  ctx.device.queue.writeBuffer(b, 0, data);
  return b;
}

function weight(ctx: GpuContext, cols: number, label: string): GpuMatrix {
  const data = Float32Array.from({ length: cols }, () => 0.5 + Math.random());
  return GpuMatrix.fromArray(ctx, label, data, 1, cols, ctx.weightDtype);
}

interface Case {
  readonly name: string;
  readonly bytes: number;
  readonly arena: ParamArena;
  readonly encode: (pass: GPUComputePassEncoder) => void;
}

function cases(ctx: GpuContext): Case[] {
  const n = TOKENS * HIDDEN;
  const wBytes = HIDDEN * bytesPerElement(ctx.weightDtype);
  const x = { buffer: random(ctx, n, "x") };
  const y = { buffer: random(ctx, n, "y") };
  const res = { buffer: random(ctx, n, "residual") };
  const out = { buffer: random(ctx, n, "out") };
  const qkv = { buffer: random(ctx, TOKENS * QKV, "qkv") };
  const arena = new ParamArena(ctx, 64);
  const list: Case[] = [];
  const add = new Add(ctx).bind(arena, { a: x, b: y, out });
  list.push({ name: "add out of place", bytes: 3 * n * 4, arena, encode: (p) => add.encode(p, n) });
  const gelu = new GeluNew(ctx).bind(arena, { input: x, out });
  list.push({ name: "gelu_new", bytes: 2 * n * 4, arena, encode: (p) => gelu.encode(p, n) });
  const w = weight(ctx, HIDDEN, "norm.w");
  for (const shape of NORM_SHAPES) {
    const op = new RmsNorm(ctx, shape).bind(arena, { weight: w, x, out });
    list.push({
      name: `rms_norm, ${shapeName(shape)}`,
      bytes: 2 * n * 4 + wBytes,
      arena,
      encode: (p) => op.encode(p, TOKENS),
    });
  }
  for (const shape of NORM_SHAPES) {
    const fused = new RmsNorm(ctx, shape).bind(arena, { weight: w, x, residual: res, out });
    list.push({
      name: `rms_norm fused add, ${shapeName(shape)}`,
      bytes: 4 * n * 4 + wBytes,
      arena,
      encode: (p) => fused.encode(p, TOKENS),
    });
  }
  const qw = weight(ctx, HEAD_DIM, "q_norm");
  const kw = weight(ctx, HEAD_DIM, "k_norm");
  for (const shape of NORM_SHAPES) {
    const rms = new RmsNorm(ctx, shape);
    const qNorm = rms.bind(arena, { weight: qw, x: qkv }, { heads: HQ, tokenStride: QKV });
    const kNorm = rms.bind(arena, { weight: kw, x: qkv }, {
      heads: HKV,
      tokenStride: QKV,
      offset: HQ * HEAD_DIM,
    });
    list.push({
      name: `rms_norm q + k per head (2 dispatches), ${shapeName(shape)}`,
      bytes: 2 * TOKENS * (HQ + HKV) * HEAD_DIM * 4,
      arena,
      encode: (p) => {
        qNorm.encode(p, TOKENS);
        kNorm.encode(p, TOKENS);
      },
    });
  }
  const lnBias = weight(ctx, HIDDEN, "ln.b");
  for (const shape of NORM_SHAPES) {
    const ln = new LayerNorm(ctx, shape).bind(arena, {
      weight: w,
      bias: lnBias,
      x,
      out,
    });
    list.push({
      name: `layer_norm, ${shapeName(shape)}`,
      bytes: 2 * n * 4 + 2 * wBytes,
      arena,
      encode: (p) => ln.encode(p, TOKENS),
    });
  }
  const table = GpuMatrix.create(ctx, "wte", VOCAB, HIDDEN, ctx.weightDtype);
  const ids = Uint32Array.from({ length: TOKENS }, () => Math.floor(Math.random() * VOCAB));
  const idsBuf = ctx.createBuffer("ids", ids.byteLength, STORAGE_RW);
  ctx.device.queue.writeBuffer(idsBuf, 0, ids);
  const emb = new Embedding(ctx).bind(arena, { ids: { buffer: idsBuf }, table, out });
  list.push({
    name: `embedding gather (${VOCAB}-row table)`,
    bytes: n * (4 + bytesPerElement(ctx.weightDtype)),
    arena,
    encode: (p) => emb.encode(p, TOKENS),
  });
  const positions = Uint32Array.from({ length: TOKENS }, (_, i) => 1000 + i);
  const posBuf = ctx.createBuffer("positions", positions.byteLength, STORAGE_RW);
  ctx.device.queue.writeBuffer(posBuf, 0, positions);
  const inv = ropeInvFreq(HEAD_DIM, 1e6);
  const invBuf = ctx.createBuffer("inv_freq", inv.byteLength, STORAGE_RW);
  ctx.device.queue.writeBuffer(invBuf, 0, inv);
  const rope = new Rope(ctx).bind(
    arena,
    { qkv, positions: { buffer: posBuf }, invFreq: { buffer: invBuf } },
    { heads: HQ + HKV, headDim: HEAD_DIM, tokenStride: QKV },
  );
  list.push({
    name: "rope q + k",
    bytes: 2 * TOKENS * (HQ + HKV) * HEAD_DIM * 4,
    arena,
    encode: (p) => rope.encode(p, TOKENS),
  });
  return list;
}

const ctx = await benchContext();
const copyGBs = await measureCopyBandwidth(ctx);
console.log(`element-wise kernels, ${describeMachine(ctx)}; weights ${ctx.weightDtype}`);
console.log(
  `${TOKENS} tokens x hidden ${HIDDEN} (qkv ${QKV}); copy bandwidth ${
    copyGBs.toFixed(1)
  } GB/s (read + write)`,
);
const all = cases(ctx);
for (const c of all) {
  const t = await timeGpu(ctx, c.encode, { arena: c.arena, warmup: 2, repeats: 10 });
  console.log(
    `  ${c.name}: ${t.medianMs.toFixed(3)} ms median (min ${t.minMs.toFixed(3)}), ` +
      `${(c.bytes / (t.medianMs * 1e6)).toFixed(1)} GB/s vs copy ${copyGBs.toFixed(1)} GB/s ` +
      `(${t.method})`,
  );
}

for (const c of all) {
  Deno.bench({
    name: `${c.name}, ${TOKENS} x ${HIDDEN} (host clock, one submission)`,
    n: 3,
    warmup: 1,
    async fn() {
      const encoder = ctx.device.createCommandEncoder();
      const pass = encoder.beginComputePass();
      c.encode(pass);
      pass.end();
      c.arena.flush();
      ctx.device.queue.submit([encoder.finish()]);
      await ctx.device.queue.onSubmittedWorkDone();
    },
  });
}
