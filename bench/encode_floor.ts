/**
 * The host cost of encoding dispatches through Deno's WebGPU, with nothing of the engine around
 * them: the floor under `bench:model`'s "host per step". One pass of `--dispatches` trivial
 * dispatches (one workgroup each, so the device's work does not matter), each with its own bind
 * group of `--bindings` storage buffers (taken in turn from a pool of `--buffers`: a decode step
 * binds ~300 distinct ones, its weights, caches and activations) and one of `--pipelines`
 * pipelines, as a decode step encodes them; the time to record them (`setPipeline`,
 * `setBindGroup`, `dispatchWorkgroups`), then inside `GPUCommandEncoder.finish` (where wgpu
 * validates and records the commands) and `queue.submit`, median of 50 encoders (each awaited,
 * so no submit waits on a previous one).
 *
 * With `--drop` each command buffer is dropped unsubmitted (an empty submission instead), as
 * bench/host_calls.ts does with its stubbed `queue.submit`: wgpu then cannot recycle the
 * buffers' encoders, and `finish` costs more (see docs/benchmarks.md).
 *
 * Run: `deno run -A bench/encode_floor.ts [--dispatches 235,179,120] [--bindings 6]
 * [--pipelines 24] [--buffers 64] [--drop]`.
 *
 * @module
 */

import { benchContext, describeMachine } from "./support.ts";
import { median } from "./lib/step_cost.ts";
import { isPositiveInteger, scriptFlags } from "./bench_io.ts";

const values = scriptFlags("bench/encode_floor.ts", Deno.args, {
  dispatches: { type: "string", default: "235,179,120" },
  bindings: { type: "string", default: "6" },
  pipelines: { type: "string", default: "24" },
  buffers: { type: "string", default: "64" },
  drop: { type: "boolean", default: false },
}, (v) => {
  if (![...v.dispatches.split(","), v.bindings, v.pipelines, v.buffers].every(isPositiveInteger)) {
    throw new Error("--dispatches, --bindings, --pipelines and --buffers take positive integers");
  }
  if (Number(v.buffers) < Number(v.bindings)) {
    throw new Error("--buffers must be at least --bindings: a dispatch binds distinct buffers");
  }
});
const counts = values.dispatches.split(",").map(Number);
const bindings = Number(values.bindings);
const numPipelines = Number(values.pipelines);
const numBuffers = Number(values.buffers);

const ctx = await benchContext();
const device = ctx.device;

/** A pipeline reading `bindings - 1` buffers into the first; `k` makes each one distinct. */
function pipeline(k: number): GPUComputePipeline {
  const inputs = Array.from({ length: bindings - 1 }, (_, i) => i + 1);
  const code =
    inputs.map((i) =>
      `@group(0) @binding(${i}) var<storage, read> b${i}: array<u32>; // [1024] u32\n`
    ).join("") +
    "@group(0) @binding(0) var<storage, read_write> a: array<u32>; // [1024] u32\n" +
    "@compute @workgroup_size(64)\n" +
    "fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n" +
    `  if (g.x == 0u) { a[0] = ${inputs.map((i) => `b${i}[0] + `).join("")}${k}u; }\n}\n`;
  const module = device.createShaderModule({ code });
  return device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" } });
}

const pipelines = Array.from({ length: numPipelines }, (_, k) => pipeline(k));
const buffers = Array.from(
  { length: numBuffers },
  () => ctx.createBuffer("floor", 4096, GPUBufferUsage.STORAGE),
);

/** Median record / finish / submit ms of one pass of `n` dispatches. */
async function measure(n: number) {
  const groups = Array.from({ length: n }, (_, i) =>
    device.createBindGroup({
      layout: pipelines[i % numPipelines]!.getBindGroupLayout(0),
      entries: Array.from({ length: bindings }, (_, j) => ({
        binding: j,
        resource: { buffer: buffers[(i * bindings + j) % buffers.length]! },
      })),
    }));
  const record: number[] = [];
  const finish: number[] = [];
  const submit: number[] = [];
  for (let it = 0; it < 60; it++) {
    const encoder = device.createCommandEncoder();
    const t0 = performance.now();
    const pass = encoder.beginComputePass();
    for (let i = 0; i < n; i++) {
      pass.setPipeline(pipelines[i % numPipelines]!);
      pass.setBindGroup(0, groups[i]!);
      pass.dispatchWorkgroups(1);
    }
    pass.end();
    const t1 = performance.now();
    const commands = encoder.finish();
    const t2 = performance.now();
    device.queue.submit(values.drop ? [] : [commands]);
    const t3 = performance.now();
    await device.queue.onSubmittedWorkDone();
    if (it < 10) continue; // warm-up
    record.push(t1 - t0);
    finish.push(t2 - t1);
    submit.push(t3 - t2);
  }
  return { record: median(record), finish: median(finish), submit: median(submit) };
}

console.log(`encode_floor: ${describeMachine(ctx)}`);
console.log(
  `command: deno run -A bench/encode_floor.ts ${Deno.args.join(" ")}`.trim() +
    ` (${bindings} bindings per dispatch, ${numPipelines} pipelines, ${numBuffers} buffers` +
    `${values.drop ? ", command buffers dropped unsubmitted" : ""})`,
);
for (const n of counts) {
  const r = await measure(n);
  const total = r.record + r.finish + r.submit;
  console.log(
    `${n} dispatches: record ${r.record.toFixed(3)} ms, finish ${r.finish.toFixed(3)} ms, ` +
      `submit ${r.submit.toFixed(3)} ms; ${total.toFixed(3)} ms per pass, ` +
      `${(1000 * total / n).toFixed(2)} us per dispatch`,
  );
}
ctx.destroy();
