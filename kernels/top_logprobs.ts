/**
 * `top_logprobs`: per row, the `n` (at most {@linkcode TOP_LOGPROBS_MAX}) most likely tokens and
 * their log-probabilities under the log-softmax of the logits, sorted by descending logprob,
 * ties by ascending token id. See `top_logprobs.wgsl` for bindings and grid.
 *
 * vLLM returns logprobs of the raw model distribution by default, so the engine encodes this
 * kernel on the RAW logits, before `logits_process` (which changes the logits in place) and
 * before sampling; the sampled token's own logprob comes from `sample`.
 *
 * @module
 */

import source from "./top_logprobs.wgsl" with { type: "text" };
import { logitRowSource } from "./logit_row.ts";
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena, ParamSlot } from "../gpu/params.ts";
import { dispatch1d } from "./dispatch.ts";

/** Largest `top_logprobs` per row (OpenAI's limit). */
export const TOP_LOGPROBS_MAX = 20;

/**
 * Packs the per-row counts (0 = the row asked for no logprobs) into `out` (or a new array).
 *
 * @throws {RangeError} on a count that is not an integer in [0, {@linkcode TOP_LOGPROBS_MAX}].
 */
export function packTopLogprobCounts(
  counts: readonly number[],
  out: Uint32Array<ArrayBuffer> = new Uint32Array(counts.length),
): Uint32Array<ArrayBuffer> {
  if (out.length < counts.length) {
    throw new RangeError(
      `Cannot pack top-logprob counts: ${counts.length} rows, the array has ${out.length}`,
    );
  }
  counts.forEach((n, s) => {
    if (!Number.isInteger(n) || n < 0 || n > TOP_LOGPROBS_MAX) {
      throw new RangeError(
        `Cannot pack top-logprob counts: row ${s} asks for ${n} (0 to ${TOP_LOGPROBS_MAX})`,
      );
    }
    out[s] = n;
  });
  return out;
}

/** Buffers of one `top_logprobs` call site; fixed for the op's lifetime. */
export interface TopLogprobsBuffers {
  /** f32 `[numSeqs, vocab]` (row stride `vocab`): the raw logits. Must not contain NaN. */
  readonly logits: GPUBufferBinding;
  /**
   * u32 `[row0 + numSeqs]`: tokens wanted per row, 0 to {@linkcode TOP_LOGPROBS_MAX}; 0 = skip.
   */
  readonly counts: GPUBufferBinding;
  /** u32 `[row0 + numSeqs, k]` (row stride `k`): token ids, best first (output). */
  readonly ids: GPUBufferBinding;
  /** f32 `[row0 + numSeqs, k]` (row stride `k`): their log-probabilities (output). */
  readonly logprobs: GPUBufferBinding;
}

/**
 * Invocations per workgroup on `ctx`'s adapter: 16 on a CPU adapter (lavapipe, 2 cores, batch
 * 32 x 151936, n 20, bench/logits_process_bench.ts: 12.8 ms at 16, 13.9 at 32, 16.0 at 64, 17.0
 * at 128), 128 on a GPU (not yet measured: more threads to stream the row).
 */
export function topLogprobsWorkgroupFor(ctx: GpuContext): number {
  return ctx.isCpuProfile ? 16 : 128;
}

/** The compiled `top_logprobs` pipeline; {@linkcode TopLogprobs.bind} makes call sites. */
export class TopLogprobs {
  /** Invocations per workgroup in use. */
  readonly workgroup: number;
  readonly #ctx: GpuContext;
  readonly #pipeline: GPUComputePipeline;

  /** @param workgroup overrides {@linkcode topLogprobsWorkgroupFor}: a power of two in [16, 128]. */
  constructor(ctx: GpuContext, workgroup: number = topLogprobsWorkgroupFor(ctx)) {
    if (
      !Number.isInteger(workgroup) || workgroup < 16 || workgroup > 128 ||
      (workgroup & (workgroup - 1)) !== 0
    ) {
      throw new RangeError(
        `Cannot compile top_logprobs: workgroup ${workgroup} must be a power of two in [16, 128]`,
      );
    }
    this.workgroup = workgroup;
    this.#ctx = ctx;
    this.#pipeline = ctx.pipeline(
      `top_logprobs/wg${workgroup}`,
      () => `const WG: u32 = ${workgroup}u;\n` + logitRowSource(source),
    );
  }

  /** Creates a call site: its bind group and parameter slot are made once, here. */
  bind(arena: ParamArena, buffers: TopLogprobsBuffers): TopLogprobsOp {
    const slot = arena.allocate();
    const bindGroup = this.#ctx.device.createBindGroup({
      label: "top_logprobs",
      layout: this.#pipeline.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: buffers.logits },
        { binding: 1, resource: buffers.counts },
        { binding: 2, resource: buffers.ids },
        { binding: 3, resource: buffers.logprobs },
        { binding: 4, resource: slot.binding },
      ],
    });
    return new TopLogprobsOp(this.#pipeline, bindGroup, slot);
  }
}

/** One `top_logprobs` call site. */
export class TopLogprobsOp {
  constructor(
    private readonly pipeline: GPUComputePipeline,
    private readonly bindGroup: GPUBindGroup,
    private readonly slot: ParamSlot,
  ) {}

  /**
   * Encodes the top-`counts[row0 + s]` search of `numSeqs` rows of `vocab` logits, writing
   * logits row s into `ids` / `logprobs` at `(row0 + s) * k` (entries past
   * `min(counts[row0 + s], k, vocab)` are not written; `row0` > 0: a later sub-batch of a step's
   * rows, its logits computed into rows 0.. of the same buffer).
   *
   * @throws {RangeError} when `vocab` is 0, `numSeqs * vocab` exceeds 2^32 elements, `k` is
   *   not in [1, {@linkcode TOP_LOGPROBS_MAX}], or `row0` is not a non-negative integer.
   */
  encode(
    pass: GPUComputePassEncoder,
    numSeqs: number,
    vocab: number,
    k: number,
    row0 = 0,
  ): void {
    if (!Number.isInteger(vocab) || vocab < 1 || numSeqs * vocab > 0xffffffff) {
      throw new RangeError(`Cannot find top logprobs of ${numSeqs} rows of ${vocab} logits`);
    }
    if (!Number.isInteger(k) || k < 1 || k > TOP_LOGPROBS_MAX) {
      throw new RangeError(
        `Cannot find top logprobs: row stride k is ${k}, must be 1 to ${TOP_LOGPROBS_MAX}`,
      );
    }
    if (!Number.isInteger(row0) || row0 < 0) {
      throw new RangeError(`Cannot find top logprobs from row ${row0}`);
    }
    this.slot.setU32(0, numSeqs, vocab, k, row0);
    pass.setPipeline(this.pipeline);
    pass.setBindGroup(0, this.bindGroup);
    dispatch1d(pass, numSeqs);
  }
}
