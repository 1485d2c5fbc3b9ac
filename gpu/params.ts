/**
 * Per-dispatch scalars (sizes, offsets, epsilons) for a whole forward step, kept in ONE uniform
 * buffer and uploaded with ONE `writeBuffer` per step.
 *
 * Every bound kernel instance owns a 256-byte slot (the WebGPU uniform offset alignment) for its
 * lifetime; its bind group points at that slot, so bind groups are created once. Before encoding
 * a step the caller writes each slot's fields, then {@linkcode ParamArena.flush} uploads the
 * written range. Two dispatches in one submission that need different values use two slots.
 *
 * @module
 */

import type { GpuContext } from "./context.ts";

/** Bytes per slot: the minimum uniform buffer offset alignment WebGPU guarantees. */
export const PARAM_SLOT_BYTES = 256;

/** A 256-byte region of the arena: 64 words viewed as u32, i32 and f32. */
export class ParamSlot {
  /** Byte offset of the slot in the arena's buffer. */
  readonly offset: number;
  readonly u32: Uint32Array;
  readonly i32: Int32Array;
  readonly f32: Float32Array;
  readonly #arena: ParamArena;

  constructor(arena: ParamArena, offset: number, bytes: ArrayBuffer) {
    this.#arena = arena;
    this.offset = offset;
    this.u32 = new Uint32Array(bytes, offset, PARAM_SLOT_BYTES / 4);
    this.i32 = new Int32Array(bytes, offset, PARAM_SLOT_BYTES / 4);
    this.f32 = new Float32Array(bytes, offset, PARAM_SLOT_BYTES / 4);
  }

  /** The binding resource for this slot (binding type `uniform`). */
  get binding(): GPUBufferBinding {
    return { buffer: this.#arena.buffer, offset: this.offset, size: PARAM_SLOT_BYTES };
  }

  /**
   * Writes u32 words starting at word `index`; marks the slot dirty when a word changed (a
   * decode step mostly rewrites the values of the step before: only changed slots are uploaded).
   */
  setU32(index: number, ...values: number[]): this {
    const words = this.u32;
    let changed = false;
    for (let i = 0; i < values.length; i++) {
      const v = values[i]! >>> 0;
      if (words[index + i] !== v) {
        words[index + i] = v;
        changed = true;
      }
    }
    if (changed) this.#arena.markDirty(this.offset);
    return this;
  }

  /** Writes f32 words starting at word `index`; marks the slot dirty when a word changed. */
  setF32(index: number, ...values: number[]): this {
    const words = this.f32;
    let changed = false;
    for (let i = 0; i < values.length; i++) {
      const v = Math.fround(values[i]!);
      // Object.is: -0 vs 0 and NaN are changes and no changes as the bits say.
      if (!Object.is(words[index + i], v)) {
        words[index + i] = v;
        changed = true;
      }
    }
    if (changed) this.#arena.markDirty(this.offset);
    return this;
  }
}

/** A growable-by-construction pool of {@linkcode ParamSlot}s backed by one uniform buffer. */
export class ParamArena {
  readonly buffer: GPUBuffer;
  readonly capacity: number;
  readonly #ctx: GpuContext;
  readonly #host: ArrayBuffer;
  #next = 0;
  #dirtyLo = Infinity;
  #dirtyHi = -Infinity;

  /** Creates an arena of `capacity` slots (default 4096 = 1 MiB). */
  constructor(ctx: GpuContext, capacity = 4096, label = "params") {
    this.#ctx = ctx;
    this.capacity = capacity;
    this.#host = new ArrayBuffer(capacity * PARAM_SLOT_BYTES);
    this.buffer = ctx.createBuffer(
      label,
      capacity * PARAM_SLOT_BYTES,
      GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    );
  }

  /** Hands out the next free slot; slots live as long as the arena. */
  allocate(): ParamSlot {
    if (this.#next >= this.capacity) {
      throw new RangeError(`Cannot allocate a parameter slot: all ${this.capacity} are in use`);
    }
    const slot = new ParamSlot(this, this.#next * PARAM_SLOT_BYTES, this.#host);
    this.#next++;
    return slot;
  }

  /** Slots handed out so far. */
  get used(): number {
    return this.#next;
  }

  /** @internal Records that the slot at `offset` changed. */
  markDirty(offset: number): void {
    if (offset < this.#dirtyLo) this.#dirtyLo = offset;
    if (offset + PARAM_SLOT_BYTES > this.#dirtyHi) this.#dirtyHi = offset + PARAM_SLOT_BYTES;
  }

  /** Uploads every slot written since the last flush in one `writeBuffer`. Call before submit. */
  flush(): void {
    if (this.#dirtyHi <= this.#dirtyLo) return;
    this.#ctx.device.queue.writeBuffer(
      this.buffer,
      this.#dirtyLo,
      this.#host,
      this.#dirtyLo,
      this.#dirtyHi - this.#dirtyLo,
    );
    this.#dirtyLo = Infinity;
    this.#dirtyHi = -Infinity;
  }

  /** Releases the uniform buffer. */
  destroy(): void {
    this.buffer.destroy();
  }
}
