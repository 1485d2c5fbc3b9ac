/**
 * `sample`: picks the next token of every sequence on the GPU from its logits, greedy or random
 * with temperature / min-p / top-k / top-p, and returns the raw log-probability of the pick.
 * A row with a `target` is scored instead (forced mode, for prompt logprobs): it returns the
 * target's rank and raw log-probability. See `sample.wgsl` for the exact rules, bindings and grid.
 *
 * Per-sequence parameters live in a storage buffer of {@linkcode SAMPLE_PARAMS_BYTES}-byte
 * records, packed on the host with {@linkcode packSampleParams}:
 *
 * | byte | field         | type | meaning                                          |
 * | ---- | ------------- | ---- | ------------------------------------------------ |
 * | 0    | `temperature` | f32  | `<= 0`: greedy (argmax, lowest index on ties)    |
 * | 4    | `top_k`       | u32  | `0`: off                                         |
 * | 8    | `top_p`       | f32  | `1`: off; in (0, 1]                              |
 * | 12   | `min_p`       | f32  | `0`: off; in [0, 1]                              |
 * | 16   | `seed`        | u32  | random stream of the request                     |
 * | 20   | `counter`     | u32  | draw index in the stream (e.g. output position)  |
 * | 24   | `target`      | u32  | `0xFFFFFFFF`: sample; else the forced token id   |
 *
 * Forced mode (`target` set): no draw, and temperature, top-k, top-p, min-p, seed and counter
 * are ignored. The row's token output is the rank of the target, `1 + #{i : l_i > l[target]}`
 * (strictly greater: ties do not count, so the argmax has rank 1), and its logprob output is
 * `l[target] - logsumexp(l)` (raw log-softmax, as for a sampled token; `-inf` when `l[target]`
 * is `-inf`). A target `>= vocab` gives rank 0 and logprob `-inf`: callers must keep
 * `target < vocab`, which the packer cannot check.
 *
 * The same logits, seed and counter always give the same token.
 *
 * @module
 */

import source from "./sample.wgsl" with { type: "text" };
import { logitRowSource } from "./logit_row.ts";
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import { CallSite } from "./call_site.ts";

/** Bytes of one sequence's record in the `params` buffer (7 words). */
export const SAMPLE_PARAMS_BYTES = 28;

/** The `target` word of a record that samples (no forced token). */
const NO_TARGET = 0xffffffff;

/** Sampling parameters of one sequence (host side; see the module doc for the GPU layout). */
export interface SampleParams {
  /** Softmax temperature; `0` (the default) means greedy. */
  temperature?: number;
  /** Keep the `topK` largest logits (ties at the k-th value all kept); `0` (default) = off. */
  topK?: number;
  /** Keep the smallest top set of probability mass `>= topP`; in (0, 1], default 1 = off. */
  topP?: number;
  /** Keep tokens with probability `>= minP * max probability`; in [0, 1], default 0 = off. */
  minP?: number;
  /** u32 seed of the sequence's random stream; default 0. */
  seed?: number;
  /** u32 draw index (e.g. the output position); default 0. */
  counter?: number;
  /**
   * Forced (scoring) mode: the token id, in [0, 0xFFFFFFFE] and `< vocab`, whose rank and
   * logprob the row returns instead of a draw (the other fields are then ignored); default
   * undefined = sample.
   */
  target?: number;
}

function checkU32(name: string, value: number, index: number): number {
  if (!Number.isInteger(value) || value < 0 || value > 0xffffffff) {
    throw new RangeError(`Cannot pack sampling parameters: sequence ${index} has ${name} ${value}`);
  }
  return value;
}

/**
 * Throws a RangeError unless `p` packs (sequence `index` in the message): a finite temperature
 * `>= 0`, `topP` in (0, 1], `minP` in [0, 1], u32 `topK`, `seed` and `counter`, and a `target`,
 * when given, that is an integer in [0, 0xFFFFFFFE] (`target < vocab` is the caller's to check).
 * The packer applies it to every sequence; the WebGPU executor applies it to one request before a
 * step, so that a bad request fails alone.
 */
export function checkSampleParams(p: SampleParams, index = 0): void {
  const temperature = p.temperature ?? 0;
  const topP = p.topP ?? 1;
  const minP = p.minP ?? 0;
  if (!Number.isFinite(temperature) || temperature < 0) {
    throw new RangeError(
      `Cannot pack sampling parameters: sequence ${index} has temperature ${temperature}`,
    );
  }
  if (!(topP > 0 && topP <= 1)) {
    throw new RangeError(`Cannot pack sampling parameters: sequence ${index} has topP ${topP}`);
  }
  if (!(minP >= 0 && minP <= 1)) {
    throw new RangeError(`Cannot pack sampling parameters: sequence ${index} has minP ${minP}`);
  }
  checkU32("topK", p.topK ?? 0, index);
  checkU32("seed", p.seed ?? 0, index);
  checkU32("counter", p.counter ?? 0, index);
  const target = p.target;
  if (target !== undefined && !(Number.isInteger(target) && target >= 0 && target < NO_TARGET)) {
    throw new RangeError(`Cannot pack sampling parameters: sequence ${index} has target ${target}`);
  }
}

/**
 * Packs one record per sequence into `out` (or a new buffer) in the layout of the module doc.
 *
 * @throws {RangeError} on a value outside its range (e.g. `topP` 0, a fractional `topK`).
 */
export function packSampleParams(
  params: readonly SampleParams[],
  out: ArrayBuffer = new ArrayBuffer(params.length * SAMPLE_PARAMS_BYTES),
): ArrayBuffer {
  if (out.byteLength < params.length * SAMPLE_PARAMS_BYTES) {
    throw new RangeError(
      `Cannot pack sampling parameters: ${params.length} sequences need ${
        params.length * SAMPLE_PARAMS_BYTES
      } bytes, the buffer has ${out.byteLength}`,
    );
  }
  const f32 = new Float32Array(out);
  const u32 = new Uint32Array(out);
  params.forEach((p, s) => {
    checkSampleParams(p, s);
    const w = (s * SAMPLE_PARAMS_BYTES) / 4;
    f32[w] = p.temperature ?? 0;
    u32[w + 1] = p.topK ?? 0;
    f32[w + 2] = p.topP ?? 1;
    f32[w + 3] = p.minP ?? 0;
    u32[w + 4] = p.seed ?? 0;
    u32[w + 5] = p.counter ?? 0;
    u32[w + 6] = p.target ?? NO_TARGET;
  });
  return out;
}

/** Buffers of one `sample` call site; fixed for the op's lifetime. */
export interface SampleBuffers {
  /** f32 `[numSeqs, vocab]` (row stride `vocab`): the logits. Must not contain NaN. */
  readonly logits: GPUBufferBinding;
  /**
   * `[row0 + numSeqs]` records of {@linkcode SAMPLE_PARAMS_BYTES} bytes
   * ({@linkcode packSampleParams}).
   */
  readonly params: GPUBufferBinding;
  /**
   * u32 `[row0 + numSeqs]`: the chosen token ids; for a forced row, the target's rank (output).
   */
  readonly tokens: GPUBufferBinding;
  /**
   * f32 `[row0 + numSeqs]`: log-softmax of the raw logits at the chosen / target token (output).
   */
  readonly logprobs: GPUBufferBinding;
}

/** Compile-time shape of the `sample` kernel; see {@linkcode sampleVariantFor}. */
export interface SampleVariant {
  /** Invocations per workgroup (one workgroup per sequence): a power of two in [8, 256]. */
  readonly workgroup: number;
  /** Buckets per radix-search pass: a power of two in [2, 256]; `workgroup * buckets <= 2048`. */
  readonly buckets: number;
}

/**
 * The variant used on `ctx`'s adapter. On a CPU adapter (measured on lavapipe, 2 cores, with
 * bench/sample_bench.ts `SAMPLE_SWEEP=1`): 16 invocations (barriers cost little) and 128 buckets
 * (fewer passes over the row). On a GPU (not yet measured): 128 invocations to stream the row
 * and 16 buckets so the per-thread histograms fit workgroup memory.
 */
export function sampleVariantFor(ctx: GpuContext): SampleVariant {
  return ctx.isCpuProfile ? { workgroup: 16, buckets: 128 } : { workgroup: 128, buckets: 16 };
}

/** Workgroup memory of a variant in bytes (histograms, candidate list, reductions). */
export function sampleWorkgroupBytes(variant: SampleVariant): number {
  return 8 * variant.workgroup * variant.buckets + 8 * 1024 + 16 * variant.workgroup + 128;
}

const isPow2 = (n: number) => Number.isInteger(n) && n > 0 && (n & (n - 1)) === 0;

/** The compiled `sample` pipeline; {@linkcode Sample.bind} makes call sites. */
export class Sample {
  /** The compile-time shape in use. */
  readonly variant: SampleVariant;
  readonly #ctx: GpuContext;
  readonly #pipeline: GPUComputePipeline;

  /** @param variant overrides {@linkcode sampleVariantFor} (tests and benchmarks). */
  constructor(ctx: GpuContext, variant: SampleVariant = sampleVariantFor(ctx)) {
    const { workgroup, buckets } = variant;
    if (
      !isPow2(workgroup) || workgroup < 8 || workgroup > 256 || !isPow2(buckets) ||
      buckets < 2 || buckets > 256 || workgroup * buckets > 2048
    ) {
      throw new RangeError(
        `Cannot compile sample: workgroup ${workgroup} and buckets ${buckets} must be powers of ` +
          "two with workgroup in [8, 256], buckets in [2, 256] and workgroup * buckets <= 2048",
      );
    }
    const bytes = sampleWorkgroupBytes(variant);
    if (bytes > ctx.limits.maxComputeWorkgroupStorageSize) {
      throw new RangeError(
        `Cannot compile sample: workgroup ${workgroup} x buckets ${buckets} needs ${bytes} bytes ` +
          `of workgroup memory, the device allows ${ctx.limits.maxComputeWorkgroupStorageSize}`,
      );
    }
    this.variant = variant;
    this.#ctx = ctx;
    const prelude = `const WG: u32 = ${workgroup}u;\nconst NB: u32 = ${buckets}u;\n` +
      `const NB_LOG2: u32 = ${Math.log2(buckets)}u;\n`;
    this.#pipeline = ctx.pipeline(
      `sample/wg${workgroup}/nb${buckets}`,
      () => prelude + logitRowSource(source),
    );
  }

  /** Creates a call site: its bind group and parameter slot are made once, here. */
  bind(arena: ParamArena, buffers: SampleBuffers): SampleOp {
    return new SampleOp(
      new CallSite(this.#ctx, arena, this.#pipeline, "sample", [
        buffers.logits,
        buffers.params,
        buffers.tokens,
        buffers.logprobs,
      ]),
    );
  }
}

/** One `sample` call site. */
export class SampleOp {
  constructor(private readonly site: CallSite) {}

  /**
   * Encodes the sampling of `numSeqs` rows of `vocab` logits (one workgroup per row): logits
   * row s with record `row0 + s`, into tokens / logprobs `row0 + s` (`row0` > 0: a later
   * sub-batch of a step's rows, its logits computed into rows 0.. of the same buffer).
   *
   * @throws {RangeError} when `vocab` is 0, `numSeqs * vocab` exceeds 2^32 elements or `row0`
   *   is not a non-negative integer.
   */
  encode(pass: GPUComputePassEncoder, numSeqs: number, vocab: number, row0 = 0): void {
    if (!Number.isInteger(vocab) || vocab < 1 || numSeqs * vocab > 0xffffffff) {
      throw new RangeError(`Cannot sample ${numSeqs} rows of ${vocab} logits`);
    }
    if (!Number.isInteger(row0) || row0 < 0) {
      throw new RangeError(`Cannot sample from row ${row0}`);
    }
    this.site.slot.setU32(0, numSeqs, vocab, row0);
    this.site.dispatch(pass, numSeqs);
  }
}
