/**
 * GPU-side timing with `timestamp-query`, for benchmarks. Any host wait for the GPU costs
 * >= 10 ms in Deno, so host clocks around one dispatch measure the wait, not the kernel; the
 * timestamps written at the start and end of a compute pass measure the pass itself.
 *
 * @module
 */

import type { GpuContext } from "./context.ts";

/** Times compute passes: `passDescriptor(i)` for pass i, then `read()` after submission. */
export class GpuTimer {
  readonly capacity: number;
  readonly #querySet: GPUQuerySet;
  readonly #resolve: GPUBuffer;
  readonly #staging: GPUBuffer;

  /** @param capacity the number of passes that can be timed between two reads. */
  constructor(ctx: GpuContext, capacity = 64) {
    if (!ctx.hasTimestamps) {
      throw new TypeError("GpuTimer needs the timestamp-query feature, which this adapter lacks");
    }
    this.capacity = capacity;
    this.#querySet = ctx.device.createQuerySet({ type: "timestamp", count: capacity * 2 });
    const bytes = capacity * 2 * 8;
    this.#resolve = ctx.createBuffer(
      "timestamps",
      bytes,
      GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
    );
    this.#staging = ctx.createBuffer(
      "timestamps-read",
      bytes,
      GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    );
  }

  /** A compute pass descriptor that records the start and end time of pass `index`. */
  passDescriptor(index: number): GPUComputePassDescriptor {
    if (index < 0 || index >= this.capacity) {
      throw new RangeError(`Timer pass index ${index} out of range [0, ${this.capacity})`);
    }
    return {
      timestampWrites: {
        querySet: this.#querySet,
        beginningOfPassWriteIndex: index * 2,
        endOfPassWriteIndex: index * 2 + 1,
      },
    };
  }

  /** Encodes the resolve of the first `passes` timings; call once, at the end of the encoder. */
  resolve(encoder: GPUCommandEncoder, passes: number): void {
    encoder.resolveQuerySet(this.#querySet, 0, passes * 2, this.#resolve, 0);
    encoder.copyBufferToBuffer(this.#resolve, 0, this.#staging, 0, passes * 16);
  }

  /** After submission: the duration in milliseconds of each of the first `passes` passes. */
  async read(passes: number): Promise<number[]> {
    return (await this.readSpans(passes)).map((s) => s.end - s.start);
  }

  /**
   * After submission: the start and end of each of the first `passes` passes, in milliseconds
   * from the first one's start (the passes may come from several submissions: e.g. the idle
   * time between two steps is `spans[i + 1].start - spans[i].end`).
   */
  async readSpans(passes: number): Promise<{ start: number; end: number }[]> {
    await this.#staging.mapAsync(GPUMapMode.READ, 0, passes * 16);
    const t = new BigUint64Array(this.#staging.getMappedRange(0, passes * 16).slice(0));
    this.#staging.unmap();
    const t0 = t[0] ?? 0n;
    const ms = (v: bigint) => Number(v - t0) / 1e6;
    return Array.from({ length: passes }, (_, i) => ({
      start: ms(t[2 * i]!),
      end: ms(t[2 * i + 1]!),
    }));
  }

  /** Releases the query set and buffers. */
  destroy(): void {
    this.#querySet.destroy();
    this.#resolve.destroy();
    this.#staging.destroy();
  }
}
