/**
 * Pipelined readback. Deno resolves `mapAsync` by polling the device every ~10 ms, so one
 * blocking readback per decode step caps decoding at ~90 steps/s whatever the GPU does. Several
 * pending `mapAsync` calls resolve together, so the engine keeps several readbacks in flight:
 * each step copies its sampled token ids into a staging buffer taken from this ring, submits,
 * and moves on; the host reads the result when it arrives, steps later.
 *
 * @module
 */

import type { GpuContext } from "./context.ts";

/** A readback in flight: resolves with a copy of the bytes once the GPU has written them. */
export interface PendingReadback {
  /** Resolves with the bytes; the staging buffer is back in the ring by then. */
  readonly data: Promise<ArrayBuffer>;
}

/** A pool of MAP_READ staging buffers, each `slotBytes` large, reused round-robin. */
export class ReadbackRing {
  readonly slotBytes: number;
  readonly maxInFlight: number;
  readonly #ctx: GpuContext;
  readonly #free: GPUBuffer[] = [];
  readonly #all: GPUBuffer[] = [];
  #inFlight = 0;

  /**
   * @param slotBytes size of each staging buffer (a multiple of 4).
   * @param maxInFlight readbacks that may be pending at once; a further one throws.
   */
  constructor(ctx: GpuContext, slotBytes: number, maxInFlight = 8) {
    if (slotBytes <= 0 || slotBytes % 4 !== 0) {
      throw new RangeError(`Readback slot size must be a positive multiple of 4: got ${slotBytes}`);
    }
    this.#ctx = ctx;
    this.slotBytes = slotBytes;
    this.maxInFlight = maxInFlight;
  }

  /** Readbacks encoded and not yet resolved. */
  get inFlight(): number {
    return this.#inFlight;
  }

  /**
   * Encodes a copy of `size` bytes of `source` at `sourceOffset` into a free staging buffer and
   * returns a handle. Call {@linkcode ReadbackRing.start} on the handle AFTER submitting the
   * encoder (mapping before submission is invalid).
   */
  encode(
    encoder: GPUCommandEncoder,
    source: GPUBuffer,
    sourceOffset: number,
    size: number,
  ): EncodedReadback {
    if (size <= 0 || size > this.slotBytes || size % 4 !== 0) {
      throw new RangeError(
        `Cannot read back ${size} bytes: slots hold ${this.slotBytes} (multiples of 4)`,
      );
    }
    if (this.#inFlight >= this.maxInFlight) {
      throw new RangeError(
        `Cannot start a readback: ${this.#inFlight} of ${this.maxInFlight} already in flight`,
      );
    }
    let staging = this.#free.pop();
    if (staging === undefined) {
      staging = this.#ctx.createBuffer(
        `readback#${this.#all.length}`,
        this.slotBytes,
        GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      );
      this.#all.push(staging);
    }
    this.#inFlight++;
    encoder.copyBufferToBuffer(source, sourceOffset, staging, 0, size);
    return new EncodedReadback(staging, size, (buffer) => {
      this.#inFlight--;
      this.#free.push(buffer);
    });
  }

  /** Destroys every staging buffer (pending readbacks reject). */
  destroy(): void {
    for (const b of this.#all) b.destroy();
    this.#all.length = 0;
    this.#free.length = 0;
  }
}

/** A copy encoded into a staging buffer, waiting for its submission. */
export class EncodedReadback {
  readonly #staging: GPUBuffer;
  readonly #size: number;
  readonly #release: (buffer: GPUBuffer) => void;
  #started = false;

  constructor(staging: GPUBuffer, size: number, release: (buffer: GPUBuffer) => void) {
    this.#staging = staging;
    this.#size = size;
    this.#release = release;
  }

  /** Starts mapping (after `queue.submit`); the promise resolves with a copy of the bytes. */
  start(): PendingReadback {
    if (this.#started) throw new TypeError("Readback already started");
    this.#started = true;
    const data = this.#staging.mapAsync(GPUMapMode.READ, 0, this.#size).then(
      () => {
        const copy = this.#staging.getMappedRange(0, this.#size).slice(0);
        this.#staging.unmap();
        this.#release(this.#staging);
        return copy;
      },
      (error) => {
        this.#release(this.#staging);
        throw error;
      },
    );
    return { data };
  }
}

/**
 * Reads `size` bytes of `buffer` at `offset` with one blocking round trip (>= 10 ms in Deno).
 * For tests, tools and start-up, never for the per-token path.
 */
export async function readBuffer(
  ctx: GpuContext,
  buffer: GPUBuffer,
  offset = 0,
  size = buffer.size - offset,
): Promise<ArrayBuffer> {
  const staging = ctx.createBuffer(
    "readBuffer",
    size,
    GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  );
  try {
    const encoder = ctx.device.createCommandEncoder();
    encoder.copyBufferToBuffer(buffer, offset, staging, 0, size);
    ctx.device.queue.submit([encoder.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    return staging.getMappedRange().slice(0, size);
  } finally {
    staging.destroy();
  }
}
