// matmul_gemv_q32: the K loop of matmul_gemv.wgsl for int8 / int4 weights, one whole group of 32
// weights per invocation per step: invocation t reads groups t, t + TPR, ... of each weight row,
// each one 16-byte load (int4; int8: two) and one f16 scale, and the group's 32 X values as 8
// `load_x4_stat` vec4s (loaded once for the RB rows). The group's 4 steps of 8 values are
// unpacked as matmul_unrolled_q.wgsl does (kernels/matmul_weight_bindings.ts QUANT_STEP: a mask and a
// conversion per value, X pre-multiplied by the values' places and the sign offsets folded into
// a sum of X), and the group's sum is scaled once: acc += s * (sum over the group of q * x).
// Why: the vec4 and 8-element loops read 2 or 4 bytes of int4 words per load instruction where
// f16's 8-element loop reads 16, so at the same number of loads in flight they fetch 4-8x fewer
// bytes; here a load fetches 16 bytes of words, 32 weights. On an NVIDIA H200 (2026-11-26,
// before this kernel) int4 batch-1 decode ran at 1.01x of f16.
//
// FRAGMENT: kernels/matmul_kernels.ts puts this file in place of the part of matmul_gemv.wgsl
// between its "K LOOP BEGIN" and "K LOOP END" lines (with TPR = 32: Qwen3-0.6B's 1,024-wide rows
// are 32 groups); the loop leaves acc$i_$r and sq$i holding this invocation's sums, as the vec4
// loop does. K % 32 == 0 (a quantized weight's width), so there is no K tail.
//
// Prelude (besides matmul_gemv.wgsl's): the weight bindings `w` (array<vec4<u32>>) and
// `w_scales` with `fn load_group(row: u32, grp: u32) -> QGroup` (group grp of the part's row
// `row`), `fn scale_at(row: u32, grp: u32) -> f32`, `fn q_prep(x: mat2x4<f32>) -> mat2x4<f32>`,
// `fn q_offset(x: mat2x4<f32>) -> f32` and `fn q_dot(xs: mat2x4<f32>, v: QGroup, c: u32) -> f32`
// (kernels/matmul_weight_bindings.ts quantWeightBinding8).
  let groups = p.k / 32u;
  for (var g = t; g < groups; g += TPR) {
    let v$r = load_group(row$r, g);
    let s$r = scale_at(row$r, g);
    var off$i = 0.0;
    var d$i_$r = 0.0;
    // The group's 4 steps of 8 values, written out: a loop would index the group's words by its
    // counter, as the per-invocation arrays did that ran 10-30x slower on an NVIDIA H200
    // (matmul_tiled.wgsl); not risked without a GPU to measure it.
    {
      let xa$i = load_x4_stat(xbase$i + 32u * g, 32u * g, keep$i);
      let xb$i = load_x4_stat(xbase$i + 32u * g + 4u, 32u * g + 4u, keep$i);
      sq$i += xa$i.sq + xb$i.sq;
      let x$i = mat2x4<f32>(xa$i.v, xb$i.v);
      off$i += q_offset(x$i);
      let xs$i = q_prep(x$i);
      d$i_$r += q_dot(xs$i, v$r, 0u);
    }
    {
      let xa$i = load_x4_stat(xbase$i + 32u * g + 8u, 32u * g + 8u, keep$i);
      let xb$i = load_x4_stat(xbase$i + 32u * g + 12u, 32u * g + 12u, keep$i);
      sq$i += xa$i.sq + xb$i.sq;
      let x$i = mat2x4<f32>(xa$i.v, xb$i.v);
      off$i += q_offset(x$i);
      let xs$i = q_prep(x$i);
      d$i_$r += q_dot(xs$i, v$r, 1u);
    }
    {
      let xa$i = load_x4_stat(xbase$i + 32u * g + 16u, 32u * g + 16u, keep$i);
      let xb$i = load_x4_stat(xbase$i + 32u * g + 20u, 32u * g + 20u, keep$i);
      sq$i += xa$i.sq + xb$i.sq;
      let x$i = mat2x4<f32>(xa$i.v, xb$i.v);
      off$i += q_offset(x$i);
      let xs$i = q_prep(x$i);
      d$i_$r += q_dot(xs$i, v$r, 2u);
    }
    {
      let xa$i = load_x4_stat(xbase$i + 32u * g + 24u, 32u * g + 24u, keep$i);
      let xb$i = load_x4_stat(xbase$i + 32u * g + 28u, 32u * g + 28u, keep$i);
      sq$i += xa$i.sq + xb$i.sq;
      let x$i = mat2x4<f32>(xa$i.v, xb$i.v);
      off$i += q_offset(x$i);
      let xs$i = q_prep(x$i);
      d$i_$r += q_dot(xs$i, v$r, 3u);
    }
    acc$i_$r += s$r * (d$i_$r + off$i);
  }
