// matmul_x_swiglu: matmul_x.wgsl's interface (x_row, load_x1, load_x4, load_x4_tail) over the
// output of a fused gate/up projection, so a matmul reads its X as the SwiGLU activation
// without a silu_mul dispatch:
//   X[m, k] = silu(x[m, k]) * x[m, K + k],  silu(g) = g / (1 + exp(-g))
// (in that order of operations, as the separate silu_mul kernel it replaced).
// Prepended by kernels/matmul_kernels.ts (kernelSource) instead of matmul_x.wgsl when a call site
// binds `xForm: "swiglu"`, after the same binding prelude (`x1`, `x4`; vec4s where K % 4 == 0:
// then both halves of a row start 4-aligned).
//
// Bindings (group 0, declared by the prelude):
//   0 x : storage read  array<f32> / array<vec4<f32>>  [M, 2K]: per row K gate values then K up
//         values

// SwiGLU of gate g and up u: g / (1 + exp(-g)) * u.
fn silu_mul4(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
  return g / (1.0 + exp(-g)) * u;
}

// Index of the gate value of element 0 of X row m; element k's is at x_row(m) + k, its up
// value K further.
fn x_row(m: u32) -> u32 {
  return m * 2u * p.k;
}

// X element at gate index i.
fn load_x1(i: u32) -> f32 {
  let g = x1(i);
  return g / (1.0 + exp(-g)) * x1(i + p.k);
}

// X elements at gate indices base .. base + 3.
fn load_x4(base: u32) -> vec4<f32> {
  return silu_mul4(x4(base), x4(base + p.k));
}

// The K tail of a row: X elements at gate indices base .. base + rem - 1 (rem in 1..3), then
// zeros (past K lie the up values and the next row).
fn load_x4_tail(base: u32, rem: u32) -> vec4<f32> {
  let v = load_x4(base);
  return select(vec4<f32>(0.0), v, vec4<bool>(true, rem > 1u, rem > 2u, false));
}
