/**
 * The host swap space of the WebGPU executor: a bounded host-memory pool (slot i holds one block
 * of every layer, K then V) and the copies of preemption by swap. A swap-out's copies are
 * submitted ahead of every later step (queue order keeps the blocks intact until copied) and
 * read back in the background, so a swap-out never waits for Deno's ~10 ms readback; only a
 * swap-in of bytes still on their way waits for them ({@linkcode SwapSpace.ready}).
 *
 * @module
 */

import type { GpuContext } from "../../gpu/context.ts";
import type { SchedulerOutput } from "../../scheduler/scheduler_output.ts";
import { blockBytesPerLayer, type KvCache } from "../kv_cache.ts";

/** A swap-out on its way to host memory (identity marks the slots it still owns). */
interface Landing {
  readonly done: Promise<void>;
}

/** See the module documentation. */
export class SwapSpace {
  readonly #ctx: GpuContext;
  readonly #kv: KvCache;
  /** Host swap pool, or null without swap space. */
  readonly #pool: Uint8Array<ArrayBuffer> | null;
  /** Host slot -> the swap-out whose bytes are still on their way into it. */
  readonly #landing = new Map<number, Landing>();
  /** Bytes of one block of one layer's K (or V). */
  readonly #blockBytes: number;

  /** @param numSwapBlocks host slots (blocks); 0 for none. */
  constructor(ctx: GpuContext, kv: KvCache, numSwapBlocks: number) {
    this.#ctx = ctx;
    this.#kv = kv;
    this.#blockBytes = blockBytesPerLayer(kv.shape);
    const slotBytes = 2 * kv.shape.numLayers * this.#blockBytes;
    this.#pool = numSwapBlocks > 0 ? new Uint8Array(numSwapBlocks * slotBytes) : null;
  }

  /** A promise to await before a step that swaps in blocks still on their way; else undefined. */
  ready(output: SchedulerOutput): Promise<void> | undefined {
    const waits = new Set<Promise<void>>();
    for (const r of output.swappedIn) {
      for (const c of r.copies) {
        const landing = this.#landing.get(c.hostSlot);
        if (landing !== undefined) waits.add(landing.done);
      }
    }
    return waits.size === 0 ? undefined : Promise.all(waits).then(() => {});
  }

  /**
   * Performs `output`'s swap copies: swap-outs first (submitted before the swap-ins' writes,
   * which may reuse the same GPU blocks), then swap-ins.
   *
   * @throws {RangeError} when `output` swaps in a block whose swap-out has not reached host
   *   memory (await {@linkcode ready} first), or moves blocks without swap space.
   */
  copy(output: SchedulerOutput): void {
    // Swap-ins read the host pool now: every block they read must have landed there. Checked
    // before this step's own swap-outs claim their host slots.
    for (const r of output.swappedIn) {
      for (const c of r.copies) {
        if (this.#landing.has(c.hostSlot)) {
          throw new RangeError(
            `Cannot swap in request "${r.requestId}": host slot ${c.hostSlot} is still on its ` +
              `way from the GPU (await swapInReady() first)`,
          );
        }
      }
    }
    if (output.swappedOut.length > 0) this.#swapOut(output);
    if (output.swappedIn.length > 0) this.#swapIn(output);
  }

  /**
   * Copies swapped-out blocks into a staging buffer (submitted now, so before any later step
   * can overwrite them) and into the host pool once the buffer is mapped, in the background:
   * the next step is not held back. Until then the host slots are in `#landing`.
   */
  #swapOut(output: SchedulerOutput): void {
    const pool = this.#pool;
    if (pool === null) throw new RangeError("Cannot swap out: no swap space (--swap-space 0)");
    const ctx = this.#ctx;
    const kv = this.#kv;
    const b = this.#blockBytes;
    const copies = output.swappedOut.flatMap((r) => r.copies);
    const perBlock = 2 * kv.shape.numLayers * b;
    const staging = ctx.createBuffer(
      "swap-out",
      copies.length * perBlock,
      GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    );
    const encoder = ctx.device.createCommandEncoder({ label: "swap-out" });
    copies.forEach((c, i) => {
      for (let l = 0; l < kv.shape.numLayers; l++) {
        const dst = i * perBlock + 2 * l * b;
        encoder.copyBufferToBuffer(kv.k[l]!, c.gpuBlock * b, staging, dst, b);
        encoder.copyBufferToBuffer(kv.v[l]!, c.gpuBlock * b, staging, dst + b, b);
      }
    });
    ctx.device.queue.submit([encoder.finish()]);
    const landing: Landing = {
      done: staging.mapAsync(GPUMapMode.READ).then(() => {
        const bytes = new Uint8Array(staging.getMappedRange());
        copies.forEach((c, i) => {
          // A slot claimed again since (its request aborted, the slot reused) is not ours.
          if (this.#landing.get(c.hostSlot) !== landing) return;
          pool.set(bytes.subarray(i * perBlock, (i + 1) * perBlock), c.hostSlot * perBlock);
          this.#landing.delete(c.hostSlot);
        });
        staging.unmap();
      }).finally(() => staging.destroy()),
    };
    // Awaited by swapInReady when a swap-in needs these slots; a failed copy stays in
    // `#landing`, so such a swap-in fails instead of reading stale bytes.
    landing.done.catch(() => {});
    for (const c of copies) this.#landing.set(c.hostSlot, landing);
  }

  /** Writes swapped-in blocks from the host pool into the KV cache (ordered before the step). */
  #swapIn(output: SchedulerOutput): void {
    const pool = this.#pool;
    if (pool === null) throw new RangeError("Cannot swap in: no swap space (--swap-space 0)");
    const kv = this.#kv;
    const b = this.#blockBytes;
    const perBlock = 2 * kv.shape.numLayers * b;
    const queue = this.#ctx.device.queue;
    for (const r of output.swappedIn) {
      for (const c of r.copies) {
        for (let l = 0; l < kv.shape.numLayers; l++) {
          const src = c.hostSlot * perBlock + 2 * l * b;
          queue.writeBuffer(kv.k[l]!, c.gpuBlock * b, pool, src, b);
          queue.writeBuffer(kv.v[l]!, c.gpuBlock * b, pool, src + b, b);
        }
      }
    }
  }
}
