/**
 * What the kernel micro-benchmarks (`bench/*_bench.ts` but the model one) share: their context
 * and copy-bandwidth ceiling, uploads of their inputs, deterministic random data, the GPU-timed
 * measurement of one bound kernel call ({@linkcode timeCase}) and its `Deno.bench` entry, which
 * times one submission with the host clock ({@linkcode benchSubmission}).
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../../gpu/context.ts";
import type { ParamArena } from "../../gpu/params.ts";
import {
  benchContext,
  describeMachine,
  type GpuTiming,
  measureCopyBandwidth,
  timeGpu,
  type TimeGpuOptions,
} from "../support.ts";

/** One bound kernel call to time: the arena its parameters live in and how to encode it. */
export interface KernelCase {
  /** Arena whose parameter slots `encode` writes (flushed before each submission). */
  readonly arena: ParamArena;
  /** Records the call's dispatches into `pass`. */
  readonly encode: (pass: GPUComputePassEncoder) => void;
  /** Frees the case's buffers (after its measurement); absent for cases kept to the end. */
  readonly destroy?: () => void;
}

/** The shared bench context and the adapter's copy bandwidth, measured now. */
export interface KernelBench {
  readonly ctx: GpuContext;
  /** Copy bandwidth in GB/s (read + write), see `measureCopyBandwidth`; NaN when not measured. */
  readonly copyGBs: number;
}

/** Options of {@linkcode openKernelBench}. */
export interface OpenKernelBenchOptions {
  /** Appended to the first line, e.g. `; KV f16`. */
  readonly detail?: (ctx: GpuContext) => string;
  /** Whether to measure the copy bandwidth (the ceiling of memory-bound kernels). Default true. */
  readonly copyBandwidth?: boolean;
}

/**
 * Opens a kernel benchmark: the shared context, its copy bandwidth, and a first printed line
 * `<title>, <machine><detail>`.
 */
export async function openKernelBench(
  title: string,
  options: OpenKernelBenchOptions = {},
): Promise<KernelBench> {
  const ctx = await benchContext();
  const copyGBs = options.copyBandwidth === false ? NaN : await measureCopyBandwidth(ctx);
  console.log(`${title}, ${describeMachine(ctx)}${options.detail?.(ctx) ?? ""}`);
  return { ctx, copyGBs };
}

/** `copy bandwidth X GB/s (read + write)`, for the header lines. */
export function copyBandwidthText(copyGBs: number): string {
  return `copy bandwidth ${copyGBs.toFixed(1)} GB/s (read + write)`;
}

/** `<median> ms median (min <min>)` with `digits` decimals. */
export function medianText(t: GpuTiming, digits: number): string {
  return `${t.medianMs.toFixed(digits)} ms median (min ${t.minMs.toFixed(digits)})`;
}

/**
 * A storage buffer (`STORAGE_RW`) holding `data`; the write is zero-padded to whole 4-byte
 * words (e.g. an odd number of f16 values).
 */
export function uploadBuffer(ctx: GpuContext, label: string, data: ArrayBufferView): GPUBuffer {
  const buffer = ctx.createBuffer(label, data.byteLength, STORAGE_RW);
  const bytes = new Uint8Array(Math.ceil(data.byteLength / 4) * 4);
  bytes.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  ctx.device.queue.writeBuffer(buffer, 0, bytes);
  return buffer;
}

/** `count` f32 values uniform in [-1, 1) (Math.random: timing does not depend on them). */
export function randomF32(count: number): Float32Array<ArrayBuffer> {
  return Float32Array.from({ length: count }, () => Math.random() * 2 - 1);
}

/** A deterministic uniform (0, 1) generator (32-bit LCG) starting from `seed`. */
export function lcg(seed: number): () => number {
  let state = seed;
  return () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return (state + 0.5) / 4294967296;
  };
}

/** `rows * vocab` N(0, 2) logits (Box-Muller over `next`), deterministic for a given `next`. */
export function normalLogits(
  rows: number,
  vocab: number,
  next: () => number,
): Float32Array<ArrayBuffer> {
  const out = new Float32Array(rows * vocab);
  for (let i = 0; i < out.length; i++) {
    out[i] = 2 * Math.sqrt(-2 * Math.log(next())) * Math.cos(2 * Math.PI * next());
  }
  return out;
}

/**
 * GPU time of one case (`timeGpu`, its arena flushed before each submission), made by `make`
 * and destroyed after the measurement.
 */
export async function timeCase(
  ctx: GpuContext,
  make: () => KernelCase,
  options: Omit<TimeGpuOptions, "arena"> = {},
): Promise<GpuTiming> {
  const c = make();
  try {
    return await timeGpu(ctx, c.encode, { ...options, arena: c.arena });
  } finally {
    c.destroy?.();
  }
}

/** Encodes `c` in one pass, submits it and waits for the queue (host-clock timing). */
export async function submitOnce(ctx: GpuContext, c: KernelCase): Promise<void> {
  const encoder = ctx.device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  c.encode(pass);
  pass.end();
  c.arena.flush();
  ctx.device.queue.submit([encoder.finish()]);
  await ctx.device.queue.onSubmittedWorkDone();
}

/**
 * Registers a `Deno.bench` entry `name` timing one submission of `c` with the host clock (so
 * the ~10 ms wait floor is included); `options` default to 3 runs after 1 warmup.
 */
export function benchSubmission(
  ctx: GpuContext,
  name: string,
  c: KernelCase,
  options: { readonly n?: number; readonly warmup?: number } = { n: 3, warmup: 1 },
): void {
  // An async function, not one returning a promise: `Deno.bench` awaits only the former.
  Deno.bench({ name, ...options, fn: async () => await submitOnce(ctx, c) });
}
