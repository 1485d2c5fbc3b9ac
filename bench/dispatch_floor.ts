/**
 * The GPU's cost of one dispatch, apart from its work: one compute pass of N dispatches of a
 * kernel that does almost nothing, timed on the GPU (`timestamp-query`), at two N, so that
 * (t(N) - t(1)) / (N - 1) is the time a further dispatch adds. Two chains:
 *
 * - `dependent`: dispatch i reads the buffer dispatch i - 1 wrote and writes the other one, so
 *   wgpu puts a barrier between every two (as between a decode step's kernels: each reads what
 *   the one before wrote);
 * - `independent`: every dispatch reads one buffer and writes its own, with no barrier between
 *   them.
 *
 * Each at `--workgroups` sizes (workgroups of 256 invocations per dispatch: 1, and enough to
 * cover a large GPU, as a decode GEMV does). On the H200 (2026-11-27) a Qwen3-0.6B decode step of
 * 173 dispatches computed for 2.31 ms, and 28 more dispatches cost ~0.15 ms: this prints that
 * per-dispatch figure directly. Under the host clock (no `timestamp-query`) the times include a
 * submission's round trip, divided by the passes.
 *
 * Run: `deno run -A bench/dispatch_floor.ts [--dispatches 145] [--workgroups 1,528]`.
 *
 * @module
 */

import { benchContext, describeMachine, timeGpu } from "./support.ts";
import { isPositiveInteger, scriptFlags } from "./bench_io.ts";

const values = scriptFlags("bench/dispatch_floor.ts", Deno.args, {
  dispatches: { type: "string", default: "145" },
  workgroups: { type: "string", default: "1,528" },
}, (v) => {
  if (!isPositiveInteger(v.dispatches) || Number(v.dispatches) < 2) {
    throw new Error(`--dispatches takes an integer >= 2, got "${v.dispatches}"`);
  }
  if (!v.workgroups.split(",").every(isPositiveInteger)) {
    throw new Error(`--workgroups takes positive integers, got "${v.workgroups}"`);
  }
});
const n = Number(values.dispatches);
const sizes = values.workgroups.split(",").map(Number);

const ctx = await benchContext();
const device = ctx.device;
// Bindings: 0 src: storage read array<u32> [WORDS]; 1 dst: storage rw array<u32> [WORDS].
// Workgroup 256 invocations; dispatch (G, 1, 1): invocation g copies word g % WORDS plus one.
const WORDS = 1024;
const module = device.createShaderModule({
  code: `
@group(0) @binding(0) var<storage, read> src: array<u32>;       // [${WORDS}] u32
@group(0) @binding(1) var<storage, read_write> dst: array<u32>; // [${WORDS}] u32
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3u) {
  let i = g.x % ${WORDS}u;
  dst[i] = src[i] + 1u;
}`,
});
const pipeline = device.createComputePipeline({
  layout: "auto",
  compute: { module, entryPoint: "main" },
});
const buffer = (label: string) =>
  ctx.createBuffer(label, 4 * WORDS, GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST);
const ping = buffer("ping");
const pong = buffer("pong");
const own = Array.from({ length: n }, (_, i) => buffer(`own#${i}`));
const group = (src: GPUBuffer, dst: GPUBuffer) =>
  device.createBindGroup({
    layout: pipeline.getBindGroupLayout(0),
    entries: [{ binding: 0, resource: { buffer: src } }, { binding: 1, resource: { buffer: dst } }],
  });
const chains = {
  dependent: Array.from(
    { length: n },
    (_, i) => i % 2 === 0 ? group(ping, pong) : group(pong, ping),
  ),
  independent: own.map((dst) => group(ping, dst)),
};

/** Median GPU ms of one pass of the first `count` dispatches of `groups`, `size` workgroups each. */
async function passMs(groups: readonly GPUBindGroup[], count: number, size: number) {
  const t = await timeGpu(ctx, (pass) => {
    pass.setPipeline(pipeline);
    for (let i = 0; i < count; i++) {
      pass.setBindGroup(0, groups[i]!);
      pass.dispatchWorkgroups(size);
    }
  }, { warmup: 3, repeats: 15 });
  return { ms: t.medianMs, method: t.method };
}

console.log(`dispatch_floor: ${describeMachine(ctx)}`);
console.log(`command: deno run -A bench/dispatch_floor.ts ${Deno.args.join(" ")}`.trim());
for (const size of sizes) {
  for (const [name, groups] of Object.entries(chains)) {
    const one = await passMs(groups, 1, size);
    const all = await passMs(groups, n, size);
    const per = (1000 * (all.ms - one.ms)) / (n - 1);
    console.log(
      `${name}, ${size} workgroups of 256: 1 dispatch ${one.ms.toFixed(4)} ms, ${n} dispatches ` +
        `${all.ms.toFixed(4)} ms; ${per.toFixed(2)} us per further dispatch (${all.method})`,
    );
  }
}
for (const b of [ping, pong, ...own]) b.destroy();
ctx.destroy();
