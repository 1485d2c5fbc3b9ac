/**
 * A step's host-to-device writes gathered into ONE `queue.writeBuffer` and a copy per target.
 *
 * Each `queue.writeBuffer` costs the host far more than its bytes: Deno's WebGPU and wgpu set up
 * a staging allocation per call (10-80 us each on this project's 2-core machine, where a decode
 * step made 9 of them for its ids, positions, slots, block tables, lengths and sampling records:
 * ~0.24 ms of a ~1.2 ms host step; bench/model_bench.ts "host per step"). Here the step's arrays
 * are packed one after the other into a host buffer, uploaded in one call to a staging buffer on
 * the device, and copied from there to their targets by the step's own command encoder
 * (`copyBufferToBuffer`, ~3 us of host each), before the step's compute pass.
 *
 * Ordering: the copies run where {@linkcode StagedWrites.encode} records them, in the step's
 * command buffer, so what a step reads is what it staged. A `queue.writeBuffer` made directly
 * lands before the next submitted command buffer instead; do not write one target both ways in
 * one step.
 *
 * @module
 */

import type { GpuContext } from "./context.ts";

/** One pending copy: `size` bytes from `source` of the staging buffer to `target` + `offset`. */
interface PendingCopy {
  readonly target: GPUBuffer;
  readonly offset: number;
  readonly source: number;
  readonly size: number;
}

/** Host writes of one step, uploaded by {@linkcode StagedWrites.encode} (see the module doc). */
export class StagedWrites {
  readonly #ctx: GpuContext;
  readonly #label: string;
  #host: Uint8Array<ArrayBuffer>;
  #used = 0;
  #copies: PendingCopy[] = [];
  #buffer: GPUBuffer | null = null;

  /** Starts with `initialBytes` of staging (it grows as a step needs). */
  constructor(ctx: GpuContext, initialBytes = 64 << 10, label = "stagedWrites") {
    this.#ctx = ctx;
    this.#label = label;
    this.#host = new Uint8Array(Math.max(256, initialBytes));
  }

  /** Writes staged and not yet encoded. */
  get pending(): number {
    return this.#copies.length;
  }

  /** Bytes of the device staging buffer (0 before the first encode). */
  get stagingBytes(): number {
    return this.#buffer?.size ?? 0;
  }

  /**
   * Stages `count` elements of `data` (bytes of an `ArrayBuffer`; default all of it) for
   * `target` at byte `offset`; the values are copied now, so `data` may change after the call.
   *
   * @throws {RangeError} when the bytes or `offset` are not a multiple of 4 (what a buffer copy
   * needs), or when the write ends past `target`.
   */
  write(
    target: GPUBuffer,
    data: ArrayBufferView<ArrayBuffer> | ArrayBuffer,
    count?: number,
    offset = 0,
  ): void {
    const view = data instanceof ArrayBuffer ? new Uint8Array(data) : data;
    const per = "BYTES_PER_ELEMENT" in view ? Number(view.BYTES_PER_ELEMENT) : 1;
    const bytes = count === undefined ? view.byteLength : count * per;
    if (bytes % 4 !== 0 || offset % 4 !== 0 || bytes > view.byteLength) {
      throw new RangeError(
        `Cannot stage ${bytes} bytes at byte ${offset} of ${target.label}: sizes and offsets must be multiples of 4 and within the data (${view.byteLength} bytes)`,
      );
    }
    if (offset + bytes > target.size) {
      throw new RangeError(
        `Cannot stage ${bytes} bytes at byte ${offset} of ${target.label}: it holds ${target.size}`,
      );
    }
    if (bytes === 0) return;
    const at = this.#used;
    if (at + bytes > this.#host.length) {
      const grown = new Uint8Array(Math.max(2 * this.#host.length, at + bytes));
      grown.set(this.#host.subarray(0, at));
      this.#host = grown;
    }
    this.#host.set(new Uint8Array(view.buffer, view.byteOffset, bytes), at);
    this.#used = at + bytes;
    this.#copies.push({ target, offset, source: at, size: bytes });
  }

  /**
   * Uploads the staged bytes in one `queue.writeBuffer` and records their copies into `encoder`
   * (outside any pass), then starts over. Nothing happens when nothing is staged.
   */
  encode(encoder: GPUCommandEncoder): void {
    if (this.#copies.length === 0) return;
    const used = this.#used;
    if (this.#buffer === null || this.#buffer.size < used) {
      // The old buffer may still be read by a submitted step: WebGPU destroys it once that is done.
      this.#buffer?.destroy();
      const size = Math.ceil(Math.max(used, this.#host.length) / 256) * 256;
      this.#buffer = this.#ctx.createBuffer(
        this.#label,
        size,
        GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
      );
    }
    const staging = this.#buffer;
    this.#ctx.device.queue.writeBuffer(staging, 0, this.#host.buffer, 0, used);
    for (const c of this.#copies) {
      encoder.copyBufferToBuffer(staging, c.source, c.target, c.offset, c.size);
    }
    this.clear();
  }

  /** Drops what is staged (a step that failed before it was encoded). */
  clear(): void {
    this.#used = 0;
    this.#copies = [];
  }

  /** Releases the staging buffer. */
  destroy(): void {
    this.clear();
    this.#buffer?.destroy();
    this.#buffer = null;
  }
}
