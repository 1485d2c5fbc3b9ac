// matmul_unrolled_q: Y = X W'^T (+ bias) for int8 / int4 weights (gpu/quant.ts), barrier-free,
// register tile in named variables, for CPU adapters: matmul_unrolled.wgsl with the weights
// dequantized in registers, w' = q * scale.
//   y[m, n0 + n] = sum_k x[m, k] * w'[n, k] (+ bias[n0 + n])   for m < M, n < rows, k < K
// One invocation computes an MB x RN block of Y. K is walked in groups of 32 (one f16 scale
// per weight row and group, loaded once per group) and each group in 4 steps of 8: per step one
// word (int4, 8 values) or two (int8) per weight row, unpacked, scaled, and dotted with 8 values
// of each X row. On lavapipe every storage load is a per-lane loop over its 32-bit components
// (kernels/matmul_kernels.ts), so 8 int4 weights cost 1.25 component loads against 4 for f16.
//
// TEMPLATE (kernels/unroll.ts): lines with dollar-i repeat per X row i < MB, with dollar-r per
// weight row r < RN, with both MB x RN times.
//
// FRAGMENT: this file is the k loop only. kernels/matmul_kernels.ts puts it in place of the part
// of matmul_unrolled.wgsl between its "K LOOP BEGIN" and "K LOOP END" lines (the rest of that
// kernel, its register tile and its stores, is shared); the loop leaves acc$i_$r holding the
// sums.
//
// Prelude (prepended by kernels/matmul_kernels.ts): `const MB: u32`, `const RN: u32`,
// `const WG: u32`; the x binding with `fn load_x8(row: u32, q: u32) -> mat2x4<f32>` (K % 4 == 0);
// the weight bindings `w` and `w_scales` with `fn load_q8(i: u32) -> mat2x4<f32>` (the 8
// unscaled values of step i counted from the start of the part) and `fn scale_at(g: u32) -> f32`
// (scale of group g counted from the start of the part); `fn bias_at(n: u32) -> f32`;
// matmul_io.wgsl (Params, bindings y and p, store_y).
//
// Bindings (group 0):
//   0 x        : storage read  array<vec4<f32>>          [M, K], row stride K, K % 32 == 0
//   1 w        : storage read  array<u32> (int4) or array<vec2<u32>> (int8): the packed values
//                              of [rows, K] (one GpuMatrix part, no padding)
//   2 bias     : storage read  array<f32>                [N] (whole bias; only with bias)
//   3 y        : storage rw    array<f32>                [M, ldy]; columns [n0, n0 + rows) written
//   4 p        : uniform       Params
//   5 w_scales : storage read  array<u32>                f16 pairs [rows * K / 32]
// Workgroup: WG invocations, each RN rows of W x MB rows of X.
// Dispatch:  ceil(rows / (WG * RN)) workgroups folded into (x, y) (index wid.x + wid.y * nwg.x,
//            count p.groups_n), times ceil(M / MB) in z.

  let k8 = p.k / 8u;
  let groups = p.k / 32u;
  // Rows past the end are clamped to the last valid one (read, never stored): no masks inside
  // the k loop.
  let wr$r = min(row0 + $ru, p.rows - 1u);
  let wb$r = wr$r * k8;
  let sb$r = wr$r * groups;
  let xr$i = min(m0 + $iu, p.m - 1u);
  var acc$i_$r = 0.0;
  for (var g = 0u; g < groups; g++) {
    // One scale per weight row and group, loaded once for its 4 steps of 8.
    let s$r = scale_at(sb$r + g);
    for (var q = 4u * g; q < 4u * g + 4u; q++) {
      let w$r = load_q8(wb$r + q) * s$r;
      let x$i = load_x8(xr$i, q);
      acc$i_$r += dot(x$i[0], w$r[0]) + dot(x$i[1], w$r[1]);
    }
  }
