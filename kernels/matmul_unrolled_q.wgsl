// matmul_unrolled_q: Y = X W'^T (+ bias) for int8 / int4 weights (gpu/quant.ts), barrier-free,
// register tile in named variables, for CPU adapters: matmul_unrolled.wgsl with the weights
// dequantized in registers, w' = q * scale.
//   y[m, n0 + n] = sum_k x[m, k] * w'[n, k] (+ bias[n0 + n])   for m < M, n < rows, k < K
// One invocation computes an MB x RN block of Y. K is walked one group of 32 at a time: per
// weight row one 16-byte load of the group's words (int4: 4 words; int8: two such loads, 8
// words), and the group's f16 scales of the RN = 16 rows in two 16-byte loads (the scales sit in
// blocks of 8 rows on the device, gpu/quant.ts; one 4-byte load per row before: the kernel ran
// 0.72-0.91 ms instead of 0.81-1.24, medians of three interleaved runs, 6144 x 1024 int4, M = 1,
// lavapipe, 2026-11-26); the group's 4 steps of 8 values are written out below; the sum over
// the group is scaled once: acc += s * (sum over the group of q * x).
// Why whole groups (measured on lavapipe, 2 cores, 6144 x 1024 int4, M = 1, 2026-11-26):
// lavapipe issues every storage load as a per-lane loop, and one 16-byte load costs about a
// third of four 4-byte ones; the kernel went from 1.29 to 0.85 ms (f16 `unrolled`: 1.5 ms;
// bench/load_width.ts). Under the cpu kernel profile the words sit in blocks of 16 rows
// (gpu/quant.ts word blocks: a group of the RN = 16 rows is 256 (int4) or 512 (int8)
// contiguous bytes), so an invocation's loads walk one stream instead of 16; or, the cpu
// profile's default, in a texture (gpu/quant.ts, gpu/word_texture.ts: one texel per 16 bytes of a
// row, in the same blocks of 16 rows, one block per texture row), whose fetches lavapipe runs as
// gathers rather than per-lane loops (0.76-0.80x the time of the blocks, int4; 0.89x int8;
// 2026-11-27, texels then row by row; in blocks, the LM head's shape 0.85-0.87x again, 2026-11-29);
// `load_group` reads any of the three (`w_unit`).
//
// Unpacking without shifts (the prelude's q_prep / q_offset / q_dot): a value is isolated in
// place with one AND (the word with the sign bit of every value but the top one flipped, so
// those read as q + 8 (int4) or q + 128 (int8); the top one keeps its sign) and converted to
// f32 as it sits, q' * 16^j (int4) or q' * 256^j (int8): exact, at most 8 significant bits. X is
// multiplied by the matching 16^-j (256^-j) once per step for all RN weight rows, and the
// offsets come back as -8 (-128) times the sum of those X values. Same sum as q * x in f32,
// reassociated (tested against the float64 reference like every kernel).
//
// TEMPLATE (kernels/unroll.ts): lines with dollar-i repeat per X row i < MB, with dollar-r per
// weight row r < RN, with both MB x RN times.
//
// FRAGMENT: this file is the k loop only. kernels/matmul_kernels.ts puts it in place of the part
// of matmul_unrolled.wgsl between its "K LOOP BEGIN" and "K LOOP END" lines (the rest of that
// kernel, its register tile and its stores, is shared); the loop leaves acc$i_$r holding the
// sums and xr$i the X rows they belong to (clamped: the epilogue's x_rscale reads them).
//
// Prelude (prepended by kernels/matmul_kernels.ts): `const MB: u32`, `const RN: u32`,
// `const WG: u32`; the x binding with `fn load_x8(row: u32, q: u32) -> mat2x4<f32>` (K % 4 == 0);
// the weight bindings `w` and `w_scales` with `fn load_group(row: u32, grp: u32) -> QGroup` (the
// words of group grp of the part's row `row`, through `fn w_unit(row, unit, per_group)`), `fn scale_block(row8: u32, grp: u32) ->
// vec4<u32>` (group grp's scales of rows 8 row8 .. 8 row8 + 7, one 16-byte load) and
// `fn block_scale(b: vec4<u32>, r: u32) -> f32` (row r of such a block), `fn q_prep(x:
// mat2x4<f32>) -> mat2x4<f32>` (X scaled to the values' places), `fn q_offset(x: mat2x4<f32>)
// -> f32` (the offsets' share of the step) and `fn q_dot(xs: mat2x4<f32>, v: QGroup, c: u32) ->
// f32` (step c of the group against prepared X); `fn bias_at(n: u32) -> f32`; matmul_io.wgsl
// (Params, bindings y and p, store_y).
//
// Bindings (group 0):
//   0 x        : storage read  array<vec4<f32>>          [M, K], row stride K, K % 32 == 0
//   1 w        : storage read  array<vec4<u32>>          the packed values of [rows, K] (one
//                              GpuMatrix part, row by row or in blocks of 16 rows, gpu/quant.ts):
//                              one (int4) or two (int8) per group
//                or texture_2d_array<u32> (rgba32uint)  the same 16-byte units, unit u of row r
//                              at texel (16 u + r % 16, (r / 16) % 512), layer r / 8192
//                              (gpu/quant.ts)
//   2 bias     : storage read  array<f32>                [N] (whole bias; only with bias)
//   3 y        : storage rw    array<f32>                [M, ldy]; columns [n0, n0 + rows) written
//   4 p        : uniform       Params
//   5 w_scales : storage read  array<vec4<u32>>          f16 [ceil(rows / 8), K / 32, 8]: the
//                              scales in blocks of 8 rows (gpu/quant.ts)
// Workgroup: WG invocations, each RN rows of W x MB rows of X.
// Dispatch:  ceil(rows / (WG * RN)) workgroups folded into (x, y) (index wid.x + wid.y * nwg.x,
//            count p.groups_n), times ceil(M / MB) in z.

  let groups = p.k / 32u;
  // Rows past the end are clamped to the last valid one (read, never stored): no masks inside
  // the k loop.
  let wr$r = min(row0 + $ru, p.rows - 1u);
  // The RN = 16 rows' scales are two blocks of 8 rows (row0 is a multiple of 16); a second block
  // past the part's last is clamped to it (its rows are past the end: read, never stored).
  let blk0 = row0 / 8u;
  let blk1 = min(blk0 + 1u, (p.rows - 1u) / 8u);
  let xr$i = min(m0 + $iu, p.m - 1u);
  var acc$i_$r = 0.0;
  for (var g = 0u; g < groups; g++) {
    let v$r = load_group(wr$r, g);
    let sb0 = scale_block(blk0, g);
    let sb1 = scale_block(blk1, g);
    let s$r = block_scale(select(sb0, sb1, $ru >= 8u), $ru & 7u);
    var off$i = 0.0;
    var d$i_$r = 0.0;
    {
      let x$i = load_x8(xr$i, 4u * g + 0u);
      off$i += q_offset(x$i);
      let xs$i = q_prep(x$i);
      d$i_$r += q_dot(xs$i, v$r, 0u);
    }
    {
      let x$i = load_x8(xr$i, 4u * g + 1u);
      off$i += q_offset(x$i);
      let xs$i = q_prep(x$i);
      d$i_$r += q_dot(xs$i, v$r, 1u);
    }
    {
      let x$i = load_x8(xr$i, 4u * g + 2u);
      off$i += q_offset(x$i);
      let xs$i = q_prep(x$i);
      d$i_$r += q_dot(xs$i, v$r, 2u);
    }
    {
      let x$i = load_x8(xr$i, 4u * g + 3u);
      off$i += q_offset(x$i);
      let xs$i = q_prep(x$i);
      d$i_$r += q_dot(xs$i, v$r, 3u);
    }
    acc$i_$r += s$r * (d$i_$r + off$i);
  }
