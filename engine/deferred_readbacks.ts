/**
 * The readbacks of overlapped steps that wait for a later submit (`StepOptions.overlap` in
 * engine/model_runner.ts), oldest first, and when they start: together, once as many wait as one
 * of them allows (its `readbackBatch`), or at {@linkcode DeferredReadbacks.startAll}.
 *
 * Deno's `mapAsync` waits, in the call, until the GPU has finished every submitted step, so the
 * first start of a batch leaves the GPU idle until the next submit and the others find their
 * steps done: batching them makes the GPU wait once per batch instead of once per step.
 *
 * @module
 */

/** A readback whose start is deferred. */
export interface DeferredReadback<T> {
  /** Resolves with the step's result once its readback has started and completed. */
  readonly result: Promise<T>;
  /** Whether the readback has started. */
  started(): boolean;
}

/** The deferred readbacks of one runner (see the module documentation). */
export class DeferredReadbacks {
  readonly #waiting: { start(): void; batch: number }[] = [];

  /** Readbacks waiting to start. */
  get length(): number {
    return this.#waiting.length;
  }

  /**
   * Defers `complete` (which starts a readback and resolves with its result) until as many
   * readbacks wait as `batch` (this one included), or until {@linkcode startAll}.
   */
  defer<T>(complete: () => Promise<T>, batch: number): DeferredReadback<T> {
    const result = Promise.withResolvers<T>();
    let started = false;
    this.#waiting.push({
      start() {
        started = true;
        complete().then(result.resolve, result.reject);
      },
      batch,
    });
    return { result: result.promise, started: () => started };
  }

  /** Whether some waiting readback allows no more to wait (its batch is reached). */
  get due(): boolean {
    const n = this.#waiting.length;
    return this.#waiting.some((d) => n >= d.batch);
  }

  /** Starts every waiting readback, oldest first. */
  startAll(): void {
    const waiting = this.#waiting.splice(0);
    for (const d of waiting) d.start();
  }
}
