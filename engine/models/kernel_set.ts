/**
 * Every kernel a forward pass uses, compiled once per model runner. Matmul pipelines depend on
 * the weight dtype and on whether a bias is added, so they are kept per variant.
 *
 * @module
 */

import type { GpuContext } from "../../gpu/context.ts";
import type { DType } from "../../gpu/dtype.ts";
import { Add } from "../../kernels/add.ts";
import { Embedding } from "../../kernels/embedding.ts";
import { GatherRows } from "../../kernels/gather_rows.ts";
import { GeluNew } from "../../kernels/gelu_new.ts";
import { LayerNorm } from "../../kernels/layer_norm.ts";
import { Matmul } from "../../kernels/matmul.ts";
import { RmsNorm } from "../../kernels/rms_norm.ts";
import { RopeAndCache } from "../../kernels/rope_and_cache.ts";
import { Sample } from "../../kernels/sample.ts";
import { TokenFeed } from "../../kernels/token_feed.ts";
import { TokenMask } from "../../kernels/token_mask.ts";

/** The kernels shared by every layer of a model. */
export class KernelSet {
  readonly ctx: GpuContext;
  readonly dtype: DType;
  readonly add: Add;
  readonly embedding: Embedding;
  readonly gatherRows: GatherRows;
  readonly geluNew: GeluNew;
  readonly layerNorm: LayerNorm;
  readonly rmsNorm: RmsNorm;
  /** q/k head norm, RoPE and the K/V cache write of the RoPE architectures. */
  readonly ropeAndCache: RopeAndCache;
  readonly sample: Sample;
  readonly tokenFeed: TokenFeed;
  readonly tokenMask: TokenMask;
  readonly #matmul: Matmul;
  readonly #matmulBias: Matmul;

  constructor(ctx: GpuContext, dtype: DType) {
    this.ctx = ctx;
    this.dtype = dtype;
    this.add = new Add(ctx);
    this.embedding = new Embedding(ctx);
    this.gatherRows = new GatherRows(ctx);
    this.geluNew = new GeluNew(ctx);
    this.layerNorm = new LayerNorm(ctx);
    this.rmsNorm = new RmsNorm(ctx);
    this.ropeAndCache = new RopeAndCache(ctx);
    this.sample = new Sample(ctx);
    this.tokenFeed = new TokenFeed(ctx);
    this.tokenMask = new TokenMask(ctx);
    this.#matmul = new Matmul(ctx, { dtype, bias: false });
    this.#matmulBias = new Matmul(ctx, { dtype, bias: true });
  }

  /** Both matmuls (without and with a bias): every matmul call site is bound to one of them. */
  get matmuls(): readonly Matmul[] {
    return [this.#matmul, this.#matmulBias];
  }

  /** The matmul for weights of this set's dtype, with or without a bias. */
  matmul(bias: boolean): Matmul {
    return bias ? this.#matmulBias : this.#matmul;
  }
}
