// matmul_x_nostat: the `_stat` interface of matmul_x_rms.wgsl over the X forms that need no row
// statistic (matmul_x.wgsl, matmul_x_swiglu.wgsl), so the `gemv` and `tiled` kernels read every
// X form through one interface. Appended after the X form by kernels/matmul_kernels.ts; no
// bindings of its own.

// The kernels skip the squares' reduction and the scale (constant-folded away).
const X_STAT = false;

struct XLoad1 {
  v: f32,
  sq: f32,
}

struct XLoad4 {
  v: vec4<f32>,
  sq: f32,
}

fn load_x1_stat(i: u32, k: u32, keep: bool) -> XLoad1 {
  return XLoad1(load_x1(i), 0.0);
}

fn load_x4_stat(base: u32, k: u32, keep: bool) -> XLoad4 {
  return XLoad4(load_x4(base), 0.0);
}

fn load_x4_tail_stat(base: u32, k: u32, rem: u32, keep: bool) -> XLoad4 {
  return XLoad4(load_x4_tail(base, rem), 0.0);
}

fn x_scale(sum: f32) -> f32 {
  return 1.0;
}
