/**
 * Shared benchmark plumbing: one GPU context per bench file, GPU-side timing of compute passes
 * (timestamp queries where the adapter has them, else many passes between two host waits), the
 * adapter's measured memory bandwidth (the ceiling GEMV and decode attention are compared with),
 * and a one-line description of the machine for every printed figure.
 *
 * @module
 */

import { GpuContext, type GpuContextOptions } from "../gpu/context.ts";
import { timePasses, timePassesEach } from "../gpu/timer.ts";

let shared: Promise<GpuContext> | undefined;

/**
 * The context every bench in this process shares (f16 weights where `shader-f16` exists); the
 * first call's `options` create it (`deno bench` files take the kernel profile from
 * `WEBGPU_LLM_KERNEL_PROFILE`, the `bench:*` tasks from `--kernel-profile`).
 */
export function benchContext(options: GpuContextOptions = {}): Promise<GpuContext> {
  shared ??= GpuContext.create(options);
  return shared;
}

/** Times `encode`'s passes on the GPU (gpu/timer.ts). */
export const timeGpu = timePasses;
/** Times each encoder's passes on the GPU, in one submission where it can (gpu/timer.ts). */
export const timeGpuEach = timePassesEach;
export type { PassTiming as GpuTiming, TimePassesOptions as TimeGpuOptions } from "../gpu/timer.ts";

const COPY_WGSL = `
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) n: vec3u) {
  let stride = n.x * 256u;
  for (var i = g.x; i < arrayLength(&src); i += stride) { dst[i] = src[i]; }
}`;

/**
 * The adapter's memory bandwidth in GB/s (bytes read + bytes written per second), measured by a
 * vec4 copy kernel over `bytes` (default 64 MiB) in the same process: the ceiling for
 * memory-bound kernels.
 */
export async function measureCopyBandwidth(ctx: GpuContext, bytes = 64 << 20): Promise<number> {
  const usage = GPUBufferUsage.STORAGE;
  const src = ctx.createBuffer("bw-src", bytes, usage);
  const dst = ctx.createBuffer("bw-dst", bytes, usage);
  try {
    const pipeline = ctx.pipeline("bench/copy", () => COPY_WGSL);
    const bindGroup = ctx.device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: [{ binding: 0, resource: { buffer: src } }, {
        binding: 1,
        resource: { buffer: dst },
      }],
    });
    const t = await timeGpu(ctx, (pass) => {
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, bindGroup);
      pass.dispatchWorkgroups(1024);
    }, { repeats: 5 });
    return (2 * bytes) / (t.medianMs * 1e6);
  } finally {
    src.destroy();
    dst.destroy();
  }
}

/** Adapter, CPU cores, Deno version and date, for the header of printed results. */
export function describeMachine(ctx: GpuContext): string {
  const a = ctx.adapter;
  return `adapter: ${a.description} (vendor ${a.vendor}${a.isFallback ? ", fallback" : ""}); ` +
    `${navigator.hardwareConcurrency} CPU cores; Deno ${Deno.version.deno}; ` +
    `${new Date().toISOString().slice(0, 10)}`;
}
