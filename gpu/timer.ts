/**
 * GPU-side timing with `timestamp-query`, for benchmarks and kernel tuning. Any host wait for the GPU costs
 * >= 10 ms in Deno, so host clocks around one dispatch measure the wait, not the kernel; the
 * timestamps written at the start and end of a compute pass measure the pass itself.
 *
 * @module
 */

import type { GpuContext } from "./context.ts";
import type { ParamArena } from "./params.ts";

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

/** Median and minimum GPU time of one pass, in milliseconds. */
export interface PassTiming {
  readonly medianMs: number;
  readonly minMs: number;
  /** "timestamp-query" or "host clock / N passes". */
  readonly method: string;
}

/** Options for {@linkcode timePasses}. */
export interface TimePassesOptions {
  /** Arena whose parameters `encode` writes; flushed before each submission. */
  arena?: ParamArena;
  /** Untimed passes first (shader compilation happens on first use). Default 2. */
  warmup?: number;
  /** Timed passes. Default 10. */
  repeats?: number;
}

/**
 * Times `encode` (which records dispatches into the given pass). With `timestamp-query`, the
 * warm-up passes and then the repeats, each repeat one pass timed on the GPU, go in one
 * submission (one wait: any wait costs >= 10 ms in Deno); without it, the warm-up runs in its own
 * submission, then all repeats in one whose host time is divided by their number (then min ==
 * median).
 */
export async function timePasses(
  ctx: GpuContext,
  encode: (pass: GPUComputePassEncoder) => void,
  options: TimePassesOptions = {},
): Promise<PassTiming> {
  if (ctx.hasTimestamps) return (await timePassesEach(ctx, [encode], options))[0]!;
  const warmup = options.warmup ?? 2;
  const repeats = options.repeats ?? 10;
  /** Submits `passes` untimed passes and waits for them. */
  const run = async (passes: number) => {
    const encoder = ctx.device.createCommandEncoder();
    for (let i = 0; i < passes; i++) {
      const pass = encoder.beginComputePass();
      encode(pass);
      pass.end();
    }
    options.arena?.flush();
    ctx.device.queue.submit([encoder.finish()]);
    await ctx.device.queue.onSubmittedWorkDone();
  };
  if (warmup > 0) await run(warmup);
  ctx.check();
  const t0 = performance.now();
  await run(repeats);
  const ms = (performance.now() - t0) / repeats;
  return { medianMs: ms, minMs: ms, method: `host clock / ${repeats} passes` };
}

/** Most timed passes of one submission: WebGPU's largest query set holds 4,096 timestamps. */
export const MAX_TIMED_PASSES = 2048;

/**
 * Times each of `encodes` as {@linkcode timePasses} would, in as few submissions as the query
 * sets allow: with `timestamp-query`, candidate i's warm-up passes then its timed ones, one
 * candidate after the other, all in one submission and read back with one wait (a host wait
 * costs >= 10 ms in Deno, and the start-up kernel tuning of a Qwen3 model times ~1,500 kernel
 * and row-count candidates: >= 15 s of waits at one each); without it, one candidate at a time.
 */
export async function timePassesEach(
  ctx: GpuContext,
  encodes: readonly ((pass: GPUComputePassEncoder) => void)[],
  options: TimePassesOptions = {},
): Promise<PassTiming[]> {
  const warmup = options.warmup ?? 2;
  const repeats = options.repeats ?? 10;
  if (!ctx.hasTimestamps) {
    const out: PassTiming[] = [];
    for (const encode of encodes) out.push(await timePasses(ctx, encode, options));
    return out;
  }
  const per = Math.max(1, Math.floor(MAX_TIMED_PASSES / repeats));
  const out: PassTiming[] = [];
  for (let start = 0; start < encodes.length; start += per) {
    const chunk = encodes.slice(start, start + per);
    const timer = new GpuTimer(ctx, chunk.length * repeats);
    try {
      const encoder = ctx.device.createCommandEncoder();
      for (const [c, encode] of chunk.entries()) {
        for (let i = 0; i < warmup + repeats; i++) {
          const pass = encoder.beginComputePass(
            i < warmup ? undefined : timer.passDescriptor(c * repeats + i - warmup),
          );
          encode(pass);
          pass.end();
        }
      }
      timer.resolve(encoder, chunk.length * repeats);
      options.arena?.flush();
      ctx.device.queue.submit([encoder.finish()]);
      const ms = await timer.read(chunk.length * repeats);
      ctx.check();
      for (let c = 0; c < chunk.length; c++) {
        const own = ms.slice(c * repeats, (c + 1) * repeats).sort((a, b) => a - b);
        out.push({
          medianMs: own[Math.floor(own.length / 2)]!,
          minMs: own[0]!,
          method: "timestamp-query",
        });
      }
    } finally {
      timer.destroy();
    }
  }
  return out;
}

/**
 * Runs `fn` inside `validation`, `internal` and `out-of-memory` error scopes of `device`: its
 * value, or the first GPU error the scopes caught (which then reaches no `uncapturederror`
 * handler, so it does not fail the context). An exception `fn` throws is rethrown unless a GPU
 * error was caught.
 */
export async function withErrorScopes<T>(
  device: GPUDevice,
  fn: () => Promise<T>,
): Promise<{ readonly value: T } | { readonly error: GPUError }> {
  const filters: GPUErrorFilter[] = ["validation", "internal", "out-of-memory"];
  for (const f of filters) device.pushErrorScope(f);
  let result: { value: T } | { thrown: unknown };
  try {
    result = { value: await fn() };
  } catch (thrown) {
    result = { thrown };
  }
  let error: GPUError | null = null;
  for (const _ of filters) error = (await device.popErrorScope()) ?? error;
  if (error !== null) return { error };
  if ("thrown" in result) throw result.thrown;
  return result;
}

/**
 * Medians of {@linkcode timePasses} for kernel tuning: each measurement one untimed warm-up
 * pass and `repeats` timed ones, parameters flushed from `arena`; `method` is the last one's.
 * A candidate the adapter cannot run (a pipeline that fails to compile there, a dispatch it
 * refuses) measures Infinity and is named in `failures`, inside error scopes, so one candidate
 * never fails the context the tuning serves.
 */
export class PassClock {
  /** How the last measurement was timed ("timestamp-query", "host clock / N passes"). */
  method = "";
  /** The GPU errors of the candidates that measured Infinity, one line each (each once). */
  readonly failures: string[] = [];

  constructor(
    readonly ctx: GpuContext,
    readonly arena: ParamArena,
    readonly repeats = 5,
  ) {}

  /**
   * The median time of one pass of the encoder `setup` returns (`setup` may compile: it runs
   * inside the error scopes too), in ms; Infinity when the GPU reported an error.
   */
  async medianMs(setup: () => (pass: GPUComputePassEncoder) => void): Promise<number> {
    const r = await withErrorScopes(this.ctx.device, () =>
      timePasses(this.ctx, setup(), {
        arena: this.arena,
        warmup: 1,
        repeats: this.repeats,
      }));
    if ("error" in r) {
      this.#fail(r.error);
      return Infinity;
    }
    this.method = r.value.method;
    return r.value.medianMs;
  }

  /**
   * {@linkcode PassClock.medianMs} of each of `setups`, in their order, timed together
   * ({@linkcode timePassesEach}: one wait for all of them). Each setup runs (and compiles)
   * inside error scopes of its own, so a candidate the adapter cannot build measures Infinity
   * alone; when the GPU reports an error for the submission of the others, each of them is timed
   * alone instead ({@linkcode PassClock.medianMs}), so again only the culprit measures Infinity.
   * The encoders must not share parameter slots that they write differently (each is encoded
   * once per pass of one submission).
   */
  async medianMsEach(
    setups: readonly (() => (pass: GPUComputePassEncoder) => void)[],
  ): Promise<number[]> {
    const out = setups.map(() => Infinity);
    const ready: { index: number; encode: (pass: GPUComputePassEncoder) => void }[] = [];
    for (const [index, setup] of setups.entries()) {
      const r = await withErrorScopes(this.ctx.device, () => Promise.resolve(setup()));
      if ("error" in r) this.#fail(r.error);
      else ready.push({ index, encode: r.value });
    }
    if (ready.length === 0) return out;
    const r = await withErrorScopes(
      this.ctx.device,
      () =>
        timePassesEach(this.ctx, ready.map((c) => c.encode), {
          arena: this.arena,
          warmup: 1,
          repeats: this.repeats,
        }),
    );
    if ("error" in r) {
      for (const c of ready) out[c.index] = await this.medianMs(() => c.encode);
      return out;
    }
    for (const [k, c] of ready.entries()) {
      out[c.index] = r.value[k]!.medianMs;
      this.method = r.value[k]!.method;
    }
    return out;
  }

  /** Records a candidate's GPU error (each message once). */
  #fail(error: GPUError): void {
    const line = error.message.split("\n")[0]!;
    if (!this.failures.includes(line)) this.failures.push(line);
  }
}
