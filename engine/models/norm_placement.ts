/**
 * Where the Llama-family decoder's RMSNorms run (engine/models/decoder.ts), per kernel profile:
 *
 * - a dispatch of their own (`rms_norm`, the residual add fused: `h += delta; x = rms(h)`),
 *   before a plain projection;
 * - inside the projection after them (the gpu profile: matmul X forms `rms` / `rms_residual`,
 *   the residual stream alternating between two buffers);
 * - split between the projections around them (the cpu profile, where both run `unrolled`): o
 *   and down add their output to the stream and write `h * gamma` with the stream's partial sums
 *   of squares (matmul Y form `residual_rms`), gate/up and the next qkv scale by the norm's
 *   factor from those sums (X form `rms_partials`). Lavapipe pays ~30 us or more per dispatch
 *   whatever its work (kernels/matmul_unrolled_residual.wgsl), so this leaves one rms_norm
 *   dispatch per step (layer 0's input norm) instead of two per layer; the decoder binds it
 *   beside the first way and runs it in steps of few tokens only (decoder.ts
 *   `SPLIT_NORM_MAX_TOKENS`), where the dispatches it saves outweigh the residual epilogue's
 *   extra stores.
 *
 * @module
 */

import type { GpuMatrix } from "../../gpu/tensor.ts";
import type { BindTargets } from "./bind_targets.ts";

/** A bound call site. */
export type Op = { encode(pass: GPUComputePassEncoder, n: number): void };

const b = (buffer: GPUBuffer) => ({ buffer });

/**
 * Where a layer's residual stream is: the buffer its first norm reads, and, where the
 * projections read the norm (`fused`), the buffer its norms alternate with (the stream is in
 * `bufs.hidden` or `bufs.normed`; see the module doc).
 */
export interface Stream {
  readonly fused: boolean;
  /** The buffer holding the stream before the layer's first norm. */
  readonly at: GPUBuffer;
  readonly other: GPUBuffer;
}

/**
 * Whether `producer` (o or down) can end its sub-layer with the residual epilogue that the norm
 * before `consumer` (gate/up or the next qkv, with a bias or not) then needs no dispatch for:
 * the cpu profile's `unrolled` kernel on both (see the module doc).
 */
export function splitsNorm(
  t: BindTargets,
  stream: Stream,
  producer: GpuMatrix,
  consumer: { weight: GpuMatrix; bias: GPUBuffer | null },
): boolean {
  const { kernels } = t;
  return !stream.fused && kernels.matmul(false).writesResidualNorm(producer) &&
    kernels.matmul(consumer.bias !== null).readsRowNorm(consumer.weight);
}

/**
 * Binds the projection that ends a sub-layer (o, down): into `bufs.delta`, or with `nextNorm`
 * (where {@linkcode splitsNorm}) adding into the stream and writing that norm's input.
 */
export function bindSubLayerOut(
  t: BindTargets,
  stream: Stream,
  x: { buffer: GPUBuffer; form: "plain" | "swiglu" },
  weight: GpuMatrix,
  nextNorm: GpuMatrix | null,
): Op {
  const { kernels, arena, bufs } = t;
  const out = nextNorm === null ? { y: b(bufs.delta) } : {
    y: b(stream.at),
    residual: { weight: nextNorm, normed: b(bufs.normed), partials: b(bufs.normPartials) },
  };
  return kernels.matmul(false).bind(arena, { x: b(x.buffer), xForm: x.form, weight, ...out });
}

/**
 * Binds a norm followed by a projection: one rms_norm and a plain matmul, or one fused matmul,
 * or (`fromPartials`: the projection before wrote the norm's input) one matmul scaling by the
 * norm's factor.
 */
export function bindNormed(
  t: BindTargets,
  stream: Stream,
  norm: { weight: GpuMatrix; eps: number; addDelta: boolean },
  projection: { weight: GpuMatrix; bias?: GPUBuffer | null; y: GPUBuffer },
  fromPartials = false,
): { norm: Op | null; projection: Op } {
  const { kernels, arena, bufs } = t;
  const hasBias = projection.bias !== undefined && projection.bias !== null;
  const matmul = kernels.matmul(hasBias);
  const tail = {
    weight: projection.weight,
    ...(hasBias ? { bias: b(projection.bias!) } : {}),
    y: b(projection.y),
  };
  if (fromPartials) {
    const rowNorm = { eps: norm.eps, partials: b(bufs.normPartials) };
    const op = matmul.bind(arena, { x: b(bufs.normed), xForm: "rms_partials", rowNorm, ...tail });
    return { norm: null, projection: op };
  }
  if (stream.fused) {
    const op = matmul.bind(arena, {
      x: b(stream.at),
      ...(norm.addDelta
        ? {
          xForm: "rms_residual",
          norm: { weight: norm.weight, eps: norm.eps, delta: b(bufs.delta), out: b(stream.other) },
        }
        : { xForm: "rms", norm: { weight: norm.weight, eps: norm.eps } }),
      ...tail,
    });
    return { norm: null, projection: op };
  }
  const rms = kernels.rmsNorm.bind(
    arena,
    norm.addDelta
      ? { weight: norm.weight, x: b(bufs.delta), residual: b(stream.at), out: b(bufs.normed) }
      : { weight: norm.weight, x: b(stream.at), out: b(bufs.normed) },
    { eps: norm.eps },
  );
  return { norm: rms, projection: matmul.bind(arena, { x: b(bufs.normed), ...tail }) };
}

/** The stream after a norm that adds delta: fused norms write it to the other buffer. */
export function advance(stream: Stream): Stream {
  return stream.fused ? { fused: true, at: stream.other, other: stream.at } : stream;
}

/**
 * Where a layer's norms are split between the projections around them (see
 * {@linkcode splitsNorm}): `input`, the previous layer's down writes this layer's input norm's
 * input; `post`, o writes the post-attention norm's.
 */
export interface NormSplit {
  readonly input: boolean;
  readonly post: boolean;
}
