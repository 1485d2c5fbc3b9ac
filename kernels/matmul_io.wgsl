// matmul_io: the parameters, output bindings and store shared by every matmul kernel
// (matmul_tiled.wgsl, matmul_gemv.wgsl, matmul_blocked.wgsl, matmul_unrolled.wgsl and its
// quantized k loop), prepended to each by kernels/matmul_kernels.ts (kernelSource); the wrapper
// kernels/matmul.ts writes Params. Needs `fn bias_at(n: u32) -> f32` from the bias prelude.
//
// Bindings (group 0), the rest are the kernels' (0 x, 1 w, 2 bias, 5 w_scales; 6-8
// matmul_x_rms.wgsl, 9 the rms_partials X form, 10-12 matmul_unrolled_residual.wgsl):
//   3 y : storage rw  array<f32>  [M, ldy]; columns [n0, n0 + rows) written
//   4 p : uniform     Params

struct Params {
  // Rows of X and Y.
  m: u32,
  // Weight rows of this part (its columns of Y).
  rows: u32,
  // Columns of X (the reduction length).
  k: u32,
  // Weight row stride in vec4s (rowStride / 4).
  k4: u32,
  // Row stride of Y in elements.
  ldy: u32,
  // First column of Y this part writes (parts split W by rows).
  n0: u32,
  // Workgroups along the weight rows (the folded (x, y) grid's count).
  groups_n: u32,
  // The RMSNorm's epsilon (X forms matmul_x_rms.wgsl and rms_partials; 0 otherwise).
  eps: f32,
  // 1 when this dispatch writes the residual stream's next buffer (matmul_x_rms.wgsl with
  // RESIDUAL: weight part 0), else 0.
  keep: u32,
}

@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

// y[m, n0 + n] = v + bias[n0 + n] for row m of X and weight row n of the part.
fn store_y(m: u32, n: u32, v: f32) {
  y[m * p.ldy + p.n0 + n] = v + bias_at(p.n0 + n);
}
