/**
 * A FIFO over the integer ids 0..n-1 with O(1) push, pop and removal of any member (an
 * intrusive doubly linked list over typed arrays). Used for the block manager's free and
 * evictable queues.
 *
 * @module
 */

/** A FIFO over ids 0..n-1 with O(1) removal of any member (intrusive doubly linked list). */
export class IdQueue {
  readonly #prev: Int32Array;
  readonly #next: Int32Array;
  readonly #member: Uint8Array;
  #head = -1;
  #tail = -1;
  /** Number of queued ids. */
  size = 0;

  /** An empty queue for ids 0..n-1. */
  constructor(n: number) {
    this.#prev = new Int32Array(n);
    this.#next = new Int32Array(n);
    this.#member = new Uint8Array(n);
  }

  /** Whether `id` is queued. */
  has(id: number): boolean {
    return this.#member[id] === 1;
  }

  /** Appends `id` (which must not be queued). */
  pushBack(id: number): void {
    this.#member[id] = 1;
    this.#prev[id] = this.#tail;
    this.#next[id] = -1;
    if (this.#tail >= 0) this.#next[this.#tail] = id;
    else this.#head = id;
    this.#tail = id;
    this.size++;
  }

  /** Removes and returns the front id, or -1 when empty. */
  popFront(): number {
    const id = this.#head;
    if (id >= 0) this.remove(id);
    return id;
  }

  /** Removes queued `id`. */
  remove(id: number): void {
    const p = this.#prev[id]!;
    const n = this.#next[id]!;
    if (p >= 0) this.#next[p] = n;
    else this.#head = n;
    if (n >= 0) this.#prev[n] = p;
    else this.#tail = p;
    this.#member[id] = 0;
    this.size--;
  }

  /** Members front to back. */
  *[Symbol.iterator](): IterableIterator<number> {
    for (let id = this.#head; id >= 0; id = this.#next[id]!) yield id;
  }
}
