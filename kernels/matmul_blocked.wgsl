// matmul_blocked: Y = X W^T (+ bias) with register blocking and NO workgroup memory.
//   y[m, n0 + n] = sum_k x[m, k] * w[n, k] (+ bias[n0 + n])   for m < M, n < rows, k < K
// One invocation computes an MB x RN block of Y: MB rows of X against RN consecutive rows of W,
// reading both straight from storage with vec4 steps along k and accumulating in f32.
// Each weight row is streamed once per MB rows of X, so with MB >= M this is a GEMV that reads
// W exactly once for all M rows. On a CPU (lavapipe) every lane issues its own loads and
// barriers are costly, which is why this kernel has neither shared memory nor barriers; it is
// the CPU policy's kernel for decode and prefill (see kernels/matmul.ts).
//
// Prelude (prepended by kernels/matmul_kernels.ts): `const MB: u32` (X rows per invocation),
// `const RN: u32` (W rows per invocation, 4), `const WG: u32` (workgroup size), the weight
// binding `w` with `fn load_w4(row: u32, q: u32) -> vec4<f32>` (vec4 q of row `row`; f16 weights are read as packed u32 pairs),
// `fn bias_at(n: u32) -> f32` (with the bias binding when there is one), matmul_x.wgsl (binding
// x, x_row, load_x4, load_x4_tail; or matmul_x_swiglu.wgsl) and matmul_io.wgsl (Params,
// bindings y and p, store_y).
//
// Bindings (group 0):
//   0 x    : storage read  array<f32>               [M, K], row stride K (matmul_x.wgsl), or
//            [M, 2K] gate|up read as its SwiGLU (matmul_x_swiglu.wgsl)
//   1 w    : storage read  vec4 of f32 / 2 x u32 (f16 pairs)  [rows, rowStride] one GpuMatrix
//            part, rowStride % 4 == 0, padding zero; index = row * k4 + k / 4
//   2 bias : storage read  array<f32>               [N] (whole bias; only with bias)
//   3 y    : storage rw    array<f32>               [M, ldy]; columns [n0, n0 + rows) written
//   4 p    : uniform       Params
// Workgroup: WG invocations, each RN rows of W x MB rows of X.
// Dispatch:  ceil(rows / (WG * RN)) workgroups folded into (x, y) (index wid.x + wid.y * nwg.x,
//            count p.groups_n), times ceil(M / MB) in z.

// Params, the bindings x, y, p, x_row, load_x4(_tail) and store_y: matmul_x.wgsl, matmul_io.wgsl
// (prepended).

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let group = wid.x + wid.y * nwg.x;
  if (group >= p.groups_n) {
    return;
  }
  let row0 = (group * WG + lid) * RN;
  if (row0 >= p.rows) {
    return;
  }
  let m0 = wid.z * MB;
  // Rows past the end are clamped to the last valid row (read, never stored): no masks in the
  // inner loop.
  var wrow: array<u32, RN>;
  for (var r = 0u; r < RN; r++) {
    wrow[r] = min(row0 + r, p.rows - 1u);
  }
  var xbase: array<u32, MB>;
  for (var i = 0u; i < MB; i++) {
    xbase[i] = x_row(min(m0 + i, p.m - 1u));
  }
  var acc: array<array<f32, RN>, MB>;
  let full = p.k / 4u;
  for (var q = 0u; q < full; q++) {
    var wv: array<vec4<f32>, RN>;
    for (var r = 0u; r < RN; r++) {
      wv[r] = load_w4(wrow[r], q);
    }
    for (var i = 0u; i < MB; i++) {
      let xv = load_x4(xbase[i] + q * 4u);
      for (var r = 0u; r < RN; r++) {
        acc[i][r] += dot(xv, wv[r]);
      }
    }
  }
  // K tail: the weight padding past K is zero; X past K is masked to zero.
  if (full * 4u < p.k) {
    let rem = p.k - full * 4u;
    var wv: array<vec4<f32>, RN>;
    for (var r = 0u; r < RN; r++) {
      wv[r] = load_w4(wrow[r], full);
    }
    for (var i = 0u; i < MB; i++) {
      let xv = load_x4_tail(xbase[i] + full * 4u, rem);
      for (var r = 0u; r < RN; r++) {
        acc[i][r] += dot(xv, wv[r]);
      }
    }
  }
  for (var i = 0u; i < MB; i++) {
    let m = m0 + i;
    if (m >= p.m) {
      break;
    }
    for (var r = 0u; r < RN; r++) {
      let n = row0 + r;
      if (n < p.rows) {
        store_y(m, n, acc[i][r]);
      }
    }
  }
}
