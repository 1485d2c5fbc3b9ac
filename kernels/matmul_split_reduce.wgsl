// matmul_split_reduce: the second dispatch of a split-K `tiled` matmul (matmul_tiled.wgsl with
// SPLIT > 1, kernels/matmul_split.ts): adds up the K slices' partial sums of each output, scales
// the row by its RMSNorm factor when the X form has a row statistic (STAT: the slices' sums of
// squares added up first, as matmul_x_rms.wgsl's x_scale), and adds the bias.
//   y[m, n] = (sum_s part[s, m, n]) * inverseSqrt((sum_s sq[s, m]) / K + eps) + bias[n]  (STAT)
//   y[m, n] = sum_s part[s, m, n] + bias[n]                                              (else)
//   for m < M, n < N (one weight part: n0 = 0, rows = N)
//
// Prelude (prepended by kernels/matmul_split.ts): `const SPLIT: u32`, `const STAT: bool`, the
// bias binding with `fn bias_at(n: u32) -> f32`, and matmul_io.wgsl (Params, bindings y and p,
// store_y); the parameters are those of the matmul's own dispatch (the same slot).
//
// Bindings (group 0):
//   0 part : storage read  array<f32>  [SPLIT, M, ldy] partial sums (columns [0, N) read), then
//                                      [SPLIT, M] sums of squares (STAT only)
//   2 bias : storage read  array<f32>  [N] (with bias only)
//   3 y    : storage rw    array<f32>  [M, ldy]; columns [0, N) written
//   4 p    : uniform       Params (m, rows = N, k, ldy, eps)
// Workgroup: 64 invocations, one output each.
// Dispatch:  (ceil(N / 64), M, 1).

@group(0) @binding(0) var<storage, read> part: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3u) {
  let n = gid.x;
  let m = gid.y;
  if (n >= p.rows || m >= p.m) {
    return;
  }
  var v = 0.0;
  for (var s = 0u; s < SPLIT; s++) {
    v += part[(s * p.m + m) * p.ldy + n];
  }
  if (STAT) {
    var sq = 0.0;
    for (var s = 0u; s < SPLIT; s++) {
      sq += part[SPLIT * p.m * p.ldy + s * p.m + m];
    }
    v *= inverseSqrt(sq / f32(p.k) + p.eps);
  }
  store_y(m, n, v);
}
