// rms_norm: RMSNorm of Llama / Qwen, ROWS_PER_WG rows per workgroup.
//   y[j] = x[j] / sqrt(mean(x^2) + eps) * w[j],  j in [0, cols)
// Rows are addressed per (token t, head h), r = t * heads + h:
//   row r starts at element  offset + t * token_stride + h * cols
// so one kernel serves the hidden-state norm (heads = 1, token_stride = cols, offset = 0) and
// Qwen3's per-head q/k norm on the fused qkv buffer (heads = Hq or Hkv, cols = head_dim,
// token_stride = qkv width, offset = start of the q or k block), where the weight [head_dim] is
// shared by all heads and columns outside the addressed rows are never touched.
// x, residual and y all use this addressing.
//
// Variants, by the prelude the TS wrapper (kernels/rms_norm.ts) prepends; the prelude declares
// bindings 2..5, the accessors `source_token`, `first_read`, `reread`, `out_start`, `store_out`,
// the shape constants ROW_THREADS and ROWS_PER_WG (see Workgroup) and norm_rows.wgsl (row_sum,
// the reduction across a row's lanes, and its workgroup memory):
//   plain:         x read;                     y = norm(x) * w   -> out
//   in place:      x read_write (also y);      x = norm(x) * w
//   fused add:     x read, residual rw;        residual += x; out = norm(residual) * w
//   fused in place: x rw, residual rw;         residual += x; x = norm(residual) * w
//   gathered add:  x, residual read, indices;  out row t = norm(residual + x at token
//                  indices[t]) * w, out dense [tokens * heads, cols]; residual untouched
// (the fused forms are vLLM's fused_add_rms_norm: the residual add saves a pass; the gathered
// one is a model's last residual add, the gather of its sampled rows and the final norm in one
// pass). Weights are WT (f16 or f32, from weightPrelude), converted to f32; sums are f32.
//
// Access width, also from the prelude: VW elements per load and store, `XV` the activation type
// (f32 or vec4<f32>), `WV` the weight's (WT or WT4) and `sq(v)` the sum of squares of one XV.
// VW = 4 when cols, offset and token_stride are multiples of 4 (every hidden and head width of
// the supported models): lavapipe runs each storage access as a loop over its SIMD lanes, and one
// 16-byte access costs about a third of four 4-byte ones (bench/load_width.ts). Indices below
// (the accessors' i, base, dst, c) count XV units; Params count f32 elements.
//
// Bindings (group 0):
//   0 p        : uniform                              Params
//   1 w        : storage read                         array<WV>   [cols / VW]
//   2 x        : storage read (rw in place)           array<XV>   rows addressed as above
//   3 residual : storage rw (fused variants; read     array<XV>   same addressing as x
//                only when gathered)
//   4 out      : storage rw (out-of-place variants)   array<XV>   same addressing as x (gathered:
//                                                                 dense rows)
//   5 indices  : storage read (gathered only)         array<u32>  [tokens] source token of row t
// Workgroup: ROW_THREADS * ROWS_PER_WG invocations (prelude constants, powers of two): each of
//            ROWS_PER_WG rows gets ROW_THREADS invocations, lane l handling XV units
//            l, l + ROW_THREADS, ... of the row; lane 0 adds the partial sums (two barriers). With
//            ROW_THREADS = 1 (the choice on CPU adapters, where barriers and many small
//            workgroups are expensive) each invocation owns a whole row and there is no barrier.
// Dispatch:  ceil(tokens * heads / ROWS_PER_WG) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d).

struct Params {
  rows: u32,
  heads: u32,
  cols: u32,
  token_stride: u32,
  offset: u32,
  eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<WV>;

// row_lane, row_sum and their workgroup memory: norm_rows.wgsl (prepended).

@compute @workgroup_size(ROW_THREADS * ROWS_PER_WG)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let at = row_lane(wid, nwg, lid);
  let lane = at.lane;
  // No early return: with ROW_THREADS > 1 every invocation must reach the barriers.
  let in_range = at.row < p.rows;
  var base = 0u;
  var sum_sq = 0.0;
  let units = p.cols / VW;
  if (in_range) {
    let t = at.row / p.heads;
    base = (p.offset + source_token(t) * p.token_stride + (at.row - t * p.heads) * p.cols) / VW;
    for (var c = lane; c < units; c += ROW_THREADS) {
      sum_sq += sq(first_read(base + c));
    }
  }
  let scale = inverseSqrt(row_sum(sum_sq, at) / f32(p.cols) + p.eps);
  if (in_range) {
    let dst = out_start(at.row, base);
    for (var c = lane; c < units; c += ROW_THREADS) {
      store_out(dst + c, reread(base + c) * scale * XV(w[c]));
    }
  }
}
