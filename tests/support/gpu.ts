/**
 * GPU helpers for kernel tests: one shared {@linkcode GpuContext} per test file, buffer upload,
 * poisoning (outputs are filled with NaN / 0xDEADBEEF before each run so an element the kernel
 * never writes fails the comparison) and readback.
 *
 * @module
 */

import { GpuContext, type GpuContextOptions, STORAGE_RW } from "../../gpu/context.ts";
import { ParamArena } from "../../gpu/params.ts";
import { readBuffer } from "../../gpu/readback.ts";

const contexts = new Map<string, Promise<GpuContext>>();

/** The shared context for these options (created on first use; never destroyed, see below). */
export function testContext(options: GpuContextOptions = {}): Promise<GpuContext> {
  const key = JSON.stringify(options);
  let ctx = contexts.get(key);
  if (ctx === undefined) {
    ctx = GpuContext.create(options);
    contexts.set(key, ctx);
  }
  return ctx;
}

/**
 * Test options for GPU tests: the shared device outlives individual tests, which Deno's
 * resource and op sanitizers would report as leaks.
 */
export const GPU_TEST = { sanitizeResources: false, sanitizeOps: false } as const;

/**
 * A storage buffer holding `data` (f32 unless an integer array is given). With `uniformBytes`,
 * the buffer may also be bound as uniform and holds at least that many bytes (a multiple of 16),
 * all-ones bytes (f32 NaNs) after `data`.
 */
export function upload(
  ctx: GpuContext,
  data: Float32Array | Uint32Array | Int32Array | Float16Array | Uint8Array,
  label = "input",
  uniformBytes?: number,
): GPUBuffer {
  const size = uniformBytes === undefined
    ? Math.max(data.byteLength, 4)
    : Math.ceil(Math.max(uniformBytes, data.byteLength, 16) / 16) * 16;
  const usage = uniformBytes === undefined ? STORAGE_RW : STORAGE_RW | GPUBufferUsage.UNIFORM;
  const buffer = ctx.createBuffer(label, size, usage);
  // Copy into a fresh, 4-byte-padded ArrayBuffer (writeBuffer sizes must be multiples of 4).
  const bytes = new Uint8Array(Math.ceil(size / 4) * 4);
  if (uniformBytes !== undefined) bytes.fill(0xff, data.byteLength);
  bytes.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  ctx.device.queue.writeBuffer(buffer, 0, bytes);
  return buffer;
}

/** A storage buffer of `count` f32 values, all NaN (poisoned). */
export function poisonedF32(ctx: GpuContext, count: number, label = "output"): GPUBuffer {
  return upload(ctx, new Float32Array(count).fill(NaN), label);
}

/** A storage buffer of `count` u32 values, all 0xDEADBEEF (poisoned). */
export function poisonedU32(ctx: GpuContext, count: number, label = "output"): GPUBuffer {
  return upload(ctx, new Uint32Array(count).fill(0xdeadbeef), label);
}

/** Reads a whole buffer back as f32. */
export async function readF32(
  ctx: GpuContext,
  buffer: GPUBuffer,
  count?: number,
): Promise<Float32Array> {
  const bytes = await readBuffer(ctx, buffer, 0, count === undefined ? buffer.size : count * 4);
  return new Float32Array(bytes);
}

/** Reads a whole buffer back as u32. */
export async function readU32(
  ctx: GpuContext,
  buffer: GPUBuffer,
  count?: number,
): Promise<Uint32Array> {
  const bytes = await readBuffer(ctx, buffer, 0, count === undefined ? buffer.size : count * 4);
  return new Uint32Array(bytes);
}

/**
 * Runs `encode` in one compute pass, flushing `arena` first, then submits. Throws if the device
 * reported an error (validation errors are captured with an error scope).
 */
export async function runPass(
  ctx: GpuContext,
  arena: ParamArena,
  encode: (pass: GPUComputePassEncoder) => void,
): Promise<void> {
  ctx.device.pushErrorScope("validation");
  const encoder = ctx.device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  encode(pass);
  pass.end();
  arena.flush();
  ctx.device.queue.submit([encoder.finish()]);
  const error = await ctx.device.popErrorScope();
  if (error !== null) throw new Error(`GPU validation error: ${error.message}`);
  ctx.check();
}

/** Wraps a GPUBuffer as a whole-buffer binding. */
export function whole(buffer: GPUBuffer): GPUBufferBinding {
  return { buffer };
}

export { ParamArena };

/**
 * Whether the test adapter has `shader-f16`. Without it (e.g. llvmpipe through OpenGL instead of
 * lavapipe, when the tests run outside `deno task test`, which leaves wgpu's OpenGL backend out),
 * f16 cases cannot run: tests loop over {@linkcode WEIGHT_DTYPES} and a warning says that f16
 * was skipped (CI installs lavapipe, which has it).
 */
export const HAS_F16: boolean = await (async () => {
  const adapter = await navigator.gpu?.requestAdapter();
  return adapter?.features.has("shader-f16") ?? false;
})();

/** Weight / KV dtypes the kernel tests cover on this adapter. */
export const WEIGHT_DTYPES: readonly ("f32" | "f16")[] = HAS_F16 ? ["f32", "f16"] : ["f32"];

if (!HAS_F16) {
  console.warn("warning: the WebGPU adapter lacks shader-f16: f16 kernel cases are NOT tested");
}
