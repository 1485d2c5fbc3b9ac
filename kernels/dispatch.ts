/**
 * Dispatch-grid helpers shared by the kernel wrappers.
 *
 * WebGPU caps each grid dimension at `maxComputeWorkgroupsPerDimension` (65535 by default), so a
 * 1-D problem of more workgroups is folded into a 2-D grid `(x, y)`; kernels recover the linear
 * workgroup index as `wid.x + wid.y * nwg.x` and skip indices past the end.
 *
 * @module
 */

/** Largest workgroup count per grid dimension WebGPU guarantees. */
export const MAX_GROUPS_PER_DIM = 65535;

/** Number of workgroups of `size` invocations covering `count` items. */
export function groupsFor(count: number, size: number): number {
  return Math.ceil(count / size);
}

/** Dispatches `groups` workgroups as a 1-D grid folded into 2-D when needed (no-op if 0). */
export function dispatch1d(pass: GPUComputePassEncoder, groups: number): void {
  if (groups <= 0) return;
  if (groups <= MAX_GROUPS_PER_DIM) {
    pass.dispatchWorkgroups(groups);
  } else {
    const y = Math.ceil(groups / MAX_GROUPS_PER_DIM);
    pass.dispatchWorkgroups(Math.ceil(groups / y), y);
  }
}

/**
 * The arithmetic one encode of a call site does and the bytes it must read: the matmuls' weights,
 * the decode attention's K and V rows (each once).
 */
export interface KernelWork {
  /** Floating-point operations (a multiply-add counts 2). */
  readonly flops: number;
  /** Bytes of weights, or of K and V rows, read (each once). */
  readonly bytes: number;
}

/**
 * A pass that accounts the work encoded into it: benchmarks' recording passes
 * (engine/models/kernel_group_recorder.ts) implement it to print rooflines; a plain
 * `GPUComputePassEncoder` does not, and {@linkcode noteWork} then does nothing.
 */
export interface WorkCountingPass {
  noteWork(work: KernelWork): void;
}

/**
 * Tells `pass` the work just encoded into it (`flops`, `bytes` as in {@linkcode KernelWork}),
 * when it counts work; nothing is allocated when it does not (every step's encode calls this).
 */
export function noteWork(pass: GPUComputePassEncoder, flops: number, bytes: number): void {
  const counting = pass as Partial<WorkCountingPass>;
  if (counting.noteWork !== undefined) counting.noteWork({ flops, bytes });
}
