// layer_norm: LayerNorm with weight and bias (GPT-2, eps 1e-5), ROWS_PER_WG rows per workgroup.
//   y[t, j] = (x[t, j] - mean_t) / sqrt(var_t + eps) * w[j] + b[j],  j in [0, cols)
// mean and the (biased) variance are computed in two passes over the row in f32:
// mean = sum(x) / cols, var = sum((x - mean)^2) / cols. Weights are WT (f16 or f32, from
// weightPrelude), converted to f32. The prelude (kernels/layer_norm.ts) also defines the shape
// constants ROW_THREADS and ROWS_PER_WG (see Workgroup) and norm_rows.wgsl (row_sum, the
// reduction across a row's lanes, and its workgroup memory).
//
// Bindings (group 0):
//   0 p   : uniform       Params
//   1 w   : storage read  array<WT>   [cols]
//   2 b   : storage read  array<WT>   [cols]
//   3 x   : storage read  array<f32>  [rows, cols]
//   4 out : storage rw    array<f32>  [rows, cols]
// Workgroup: ROW_THREADS * ROWS_PER_WG invocations (powers of two): each of ROWS_PER_WG rows
//            gets ROW_THREADS invocations, lane l handling columns l, l + ROW_THREADS, ...;
//            partial sums meet in workgroup memory (two barriers per reduction, one between
//            them). With ROW_THREADS = 1 (the choice on CPU adapters) an invocation owns a whole
//            row and there is no barrier.
// Dispatch:  ceil(rows / ROWS_PER_WG) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d).

struct Params {
  rows: u32,
  cols: u32,
  eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<WT>;
@group(0) @binding(2) var<storage, read> b: array<WT>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// row_lane, row_sum, row_barrier and their workgroup memory: norm_rows.wgsl (prepended).

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
  let base = at.row * p.cols;
  let n = f32(p.cols);

  var s = 0.0;
  if (in_range) {
    for (var c = lane; c < p.cols; c += ROW_THREADS) {
      s += x[base + c];
    }
  }
  let mean = row_sum(s, at) / n;
  row_barrier();

  var sq = 0.0;
  if (in_range) {
    for (var c = lane; c < p.cols; c += ROW_THREADS) {
      let d = x[base + c] - mean;
      sq += d * d;
    }
  }
  let inv_std = inverseSqrt(row_sum(sq, at) / n + p.eps);
  if (in_range) {
    for (var c = lane; c < p.cols; c += ROW_THREADS) {
      out[base + c] = (x[base + c] - mean) * inv_std * f32(w[c]) + f32(b[c]);
    }
  }
}
