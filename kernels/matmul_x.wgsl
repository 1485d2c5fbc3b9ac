// matmul_x: the X binding of the matmul kernels that read it as f32 scalars (matmul_tiled.wgsl,
// matmul_gemv.wgsl, matmul_blocked.wgsl), prepended by kernels/matmul_kernels.ts (kernelSource);
// matmul_unrolled.wgsl has its own (vec4 loads when K % 4 == 0). matmul_x_swiglu.wgsl is the
// same interface over a SwiGLU gate|up buffer.
//
// Bindings (group 0):
//   0 x : storage read  array<f32>  [M, K], row stride K

@group(0) @binding(0) var<storage, read> x: array<f32>;

// Index of element 0 of X row m; element k of the row is at x_row(m) + k.
fn x_row(m: u32) -> u32 {
  return m * p.k;
}

// Element i of x.
fn load_x1(i: u32) -> f32 {
  return x[i];
}

// Elements base .. base + 3 of x.
fn load_x4(base: u32) -> vec4<f32> {
  return vec4<f32>(x[base], x[base + 1u], x[base + 2u], x[base + 3u]);
}

// The K tail of a row: elements base .. base + rem - 1 of x (rem in 1..3), then zeros (the
// elements past K belong to the next row of X).
fn load_x4_tail(base: u32, rem: u32) -> vec4<f32> {
  return vec4<f32>(
    x[base],
    select(0.0, x[base + 1u], rem > 1u),
    select(0.0, x[base + 2u], rem > 2u),
    0.0,
  );
}
