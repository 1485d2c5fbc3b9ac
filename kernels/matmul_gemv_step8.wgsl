// matmul_gemv_step8: the K loop of matmul_gemv.wgsl with 8 weights per invocation per step:
// invocation t reads the 8-element steps t, t + TPR, ... of each weight row through `load_w8`
// (f16: one vec4<u32>, 16 bytes; int4: one u32; int8: one vec2<u32>; f32: two vec4s), and the
// matching 8 X values as two `load_x4_stat` vec4s. A wide load per invocation where the vec4
// loop issues two (f16) or shares one word between two invocations (int4).
//
// FRAGMENT: kernels/matmul_kernels.ts puts this file in place of the part of matmul_gemv.wgsl
// between its "K LOOP BEGIN" and "K LOOP END" lines; the loop leaves acc$i_$r and sq$i holding
// this invocation's sums, as the vec4 loop does.
//
// Prelude (besides matmul_gemv.wgsl's): the weight binding `w` with
// `fn load_w8(row: u32, q: u32) -> mat2x4<f32>` (kernels/matmul_weight_bindings.ts weightBinding8:
// elements 8q .. 8q + 7 of row `row`; the row stride a multiple of 8, padding zero).
  let full = p.k / 8u;
  for (var q = t; q < full; q += TPR) {
    let wm$r = load_w8(row$r, q);
    let xa$i = load_x4_stat(xbase$i + q * 8u, q * 8u, keep$i);
    let xb$i = load_x4_stat(xbase$i + q * 8u + 4u, q * 8u + 4u, keep$i);
    acc$i_$r += dot(xa$i.v, wm$r[0]) + dot(xb$i.v, wm$r[1]);
    sq$i += xa$i.sq + xb$i.sq;
  }
  // K tail (1 to 7 elements): weight padding is zero, X past K is masked to zero.
  if (t == 0u && full * 8u < p.k) {
    let rem = p.k - full * 8u;
    let tw$r = load_w8(row$r, full);
    var ta$i = XLoad4(vec4<f32>(0.0), 0.0);
    var tb$i = XLoad4(vec4<f32>(0.0), 0.0);
    if (rem >= 4u) { ta$i = load_x4_stat(xbase$i + full * 8u, full * 8u, keep$i); } else { ta$i = load_x4_tail_stat(xbase$i + full * 8u, full * 8u, rem, keep$i); }
    if (rem > 4u) { tb$i = load_x4_tail_stat(xbase$i + full * 8u + 4u, full * 8u + 4u, rem - 4u, keep$i); }
    acc$i_$r += dot(ta$i.v, tw$r[0]) + dot(tb$i.v, tw$r[1]);
    sq$i += ta$i.sq + tb$i.sq;
  }
