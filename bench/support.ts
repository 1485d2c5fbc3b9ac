/**
 * Shared benchmark plumbing: one GPU context per bench file, GPU-side timing of compute passes
 * (timestamp queries where the adapter has them, else many passes between two host waits), the
 * adapter's measured memory bandwidth (the ceiling GEMV and decode attention are compared with),
 * and a one-line description of the machine for every printed figure.
 *
 * @module
 */

import { GpuContext, type GpuContextOptions } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import { GpuTimer } from "../gpu/timer.ts";

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

/** Median and minimum GPU time of one pass, in milliseconds. */
export interface GpuTiming {
  readonly medianMs: number;
  readonly minMs: number;
  /** "timestamp-query" or "host clock / N passes". */
  readonly method: string;
}

/** Options for {@linkcode timeGpu}. */
export interface TimeGpuOptions {
  /** Arena whose parameters `encode` writes; flushed before each submission. */
  arena?: ParamArena;
  /** Untimed passes first (shader compilation happens on first use). Default 2. */
  warmup?: number;
  /** Timed passes. Default 10. */
  repeats?: number;
}

/**
 * Times `encode` (which records dispatches into the given pass). With `timestamp-query`, each
 * repeat is one pass timed on the GPU; without it, all repeats run in one submission and the
 * host time is divided by their number (then min == median).
 */
export async function timeGpu(
  ctx: GpuContext,
  encode: (pass: GPUComputePassEncoder) => void,
  options: TimeGpuOptions = {},
): Promise<GpuTiming> {
  const warmup = options.warmup ?? 2;
  const repeats = options.repeats ?? 10;
  const run = async (passes: number, timer?: GpuTimer) => {
    const encoder = ctx.device.createCommandEncoder();
    for (let i = 0; i < passes; i++) {
      const pass = encoder.beginComputePass(timer?.passDescriptor(i));
      encode(pass);
      pass.end();
    }
    timer?.resolve(encoder, passes);
    options.arena?.flush();
    ctx.device.queue.submit([encoder.finish()]);
    if (timer !== undefined) return await timer.read(passes);
    await ctx.device.queue.onSubmittedWorkDone();
    return [];
  };
  if (warmup > 0) await run(warmup);
  ctx.check();
  if (ctx.hasTimestamps) {
    const timer = new GpuTimer(ctx, repeats);
    try {
      const ms = (await run(repeats, timer)).sort((a, b) => a - b);
      return { medianMs: ms[Math.floor(ms.length / 2)]!, minMs: ms[0]!, method: "timestamp-query" };
    } finally {
      timer.destroy();
    }
  }
  const t0 = performance.now();
  await run(repeats);
  const ms = (performance.now() - t0) / repeats;
  return { medianMs: ms, minMs: ms, method: `host clock / ${repeats} passes` };
}

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
