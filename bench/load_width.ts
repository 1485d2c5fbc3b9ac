/**
 * What a weight load costs by its width, on the gate_up decode shape (6,144 x 1,024, M = 1):
 * kernels that only load the int4 words (and fold them into one sum so nothing is optimised
 * away), one `u32` per 8 weights, one `vec4<u32>` per group of 32, or one `rgba32uint` texel per
 * group of 32 from a texture; next to the engine's own `unrolled` matmul on int4 and f16 weights.
 * Same workgroup shape as `unrolled` (8 invocations, 16 weight rows each). On lavapipe (Mesa
 * 22.3) a storage load costs per instruction far more than per byte, which is why the quantized
 * `unrolled` kernel reads a whole group per load (kernels/matmul_unrolled_q.wgsl).
 *
 * Each figure is the median over passes of 28 dispatches (a decode step's worth of one
 * projection), GPU timestamps, per dispatch. Run: `deno run -A bench/load_width.ts`.
 *
 * @module
 */

import { benchContext, describeMachine, timeGpu } from "./support.ts";
import { STORAGE_RW } from "../gpu/context.ts";
import { ParamArena } from "../gpu/params.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import { Matmul } from "../kernels/matmul.ts";

const N = 6144;
const K = 1024;
const RN = 16;
const WG = 8;
const DISPATCHES = 28;

const ctx = await benchContext();
const device = ctx.device;
console.log(`load_width: ${describeMachine(ctx)}`);
console.log(`command: deno run -A bench/load_width.ts; int4 words of ${N} x ${K}, M = 1`);

/** A loads-only kernel: `load(r, g)` yields group g of weight row r's words as a u32. */
function loadsOnly(binding: string, groupWord: string): string {
  const rows = Array.from({ length: RN }, (_, r) => r);
  return `${binding}
@group(0) @binding(1) var<storage, read_write> y: array<u32>;
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let row0 = (wid.x * ${WG}u + lid) * ${RN}u;
${rows.map((r) => `  var acc${r} = 0u;`).join("\n")}
  for (var g = 0u; g < ${K / 32}u; g++) {
${rows.map((r) => `    acc${r} ^= ${groupWord.replaceAll("ROW", `(row0 + ${r}u)`)};`).join("\n")}
  }
${rows.map((r) => `  y[row0 + ${r}u] = acc${r};`).join("\n")}
}`;
}

const words = ctx.createBuffer("words", (N * K) / 2, STORAGE_RW);
const out = ctx.createBuffer("out", N * 4, STORAGE_RW);
const texture = device.createTexture({
  size: [K / 32, N],
  format: "rgba32uint",
  usage: GPUTextureUsage.TEXTURE_BINDING | GPUTextureUsage.COPY_DST,
});
const variants: { name: string; code: string; resource: GPUBindingResource }[] = [
  {
    name: "loads only, u32 per 8 weights (4 loads per group)",
    code: loadsOnly(
      "@group(0) @binding(0) var<storage, read> w: array<u32>;",
      "(w[ROW * 128u + 4u * g] ^ w[ROW * 128u + 4u * g + 1u] ^ w[ROW * 128u + 4u * g + 2u] ^ " +
        "w[ROW * 128u + 4u * g + 3u])",
    ),
    resource: { buffer: words },
  },
  {
    name: "loads only, vec4<u32> per group of 32",
    code: loadsOnly(
      "@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;\n" +
        "fn fold(v: vec4<u32>) -> u32 { return v.x ^ v.y ^ v.z ^ v.w; }",
      "fold(w[ROW * 32u + g])",
    ),
    resource: { buffer: words },
  },
  {
    name: "loads only, rgba32uint texel per group of 32",
    code: loadsOnly(
      "@group(0) @binding(0) var w: texture_2d<u32>;\n" +
        "fn fold(v: vec4<u32>) -> u32 { return v.x ^ v.y ^ v.z ^ v.w; }",
      "fold(textureLoad(w, vec2<i32>(i32(g), i32(ROW)), 0))",
    ),
    resource: texture.createView(),
  },
];

const report = (name: string, ms: number) =>
  console.log(
    `  ${name.padEnd(52)} ${ms.toFixed(3)} ms, ${((N * K) / (ms * 1e6)).toFixed(2)} G weights/s`,
  );

for (const v of variants) {
  const pipeline = device.createComputePipeline({
    layout: "auto",
    compute: { module: device.createShaderModule({ code: v.code }), entryPoint: "main" },
  });
  const group = device.createBindGroup({
    layout: pipeline.getBindGroupLayout(0),
    entries: [{ binding: 0, resource: v.resource }, { binding: 1, resource: { buffer: out } }],
  });
  const t = await timeGpu(ctx, (pass) => {
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, group);
    for (let i = 0; i < DISPATCHES; i++) pass.dispatchWorkgroups(N / (WG * RN));
  }, { warmup: 1, repeats: 7 });
  report(v.name, t.medianMs / DISPATCHES);
}

// The engine's kernels on the same shape (the profile's decode matmul, as a step runs it).
for (const format of ["int4", "f16"] as const) {
  const matmul = new Matmul(ctx, { dtype: "f16", bias: false });
  const weight = format === "f16"
    ? GpuMatrix.create(ctx, "w", N, K, "f16", { padColsTo: 4 })
    : GpuMatrix.createQuantized(ctx, "w", N, K, format);
  const x = ctx.createBuffer("x", K * 4, STORAGE_RW);
  const y = ctx.createBuffer("y", N * 4, STORAGE_RW);
  const arena = new ParamArena(ctx, weight.parts.length);
  const op = matmul.bind(arena, { x: { buffer: x }, weight, y: { buffer: y } });
  const t = await timeGpu(ctx, (pass) => {
    for (let i = 0; i < DISPATCHES; i++) op.encode(pass, 1);
  }, { arena, warmup: 1, repeats: 7 });
  report(`engine matmul (${matmul.policy} policy), ${format} weights`, t.medianMs / DISPATCHES);
  for (const b of [weight, x, y, arena]) b.destroy();
}
for (const b of [words, out, texture]) b.destroy();
ctx.destroy();
