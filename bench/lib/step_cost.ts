/**
 * What one engine step costs the host: the number of compute dispatches it encodes, and the
 * time the calling thread spends preparing, encoding and submitting it, told apart from the time
 * it spends blocked inside WebGPU calls that may wait for the device (`queue.submit`,
 * `buffer.mapAsync`; lavapipe does a step's work inside them, a real GPU should not).
 *
 * The host part is split at `beginComputePass` and `finish` (see {@linkcode StepCost.phases}).
 *
 * Measured by wrapping those WebGPU methods on their prototypes for the duration of
 * {@linkcode StepCostProbe.measure} (benchmarks only; nothing in the engine is instrumented).
 *
 * @module
 */

/** Totals over the measured calls. */
export interface StepCost {
  /** Calls measured. */
  readonly calls: number;
  /** `dispatchWorkgroups` calls per measured call. */
  readonly dispatchesPerCall: number;
  /** Wall time per call outside the blocking WebGPU calls, ms: prepare + encode + submit. */
  readonly hostMsPerCall: number;
  /**
   * Where `hostMsPerCall` goes, ms per call: `prepare` up to `beginComputePass` (packing and
   * uploading the step's inputs), `encode` from there to `finish` (recording the dispatches),
   * `finish` inside `GPUCommandEncoder.finish` (wgpu validates and records the commands there),
   * `rest` the remainder (the readback's setup, `submit`'s own host part is in `submitMsPerCall`).
   */
  readonly phases: { prepare: number; encode: number; finish: number; rest: number };
  /** Time per call inside `queue.submit`, ms. */
  readonly submitMsPerCall: number;
  /** Time per call inside `buffer.mapAsync` (the call itself, not the wait for its promise), ms. */
  readonly mapAsyncMsPerCall: number;
}

type Method = (...args: never[]) => unknown;

/** The median of `xs` (the upper one of an even count). */
export function median(xs: readonly number[]): number {
  return [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
}

/** Wraps `proto[name]` so every call runs `around(original, args)`; returns the restorer. */
export function wrap(
  proto: object,
  name: string,
  around: (original: Method, self: unknown, args: never[]) => unknown,
): () => void {
  const original = Reflect.get(proto, name) as Method;
  Reflect.set(proto, name, function (this: unknown, ...args: never[]) {
    return around(original, this, args);
  });
  return () => Reflect.set(proto, name, original);
}

/** Accumulates {@linkcode StepCost} over the calls passed to {@linkcode StepCostProbe.measure}. */
export class StepCostProbe {
  #calls = 0;
  #dispatches = 0;
  #wallMs = 0;
  #submitMs = 0;
  #mapMs = 0;
  #prepareMs = 0;
  #encodeMs = 0;
  #finishMs = 0;

  /** Runs `fn` with the WebGPU methods wrapped, adding its cost to the totals. */
  measure<T>(fn: () => T): T {
    let dispatches = 0;
    let submitMs = 0;
    let mapMs = 0;
    let finishMs = 0;
    let passAt = NaN;
    let finishAt = NaN;
    const timed =
      (add: (ms: number) => void) => (original: Method, self: unknown, args: never[]) => {
        const t = performance.now();
        try {
          return original.apply(self, args);
        } finally {
          add(performance.now() - t);
        }
      };
    const restore = [
      wrap(GPUComputePassEncoder.prototype, "dispatchWorkgroups", (original, self, args) => {
        dispatches++;
        return original.apply(self, args);
      }),
      wrap(GPUCommandEncoder.prototype, "beginComputePass", (original, self, args) => {
        if (Number.isNaN(passAt)) passAt = performance.now();
        return original.apply(self, args);
      }),
      wrap(GPUCommandEncoder.prototype, "finish", (original, self, args) => {
        finishAt = performance.now();
        try {
          return original.apply(self, args);
        } finally {
          finishMs += performance.now() - finishAt;
        }
      }),
      wrap(GPUQueue.prototype, "submit", timed((ms) => (submitMs += ms))),
      wrap(GPUBuffer.prototype, "mapAsync", timed((ms) => (mapMs += ms))),
    ];
    const t0 = performance.now();
    try {
      return fn();
    } finally {
      const wall = performance.now() - t0;
      for (const r of restore) r();
      this.#calls++;
      this.#dispatches += dispatches;
      this.#wallMs += wall;
      this.#submitMs += submitMs;
      this.#mapMs += mapMs;
      this.#prepareMs += passAt - t0;
      this.#encodeMs += finishAt - passAt;
      this.#finishMs += finishMs;
    }
  }

  /** The per-call averages so far. */
  result(): StepCost {
    const n = Math.max(1, this.#calls);
    const host = (this.#wallMs - this.#submitMs - this.#mapMs) / n;
    const [prepare, encode, finish] = [this.#prepareMs / n, this.#encodeMs / n, this.#finishMs / n];
    return {
      calls: this.#calls,
      dispatchesPerCall: this.#dispatches / n,
      hostMsPerCall: host,
      phases: { prepare, encode, finish, rest: host - prepare - encode - finish },
      submitMsPerCall: this.#submitMs / n,
      mapAsyncMsPerCall: this.#mapMs / n,
    };
  }
}
