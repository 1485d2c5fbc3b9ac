// matmul_gemv: Y = X W^T (+ bias) for decode (M small) with a reduction across invocations.
//   y[m, n0 + n] = sum_k x[m, k] * w[n, k] (+ bias[n0 + n])   for m < M, n < rows, k < K
// TPR invocations share RB weight rows: invocation t reads the vec4s t, t + TPR, ... of each row
// (or, with matmul_gemv_step8.wgsl in place of the K loop, the 8-element steps t, t + TPR, ...: one
// 16-byte load of f16 weights, one word of int4; with matmul_gemv_q32.wgsl, whole groups of 32
// int8 / int4 weights)
// (neighbouring invocations read neighbouring memory, coalesced on a GPU) and accumulates the
// partial dot products of MB rows of X with each of the RB rows in f32, loading each X vec4 once
// for the RB rows; the partial sums are then added in a tree in workgroup memory. Each weight row
// is read once for all MB rows of X. This is the GPU policy's
// decode kernel; on a CPU (lavapipe) its barriers make it several times slower than
// matmul_blocked (see kernels/matmul.ts).
//
// X forms with a row statistic (matmul_x_rms.wgsl, X_STAT) also add up each row's squares in
// the same loop, reduce them in the same tree and scale the row's sums by x_scale.
//
// TEMPLATE (kernels/unroll.ts): a line containing the marker dollar-i is emitted once per X row
// i < MB, one containing dollar-r once per weight row r < RB, one with both MB x RB times, so
// the sums live in named variables: on an NVIDIA H200 through Deno (wgpu, Vulkan) per-invocation
// arrays indexed by loop counters are slow (see matmul_tiled.wgsl).
//
// Prelude (prepended by kernels/matmul_kernels.ts): `const MB: u32` (X rows per workgroup),
// `const TPR: u32` (invocations per row, a power of two), `const RPW: u32` (invocation sets per
// workgroup), `const RB: u32` (weight rows per invocation; a workgroup covers RPW * RB rows),
// `const XS: u32` (2 with a row statistic, else 1), the weight binding `w` with
// `fn load_w4(row: u32, q: u32) -> vec4<f32>` (vec4 q of row `row`), `fn bias_at(n: u32) -> f32`, the X form (x_row,
// load_x4_stat, load_x4_tail_stat, x_scale, X_STAT: matmul_x.wgsl or matmul_x_swiglu.wgsl with
// matmul_x_nostat.wgsl, or matmul_x_rms.wgsl) and matmul_io.wgsl (Params, bindings y and p,
// store_y).
//
// Bindings (group 0):
//   0 x    : storage read  array<f32>               [M, K], row stride K (matmul_x.wgsl), or
//            [M, 2K] gate|up read as its SwiGLU (matmul_x_swiglu.wgsl), or the residual
//            stream normalised on the fly (matmul_x_rms.wgsl, bindings 6-8 there)
//   1 w    : storage read  vec4 of f32 / 2 x u32 (f16 pairs)  [rows, rowStride] one GpuMatrix
//            part, rowStride % 4 == 0, padding zero; index = row * k4 + k / 4
//   2 bias : storage read  array<f32>               [N] (whole bias; only with bias)
//   3 y    : storage rw    array<f32>               [M, ldy]; columns [n0, n0 + rows) written
//   4 p    : uniform       Params
// Workgroup: (TPR, RPW) invocations: RPW sets of TPR invocations, RB weight rows each.
// Dispatch:  ceil(rows / (RPW * RB)) workgroups folded into (x, y) (index wid.x + wid.y * nwg.x, count
//            p.groups_n), times ceil(M / MB) in z.

// Params, the bindings x, y, p, x_row, load_x4_stat(_tail) and store_y: the X form and
// matmul_io.wgsl (prepended).

// Rows [0, MB * RB): partial dot products (X row i, weight row r at i * RB + r); rows
// [MB * RB, MB * RB + MB) (X_STAT): partial sums of squares.
var<workgroup> partial: array<array<f32, TPR * RPW>, MB * RB + MB * (XS - 1u)>;

@compute @workgroup_size(TPR, RPW)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_id) lid3: vec3u,
) {
  let group = wid.x + wid.y * nwg.x;
  // Uniform across the workgroup, so the barriers below stay in uniform control flow.
  if (group >= p.groups_n) {
    return;
  }
  let t = lid3.x;
  let slot = lid3.y * TPR + t;
  // Weight rows of this invocation; rows past the end are clamped to the last valid row
  // (computed, never stored).
  let n$r = (group * RPW + lid3.y) * RB + $ru;
  let row$r = min(n$r, p.rows - 1u);
  let m0 = wid.z * MB;
  // Row i < MB of this workgroup's X rows (lines with the marker dollar-i, see the header).
  let xbase$i = x_row(min(m0 + $iu, p.m - 1u));
  // The first weight row's invocations of the first workgroup cover every element of the X
  // rows once: they write the residual stream (matmul_x_rms.wgsl with RESIDUAL) when p.keep.
  let keeper = p.keep != 0u && group == 0u && lid3.y == 0u;
  let keep$i = keeper && m0 + $iu < p.m;
  var acc$i_$r = 0.0;
  var sq$i = 0.0;
  // K LOOP BEGIN (matmul_kernels.ts puts matmul_gemv_step8.wgsl or matmul_gemv_q32.wgsl here)
  let full = p.k / 4u;
  for (var q = t; q < full; q += TPR) {
    let wv$r = load_w4(row$r, q);
    let xv$i = load_x4_stat(xbase$i + q * 4u, q * 4u, keep$i);
    acc$i_$r += dot(xv$i.v, wv$r);
    sq$i += xv$i.sq;
  }
  // K tail (one partial vec4): weight padding is zero, X past K is masked to zero.
  if (t == 0u && full * 4u < p.k) {
    let rem = p.k - full * 4u;
    let tw$r = load_w4(row$r, full);
    let tv$i = load_x4_tail_stat(xbase$i + full * 4u, full * 4u, rem, keep$i);
    acc$i_$r += dot(tv$i.v, tw$r);
    sq$i += tv$i.sq;
  }
  // K LOOP END
  partial[$iu * RB + $ru][slot] = acc$i_$r;
  // Row MB * RB + i (X_STAT; written so that the constant index stays in bounds when XS == 1).
  if (X_STAT) { partial[MB * RB * (XS - 1u) + $iu][slot] = sq$i; }
  for (var half = TPR / 2u; half > 0u; half /= 2u) {
    workgroupBarrier();
    if (t < half) {
      for (var i = 0u; i < MB * RB + MB * (XS - 1u); i++) {
        partial[i][slot] += partial[i][slot + half];
      }
    }
  }
  if (t == 0u) {
    for (var i = 0u; i < MB; i++) {
      let m = m0 + i;
      var scale = 1.0;
      if (X_STAT) {
        scale = x_scale(partial[MB * RB + i][slot]);
      }
      if (m < p.m && n$r < p.rows) { store_y(m, n$r, partial[i * RB + $ru][slot] * scale); }
    }
  }
}
