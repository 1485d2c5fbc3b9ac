/**
 * `token_feed`: builds a step's input token ids on the GPU, mixing ids written by the host with
 * ids sampled in the previous step, so decoding never waits for a readback. See
 * `token_feed.wgsl` for bindings and grid.
 *
 * @module
 */

import source from "./token_feed.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import { CallSite } from "./call_site.ts";
import { groupsFor } from "./dispatch.ts";

/** Bit 31 of a host id: "take the id sampled for sequence `id & 0x7fffffff`". */
export const FROM_SAMPLED = 0x80000000;

/** The host id that refers to the token sampled for sequence `seq` in the previous step. */
export function sampledRef(seq: number): number {
  if (!Number.isInteger(seq) || seq < 0 || seq > 0x7fffffff) {
    throw new RangeError(`Cannot refer to sampled token of sequence ${seq}`);
  }
  return (FROM_SAMPLED | seq) >>> 0;
}

/** Buffers of one `token_feed` call site; fixed for the op's lifetime. */
export interface TokenFeedBuffers {
  /** u32 `[tokens]`: token ids, or {@linkcode sampledRef}(s) for sequence s's sampled token. */
  readonly hostIds: GPUBufferBinding;
  /** u32 `[numSampled]`: the previous step's `sample` output `tokens`. */
  readonly sampled: GPUBufferBinding;
  /** u32 `[tokens]`: the resolved input ids (output). */
  readonly ids: GPUBufferBinding;
}

/** The compiled `token_feed` pipeline; {@linkcode TokenFeed.bind} makes call sites. */
export class TokenFeed {
  readonly #ctx: GpuContext;
  readonly #pipeline: GPUComputePipeline;

  constructor(ctx: GpuContext) {
    this.#ctx = ctx;
    this.#pipeline = ctx.pipeline("token_feed", () => source);
  }

  /** Creates a call site: its bind group and parameter slot are made once, here. */
  bind(arena: ParamArena, buffers: TokenFeedBuffers): TokenFeedOp {
    return new TokenFeedOp(
      new CallSite(this.#ctx, arena, this.#pipeline, "token_feed", [
        buffers.hostIds,
        buffers.sampled,
        buffers.ids,
      ]),
    );
  }
}

/** One `token_feed` call site. */
export class TokenFeedOp {
  constructor(private readonly site: CallSite) {}

  /** Encodes the resolution of `tokens` input ids. */
  encode(pass: GPUComputePassEncoder, tokens: number): void {
    this.site.slot.setU32(0, tokens);
    this.site.dispatch(pass, groupsFor(tokens, 64));
  }
}
