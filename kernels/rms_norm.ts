/**
 * `rms_norm`: RMSNorm over f32 rows with an f16/f32 weight, in five variants chosen at bind time:
 * out of place, in place, vLLM's fused residual add (`residual += x; out = norm(residual)`), out
 * of place or in place, and the gathered add (`out[t] = norm(residual + x at token indices[t])`:
 * a model's last residual add, the gather of its sampled rows and its final norm in one pass).
 * Rows may be per-head slices of a wider buffer (Qwen3's q/k norm on the fused qkv buffer). See
 * `rms_norm.wgsl` for the addressing, bindings and grid.
 *
 * @module
 */

import source from "./rms_norm.wgsl" with { type: "text" };
import normRows from "./norm_rows.wgsl" with { type: "text" };
import type { GpuContext } from "../gpu/context.ts";
import { weightPrelude } from "../gpu/dtype.ts";
import type { ParamArena, ParamSlot } from "../gpu/params.ts";
import type { GpuMatrix } from "../gpu/tensor.ts";
import { f32Capacity } from "./call_site.ts";
import { dispatch1d, groupsFor } from "./dispatch.ts";

/**
 * Buffers of one `rms_norm` call site; fixed for the op's lifetime. `x`, `residual` and `out`
 * are all addressed with the row layout of {@linkcode RmsNormLayout}.
 */
export interface RmsNormBuffers {
  /** WT (f16 or f32) `[1, cols]`, one part: the per-column scale, shared by all heads. */
  readonly weight: GpuMatrix;
  /** f32 rows to normalise; also the output when `out` is omitted (in place). */
  readonly x: GPUBufferBinding;
  /**
   * f32 residual stream, same layout as `x`. When given, the op is the fused form:
   * `residual += x`, then the normalised residual is written to `out` (or `x`). Must not
   * overlap `x` or `out`.
   */
  readonly residual?: GPUBufferBinding;
  /** f32 output, same layout as `x`. Omit to write the result into `x` (in place). */
  readonly out?: GPUBufferBinding;
  /**
   * u32 `[tokens]`: with `residual` and `out`, the gathered form: row `t` of `out` (dense,
   * `[tokens * heads, cols]`) is the norm of `residual + x` at token `indices[t]`; `x` and
   * `residual` are only read. Each index must be below the tokens `x` and `residual` hold.
   */
  readonly indices?: GPUBufferBinding;
}

/**
 * Row addressing: row `(t, h)` covers elements `[start, start + cols)` with
 * `start = offset + t * tokenStride + h * cols`, `cols` being the weight's width. The default
 * (`heads` 1, `tokenStride` cols, `offset` 0) is a dense `[tokens, cols]` matrix.
 */
export interface RmsNormLayout {
  /** Rows per token, e.g. the number of q heads for Qwen3's q norm. Default 1. */
  readonly heads?: number;
  /** f32 elements from one token's first row to the next token's. Default `heads * cols`. */
  readonly tokenStride?: number;
  /** f32 elements before token 0's first row, e.g. `Hq * head_dim` for the k block. Default 0. */
  readonly offset?: number;
  /** Epsilon added to the mean square. Default 1e-6 (Qwen3, Llama 3 use 1e-6 / 1e-5). */
  readonly eps?: number;
}

/**
 * Workgroup shape of the row-reduction kernels (`rms_norm`, `layer_norm`): `rowThreads`
 * invocations cooperate on one row, `rowsPerWorkgroup` rows per workgroup; both powers of two,
 * product <= 256.
 */
export interface NormShape {
  /** Invocations per row; 1 means one invocation owns a row (no barriers). */
  readonly rowThreads?: number;
  /** Rows per workgroup. */
  readonly rowsPerWorkgroup?: number;
}

/**
 * The default {@linkcode NormShape} for this adapter. Measured on lavapipe (2 cores, 512 x 1024
 * and Qwen3's 12288 q/k head rows of 128, bench/elementwise_bench.ts): barriers and
 * per-workgroup overhead dominate there, so one invocation per row, 64 rows per workgroup (no
 * barrier) is best or tied (q/k norm 2.5-3x faster than 64 lanes per row; hidden rows within
 * noise of 8 lanes x 8 rows). On GPUs (not measured yet) 64 lanes per row gives coalesced loads.
 */
export function defaultNormShape(ctx: GpuContext): Required<NormShape> {
  return ctx.isCpuProfile
    ? { rowThreads: 1, rowsPerWorkgroup: 64 }
    : { rowThreads: 64, rowsPerWorkgroup: 1 };
}

/**
 * Validates `shape` (filling defaults) and returns its WGSL prelude (the shape constants and
 * `norm_rows.wgsl`, the row reduction both norm kernels use) and key suffix.
 */
export function normShapePrelude(
  ctx: GpuContext,
  kernel: string,
  shape: NormShape,
): { prelude: string; key: string; rowsPerWorkgroup: number } {
  const defaults = defaultNormShape(ctx);
  const t = shape.rowThreads ?? defaults.rowThreads;
  const r = shape.rowsPerWorkgroup ?? defaults.rowsPerWorkgroup;
  const pow2 = (n: number) => Number.isInteger(n) && n >= 1 && (n & (n - 1)) === 0;
  if (!pow2(t) || !pow2(r) || t * r > 256) {
    throw new RangeError(
      `${kernel}: rowThreads ${t} and rowsPerWorkgroup ${r} must be powers of two with product <= 256`,
    );
  }
  return {
    prelude: `const ROW_THREADS: u32 = ${t}u;\nconst ROWS_PER_WG: u32 = ${r}u;\n` + normRows,
    key: `t${t}r${r}`,
    rowsPerWorkgroup: r,
  };
}

type Variant = "plain" | "in_place" | "fused" | "fused_in_place" | "gathered";

/**
 * The access width (rms_norm.wgsl): 4 elements per load and store where every row starts on a
 * multiple of 4 and holds a multiple of 4 elements, else 1.
 */
const WIDTH_PRELUDE = {
  1: "const VW: u32 = 1u;\nalias XV = f32;\nalias WV = WT;\n" +
    "fn sq(v: f32) -> f32 { return v * v; }\n",
  4: "const VW: u32 = 4u;\nalias XV = vec4<f32>;\nalias WV = WT4;\n" +
    "fn sq(v: vec4<f32>) -> f32 { return dot(v, v); }\n",
} as const;

/** Rows read where they are written: token t's rows, at the same index. */
const SAME_ROWS = `fn source_token(t: u32) -> u32 { return t; }
fn out_start(row: u32, read_start: u32) -> u32 { return read_start; }
`;

const ACCESSORS: Record<Variant, string> = {
  plain: SAME_ROWS + `@group(0) @binding(2) var<storage, read> x: array<XV>;
@group(0) @binding(4) var<storage, read_write> out: array<XV>;
fn first_read(i: u32) -> XV { return x[i]; }
fn reread(i: u32) -> XV { return x[i]; }
fn store_out(i: u32, v: XV) { out[i] = v; }
`,
  in_place: SAME_ROWS + `@group(0) @binding(2) var<storage, read_write> x: array<XV>;
fn first_read(i: u32) -> XV { return x[i]; }
fn reread(i: u32) -> XV { return x[i]; }
fn store_out(i: u32, v: XV) { x[i] = v; }
`,
  fused: SAME_ROWS + `@group(0) @binding(2) var<storage, read> x: array<XV>;
@group(0) @binding(3) var<storage, read_write> residual: array<XV>;
@group(0) @binding(4) var<storage, read_write> out: array<XV>;
fn first_read(i: u32) -> XV { let v = residual[i] + x[i]; residual[i] = v; return v; }
fn reread(i: u32) -> XV { return residual[i]; }
fn store_out(i: u32, v: XV) { out[i] = v; }
`,
  fused_in_place: SAME_ROWS + `@group(0) @binding(2) var<storage, read_write> x: array<XV>;
@group(0) @binding(3) var<storage, read_write> residual: array<XV>;
fn first_read(i: u32) -> XV { let v = residual[i] + x[i]; residual[i] = v; return v; }
fn reread(i: u32) -> XV { return residual[i]; }
fn store_out(i: u32, v: XV) { x[i] = v; }
`,
  gathered: `@group(0) @binding(2) var<storage, read> x: array<XV>;
@group(0) @binding(3) var<storage, read> residual: array<XV>;
@group(0) @binding(4) var<storage, read_write> out: array<XV>;
@group(0) @binding(5) var<storage, read> indices: array<u32>;
fn source_token(t: u32) -> u32 { return indices[t]; }
fn out_start(row: u32, read_start: u32) -> u32 { return row * (p.cols / VW); }
fn first_read(i: u32) -> XV { return residual[i] + x[i]; }
fn reread(i: u32) -> XV { return residual[i] + x[i]; }
fn store_out(i: u32, v: XV) { out[i] = v; }
`,
};

/** The `rms_norm` kernel; {@linkcode RmsNorm.bind} makes call sites. */
export class RmsNorm {
  readonly #ctx: GpuContext;
  readonly #shape: { prelude: string; key: string; rowsPerWorkgroup: number };

  /**
   * Pipelines are compiled through `ctx.pipeline` on the first bind of each variant and weight
   * dtype (once per context), never per step.
   *
   * @param shape workgroup shape; default {@linkcode defaultNormShape} for the adapter.
   */
  constructor(ctx: GpuContext, shape: NormShape = {}) {
    this.#ctx = ctx;
    this.#shape = normShapePrelude(ctx, "rms_norm", shape);
  }

  /**
   * Creates a call site: its bind group and parameter slot are made once, here.
   *
   * @throws {TypeError} when the weight is not a single-part `[1, cols]` matrix.
   * @throws {RangeError} when the layout is invalid (rows of one token overlapping).
   */
  bind(arena: ParamArena, buffers: RmsNormBuffers, layout: RmsNormLayout = {}): RmsNormOp {
    const { weight } = buffers;
    if (weight.rows !== 1 || weight.parts.length !== 1) {
      throw new TypeError(
        `Cannot bind rms_norm: weight ${weight.label} must be one [1, cols] part, got [${weight.rows}, ${weight.cols}] in ${weight.parts.length} parts`,
      );
    }
    const cols = weight.cols;
    const heads = layout.heads ?? 1;
    const tokenStride = layout.tokenStride ?? heads * cols;
    const offset = layout.offset ?? 0;
    const eps = layout.eps ?? 1e-6;
    if (!Number.isInteger(heads) || heads < 1 || !Number.isInteger(offset) || offset < 0) {
      throw new RangeError(`Cannot bind rms_norm: invalid heads ${heads} or offset ${offset}`);
    }
    if (!Number.isInteger(tokenStride) || tokenStride < heads * cols) {
      throw new RangeError(
        `Cannot bind rms_norm: token stride ${tokenStride} is less than ${heads} heads x ${cols} columns`,
      );
    }
    const fused = buffers.residual !== undefined;
    const inPlace = buffers.out === undefined;
    if (buffers.indices !== undefined && (!fused || inPlace)) {
      throw new TypeError(
        "Cannot bind rms_norm: gathered rows (indices) need a residual and an out buffer",
      );
    }
    const variant: Variant = buffers.indices !== undefined
      ? "gathered"
      : fused
      ? (inPlace ? "fused_in_place" : "fused")
      : (inPlace ? "in_place" : "plain");
    const shape = this.#shape;
    const width = cols % 4 === 0 && offset % 4 === 0 && tokenStride % 4 === 0 ? 4 : 1;
    const pipeline = this.#ctx.pipeline(
      `rms_norm/${variant}/${weight.dtype}/${shape.key}/w${width}`,
      () =>
        weightPrelude(weight.dtype) + shape.prelude + WIDTH_PRELUDE[width] + ACCESSORS[variant] +
        source,
    );
    const slot = arena.allocate();
    const entries: GPUBindGroupEntry[] = [
      { binding: 0, resource: slot.binding },
      { binding: 1, resource: { buffer: weight.parts[0]!.buffer } },
      { binding: 2, resource: buffers.x },
    ];
    if (buffers.residual !== undefined) entries.push({ binding: 3, resource: buffers.residual });
    if (buffers.out !== undefined) entries.push({ binding: 4, resource: buffers.out });
    if (buffers.indices !== undefined) entries.push({ binding: 5, resource: buffers.indices });
    const bindGroup = this.#ctx.device.createBindGroup({
      label: `rms_norm/${variant}`,
      layout: pipeline.getBindGroupLayout(0),
      entries,
    });
    const capacity = Math.min(
      f32Capacity(buffers.x),
      buffers.residual === undefined ? Infinity : f32Capacity(buffers.residual),
      buffers.out === undefined ? Infinity : f32Capacity(buffers.out),
    );
    return new RmsNormOp(pipeline, bindGroup, slot, {
      heads,
      cols,
      tokenStride,
      offset,
      eps,
      capacity,
      indexCapacity: buffers.indices === undefined ? Infinity : f32Capacity(buffers.indices),
      rowsPerWorkgroup: shape.rowsPerWorkgroup,
    });
  }
}

interface BoundLayout {
  readonly heads: number;
  readonly cols: number;
  readonly tokenStride: number;
  readonly offset: number;
  readonly eps: number;
  /** f32 elements the smallest bound activation buffer holds. */
  readonly capacity: number;
  /** Tokens the indices binding holds (gathered form; Infinity otherwise). */
  readonly indexCapacity: number;
  readonly rowsPerWorkgroup: number;
}

/** One `rms_norm` call site. */
export class RmsNormOp {
  constructor(
    private readonly pipeline: GPUComputePipeline,
    private readonly bindGroup: GPUBindGroup,
    private readonly slot: ParamSlot,
    private readonly layout: BoundLayout,
  ) {}

  /**
   * Encodes the norm of `tokens * heads` rows (`tokens` 0 encodes nothing); in the gathered form
   * `tokens` is the number of gathered tokens.
   *
   * @throws {RangeError} when the rows of `tokens` tokens exceed a bound buffer.
   */
  encode(pass: GPUComputePassEncoder, tokens: number): void {
    const { heads, cols, tokenStride, offset, eps, capacity, rowsPerWorkgroup } = this.layout;
    if (tokens <= 0) return;
    const end = offset + (tokens - 1) * tokenStride + heads * cols;
    if (end > capacity || tokens > this.layout.indexCapacity) {
      throw new RangeError(
        `Cannot encode rms_norm for ${tokens} tokens: rows end at element ${end}, the bound buffers hold ${capacity}` +
          (Number.isFinite(this.layout.indexCapacity)
            ? ` and ${this.layout.indexCapacity} indices`
            : ""),
      );
    }
    this.slot.setU32(0, tokens * heads, heads, cols, tokenStride, offset).setF32(5, eps);
    pass.setPipeline(this.pipeline);
    pass.setBindGroup(0, this.bindGroup);
    dispatch1d(pass, groupsFor(tokens * heads, rowsPerWorkgroup));
  }
}
