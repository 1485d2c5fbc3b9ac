// matmul_unrolled: Y = X W^T (+ bias), barrier-free, register tile in named variables, for CPU
// adapters.
//   y[m, n0 + n] = sum_k x[m, k] * w[n, k] (+ bias[n0 + n])   for m < M, n < rows, k < K
// One invocation computes an MB x RN block of Y: MB rows of X against RN consecutive rows of W.
// Per step of 8 along k it loads 8 weights of each of its RN rows with one 16-byte load
// (vec4<u32> of packed f16 pairs, or two vec4<f32>) and 8 values of each of its MB X rows, then
// accumulates MB x RN dot products in scalar registers.
//
// TEMPLATE (kernels/unroll.ts): a line containing the marker dollar-i is emitted once per X row
// i < MB, a line containing dollar-r once per weight row r < RN, a line with both MB x RN
// times; the markers become the numbers. So the tile lives in named variables (acc0_0, ...)
// and the k loop body has no inner loops and no arrays. Why (measured on lavapipe, 2 cores,
// Qwen3-0.6B gate_up 6144 x 1024 f16, see kernels/matmul.ts): lavapipe issues every storage load
// as a per-lane loop over its components, and a tile in arrays indexed by loop counters costs
// as much again; written out this way the same tile runs 2-3x faster than matmul_blocked8.wgsl.
// Requires rowStride % 8 == 0 (whole 8-element steps inside every row; the padding is zero).
//
// Prelude (prepended by kernels/matmul_kernels.ts): `const MB: u32`, `const RN: u32`,
// `const WG: u32`;
// the x binding with `fn load_x8(row: u32, q: u32) -> mat2x4<f32>` (elements 8q..8q+7 of X row
// `row`, columns 0 and 1 = elements 0..3 and 4..7), `fn load_x8_tail(row: u32, q: u32,
// rem: u32) -> mat2x4<f32>` (the same with elements >= rem of the step zeroed) and `fn
// x_rscale(row: u32) -> f32` (the factor of X row `row`'s dot products: 1, or with the X form
// rms_partials the row's RMSNorm rsqrt from the partial sums of squares at binding 9); the weight
// binding `w` with `fn load_w8(row: u32, q: u32) -> mat2x4<f32>` (8-element step q of the part's
// row `row`); `fn bias_at(n: u32) -> f32` (with the bias binding when there is one);
// matmul_io.wgsl (Params, bindings y and p, store_y).
//
// Bindings (group 0):
//   0 x    : storage read  array<vec4<f32>> (K % 4 == 0) or array<f32>   [M, K], row stride K
//   1 w    : storage read  array<vec4<u32>> (f16: 8 packed halves) or array<vec4<f32>> (f32)
//            [rows, rowStride] one GpuMatrix part, rowStride % 8 == 0, padding zero
//   2 bias : storage read  array<f32>               [N] (whole bias; only with bias)
//   3 y    : storage rw    array<f32>               [M, ldy]; columns [n0, n0 + rows) written
//   4 p    : uniform       Params (k4 = rowStride / 4)
//   9 x_partials : storage read  array<f32>         [M, ceil(K / 128)] (X form rms_partials only:
//            X is h * gamma, each row's sums of squares of h in blocks of 128 columns,
//            NORM_PARTIAL_ROWS, as the residual epilogue writes them; matmul_unrolled_residual.wgsl)
// Workgroup: WG invocations, each RN rows of W x MB rows of X.
// Dispatch:  ceil(rows / (WG * RN)) workgroups folded into (x, y) (index wid.x + wid.y * nwg.x,
//            count p.groups_n), times ceil(M / MB) in z.

// Params, the bindings y, p and store_y: matmul_io.wgsl (prepended).

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
  // ROW GUARD BEGIN (the residual epilogue drops it: its barrier needs every invocation)
  if (row0 >= p.rows) {
    return;
  }
  // ROW GUARD END
  let m0 = wid.z * MB;
  // K LOOP BEGIN (matmul_unrolled_q.wgsl replaces this part for int8 / int4 weights)
  // Rows past the end are clamped to the last valid one (read, never stored): no masks inside
  // the k loop.
  let wr$r = min(row0 + $ru, p.rows - 1u);
  let xr$i = min(m0 + $iu, p.m - 1u);
  var acc$i_$r = 0.0;
  let full = p.k / 8u;
  for (var q = 0u; q < full; q++) {
    let w$r = load_w8(wr$r, q);
    let x$i = load_x8(xr$i, q);
    acc$i_$r += dot(x$i[0], w$r[0]) + dot(x$i[1], w$r[1]);
  }
  // K tail (fewer than 8 elements): the weight padding is zero; X past K is zeroed (it may be
  // the next row of X).
  let rem = p.k - full * 8u;
  if (rem > 0u) {
    let tw$r = load_w8(wr$r, full);
    let tx$i = load_x8_tail(xr$i, full, rem);
    acc$i_$r += dot(tx$i[0], tw$r[0]) + dot(tx$i[1], tw$r[1]);
  }
  // K LOOP END
  // EPILOGUE BEGIN (matmul_unrolled_residual.wgsl replaces this part for the residual epilogue)
  // x_rscale: the X form's factor of each X row (1, or the row's rsqrt for rms_partials).
  let rs$i = x_rscale(xr$i);
  let n$r = row0 + $ru;
  if (m0 + $iu < p.m && n$r < p.rows) { store_y(m0 + $iu, n$r, acc$i_$r * rs$i); }
  // EPILOGUE END
}
