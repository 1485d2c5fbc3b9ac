/**
 * `rope`: rotary position embedding (rotate-half convention of GPT-NeoX and Hugging Face
 * Llama / Qwen), applied in place to the q and k heads of the fused qkv activations. See
 * `rope.wgsl` for the formula, precision, bindings and grid.
 *
 * The frequencies are computed on the host ({@linkcode ropeInvFreq}, or any `rope_scaling`
 * variant such as llama3's) and uploaded once; the kernel only forms `position * inv_freq`.
 * `head_dim` need not equal `hidden / heads` (Qwen3-0.6B: head_dim 128, hidden 1024, 16 heads).
 *
 * @module
 */

import source from "./rope.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena, ParamSlot } from "../gpu/params.ts";
import { dispatch1d, groupsFor } from "./dispatch.ts";

/**
 * The standard RoPE inverse frequencies `inv_freq[i] = theta^(-2 i / rotaryDim)` for
 * `i < rotaryDim / 2`, computed in float64 and rounded to f32 (upload as the `invFreq` buffer).
 *
 * @param headDim elements per head (must be even).
 * @param theta the base, `rope_theta` in Hugging Face configs (e.g. 1e6 for Qwen3).
 * @param rotaryDim rotated elements per head (partial rotary); default `headDim`.
 */
export function ropeInvFreq(
  headDim: number,
  theta: number,
  rotaryDim = headDim,
): Float32Array<ArrayBuffer> {
  if (!Number.isInteger(rotaryDim) || rotaryDim < 2 || rotaryDim % 2 !== 0 || rotaryDim > headDim) {
    throw new RangeError(
      `Cannot compute RoPE frequencies: rotary dim ${rotaryDim} must be even and at most head dim ${headDim}`,
    );
  }
  if (!(theta > 1)) throw new RangeError(`Cannot compute RoPE frequencies: theta ${theta} <= 1`);
  const out = new Float32Array(rotaryDim / 2);
  for (let i = 0; i < out.length; i++) out[i] = Math.pow(theta, (-2 * i) / rotaryDim);
  return out;
}

/** Buffers of one `rope` call site; fixed for the op's lifetime. */
export interface RopeBuffers {
  /** f32 activations rotated in place, e.g. the fused `[tokens, (Hq + 2 Hkv) * head_dim]` qkv. */
  readonly qkv: GPUBufferBinding;
  /** u32 `[tokens]`: the position of each token (any values, e.g. a chunk starting at 37). */
  readonly positions: GPUBufferBinding;
  /** f32 `[rotaryDim / 2]`: inverse frequencies, see {@linkcode ropeInvFreq}. */
  readonly invFreq: GPUBufferBinding;
}

/**
 * Head addressing: head `h` of token `t` starts at element
 * `offset + t * tokenStride + h * headDim` of `qkv`.
 */
export interface RopeLayout {
  /** Heads rotated per token: `Hq + Hkv` for the fused qkv layout (q heads then k heads). */
  readonly heads: number;
  /** Elements per head (even). */
  readonly headDim: number;
  /** Elements from one token's row to the next: `(Hq + 2 Hkv) * headDim` for fused qkv. */
  readonly tokenStride: number;
  /** Elements before token 0's first head. Default 0. */
  readonly offset?: number;
  /** Rotated elements per head (partial rotary), even, <= headDim. Default `headDim`. */
  readonly rotaryDim?: number;
}

/** The compiled `rope` pipeline; {@linkcode Rope.bind} makes call sites. */
export class Rope {
  readonly #ctx: GpuContext;
  readonly #pipeline: GPUComputePipeline;

  constructor(ctx: GpuContext) {
    this.#ctx = ctx;
    this.#pipeline = ctx.pipeline("rope", () => source);
  }

  /**
   * Creates a call site: its bind group and parameter slot are made once, here.
   *
   * @throws {RangeError} on an invalid layout or an `invFreq` buffer shorter than `rotaryDim / 2`.
   */
  bind(arena: ParamArena, buffers: RopeBuffers, layout: RopeLayout): RopeOp {
    const { heads, headDim, tokenStride } = layout;
    const offset = layout.offset ?? 0;
    const rotaryDim = layout.rotaryDim ?? headDim;
    if (
      !Number.isInteger(heads) || heads < 1 || !Number.isInteger(headDim) || headDim < 2 ||
      !Number.isInteger(rotaryDim) || rotaryDim < 2 || rotaryDim % 2 !== 0 || rotaryDim > headDim
    ) {
      throw new RangeError(
        `Cannot bind rope: invalid layout (heads ${heads}, head dim ${headDim}, rotary dim ${rotaryDim})`,
      );
    }
    if (!Number.isInteger(tokenStride) || tokenStride < heads * headDim) {
      throw new RangeError(
        `Cannot bind rope: token stride ${tokenStride} is less than ${heads} heads x ${headDim}`,
      );
    }
    const freqs = capacity(buffers.invFreq);
    if (freqs < rotaryDim / 2) {
      throw new RangeError(
        `Cannot bind rope: invFreq holds ${freqs} values, rotary dim ${rotaryDim} needs ${
          rotaryDim / 2
        }`,
      );
    }
    const slot = arena.allocate();
    const bindGroup = this.#ctx.device.createBindGroup({
      label: "rope",
      layout: this.#pipeline.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: slot.binding },
        { binding: 1, resource: buffers.positions },
        { binding: 2, resource: buffers.invFreq },
        { binding: 3, resource: buffers.qkv },
      ],
    });
    return new RopeOp(this.#pipeline, bindGroup, slot, {
      heads,
      headDim,
      half: rotaryDim / 2,
      tokenStride,
      offset,
      qkvCapacity: capacity(buffers.qkv),
      positionsCapacity: capacity(buffers.positions),
    });
  }
}

interface BoundRope {
  readonly heads: number;
  readonly headDim: number;
  readonly half: number;
  readonly tokenStride: number;
  readonly offset: number;
  readonly qkvCapacity: number;
  readonly positionsCapacity: number;
}

/** One `rope` call site. */
export class RopeOp {
  constructor(
    private readonly pipeline: GPUComputePipeline,
    private readonly bindGroup: GPUBindGroup,
    private readonly slot: ParamSlot,
    private readonly layout: BoundRope,
  ) {}

  /**
   * Encodes the rotation of the heads of `tokens` tokens (`tokens` 0 encodes nothing).
   *
   * @throws {RangeError} when the heads of `tokens` tokens exceed `qkv` or `positions` holds
   *   fewer than `tokens` values.
   */
  encode(pass: GPUComputePassEncoder, tokens: number): void {
    const { heads, headDim, half, tokenStride, offset } = this.layout;
    if (tokens <= 0) return;
    const end = offset + (tokens - 1) * tokenStride + heads * headDim;
    if (end > this.layout.qkvCapacity || tokens > this.layout.positionsCapacity) {
      throw new RangeError(
        `Cannot encode rope for ${tokens} tokens: heads end at element ${end} of ${this.layout.qkvCapacity}, positions hold ${this.layout.positionsCapacity}`,
      );
    }
    this.slot.setU32(0, tokens, heads, headDim, half, tokenStride, offset);
    pass.setPipeline(this.pipeline);
    pass.setBindGroup(0, this.bindGroup);
    dispatch1d(pass, groupsFor(tokens * half, 256));
  }
}

/** 4-byte elements a binding covers. */
function capacity(b: GPUBufferBinding): number {
  return Math.floor((b.size ?? b.buffer.size - (b.offset ?? 0)) / 4);
}
