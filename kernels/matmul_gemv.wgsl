// matmul_gemv: Y = X W^T (+ bias) for decode (M small) with a reduction across invocations.
//   y[m, n0 + n] = sum_k x[m, k] * w[n, k] (+ bias[n0 + n])   for m < M, n < rows, k < K
// TPR invocations share one weight row: invocation t reads the vec4s t, t + TPR, ... of the row
// (neighbouring invocations read neighbouring memory, coalesced on a GPU) and accumulates the
// partial dot products of MB rows of X in f32; the partial sums are then added in a tree in
// workgroup memory. Each weight row is read once for all MB rows of X. This is the GPU policy's
// decode kernel; on a CPU (lavapipe) its barriers make it several times slower than
// matmul_blocked (see kernels/matmul.ts).
//
// Prelude (prepended by kernels/matmul_kernels.ts): `const MB: u32` (X rows per workgroup),
// `const TPR: u32` (invocations per row, a power of two), `const RPW: u32` (rows per workgroup),
// the weight binding `w` with `fn load_w4(i: u32) -> vec4<f32>`, `fn bias_at(n: u32) -> f32`,
// matmul_x.wgsl (binding x, x_row, load_x4, load_x4_tail; or matmul_x_swiglu.wgsl) and
// matmul_io.wgsl (Params, bindings y and p, store_y).
//
// Bindings (group 0):
//   0 x    : storage read  array<f32>               [M, K], row stride K (matmul_x.wgsl), or
//            [M, 2K] gate|up read as its SwiGLU (matmul_x_swiglu.wgsl)
//   1 w    : storage read  vec4 of f32 / 2 x u32 (f16 pairs)  [rows, rowStride] one GpuMatrix
//            part, rowStride % 4 == 0, padding zero; index = row * k4 + k / 4
//   2 bias : storage read  array<f32>               [N] (whole bias; only with bias)
//   3 y    : storage rw    array<f32>               [M, ldy]; columns [n0, n0 + rows) written
//   4 p    : uniform       Params
// Workgroup: (TPR, RPW) invocations: RPW weight rows, TPR invocations each.
// Dispatch:  ceil(rows / RPW) workgroups folded into (x, y) (index wid.x + wid.y * nwg.x, count
//            p.groups_n), times ceil(M / MB) in z.

// Params, the bindings x, y, p, x_row, load_x4(_tail) and store_y: matmul_x.wgsl, matmul_io.wgsl
// (prepended).

var<workgroup> partial: array<array<f32, TPR * RPW>, MB>;

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
  // Rows past the end are clamped to the last valid row (computed, never stored).
  let row = min(group * RPW + lid3.y, p.rows - 1u);
  let m0 = wid.z * MB;
  var xbase: array<u32, MB>;
  for (var i = 0u; i < MB; i++) {
    xbase[i] = x_row(min(m0 + i, p.m - 1u));
  }
  var acc: array<f32, MB>;
  let full = p.k / 4u;
  for (var q = t; q < full; q += TPR) {
    let wv = load_w4(row * p.k4 + q);
    for (var i = 0u; i < MB; i++) {
      acc[i] += dot(load_x4(xbase[i] + q * 4u), wv);
    }
  }
  // K tail (one partial vec4): weight padding is zero, X past K is masked to zero.
  if (t == 0u && full * 4u < p.k) {
    let rem = p.k - full * 4u;
    let wv = load_w4(row * p.k4 + full);
    for (var i = 0u; i < MB; i++) {
      acc[i] += dot(load_x4_tail(xbase[i] + full * 4u, rem), wv);
    }
  }
  for (var i = 0u; i < MB; i++) {
    partial[i][slot] = acc[i];
  }
  for (var half = TPR / 2u; half > 0u; half /= 2u) {
    workgroupBarrier();
    if (t < half) {
      for (var i = 0u; i < MB; i++) {
        partial[i][slot] += partial[i][slot + half];
      }
    }
  }
  let n = group * RPW + lid3.y;
  if (t == 0u && n < p.rows) {
    for (var i = 0u; i < MB; i++) {
      let m = m0 + i;
      if (m < p.m) {
        store_y(m, n, partial[i][slot]);
      }
    }
  }
}
