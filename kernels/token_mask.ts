/**
 * `token_mask`: gives the tokens a grammar forbids a logit of {@linkcode MASKED_LOGIT} in the
 * rows of constrained sequences (structured outputs). See `token_mask.wgsl` for bindings and grid.
 *
 * @module
 */

import source from "./token_mask.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import { CallSite } from "./call_site.ts";
import { groupsFor } from "./dispatch.ts";

/** The logit a masked token gets (finite: log-probabilities stay JSON numbers). */
export const MASKED_LOGIT = -1e30;

/** u32 words of an allowed-token bitmask over `vocab` tokens. */
export function maskWords(vocab: number): number {
  return Math.ceil(vocab / 32);
}

/** Buffers of one `token_mask` call site; fixed for the op's lifetime. */
export interface TokenMaskBuffers {
  /** f32 `[rows, vocab]`, masked in place. */
  readonly logits: GPUBufferBinding;
  /** u32 `[masked, words]`: allowed-token bitmasks (bit v % 32 of word v / 32). */
  readonly masks: GPUBufferBinding;
  /** u32 `[masked]`: the logits row of each mask. */
  readonly rows: GPUBufferBinding;
}

/** The compiled `token_mask` pipeline; {@linkcode TokenMask.bind} makes call sites. */
export class TokenMask {
  readonly #ctx: GpuContext;
  readonly #pipeline: GPUComputePipeline;

  constructor(ctx: GpuContext) {
    this.#ctx = ctx;
    this.#pipeline = ctx.pipeline("token_mask", () => source);
  }

  /** Creates a call site: its bind group and parameter slot are made once, here. */
  bind(arena: ParamArena, buffers: TokenMaskBuffers): TokenMaskOp {
    return new TokenMaskOp(
      new CallSite(this.#ctx, arena, this.#pipeline, "token_mask", [
        buffers.logits,
        buffers.masks,
        buffers.rows,
      ]),
    );
  }
}

/** One `token_mask` call site. */
export class TokenMaskOp {
  constructor(private readonly site: CallSite) {}

  /**
   * Encodes the masking of `masked` rows of `vocab` logits, masks of `words` u32 each
   * (`words >= ceil(vocab / 32)`).
   */
  encode(pass: GPUComputePassEncoder, masked: number, vocab: number, words: number): void {
    if (masked === 0) return;
    if (words < maskWords(vocab)) {
      throw new RangeError(`Cannot encode token_mask: ${words} words cannot cover ${vocab} tokens`);
    }
    this.site.slot.setU32(0, masked, vocab, words);
    this.site.dispatch(pass, masked * groupsFor(vocab, 256));
  }
}
