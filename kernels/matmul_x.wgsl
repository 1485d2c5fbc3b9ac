// matmul_x: X as the matmul kernels read it (matmul_tiled.wgsl, matmul_gemv.wgsl,
// matmul_blocked.wgsl), prepended by kernels/matmul_kernels.ts (kernelSource) after the binding
// prelude (kernels/matmul_bindings.ts `xAccess`): binding 0 `x` with `fn x1(i: u32) -> f32`
// (element i) and `fn x4(base: u32) -> vec4<f32>` (elements base .. base + 3), f32 scalars, or
// vec4s where K % 4 == 0 (`gemv`: one 16-byte load per vec4 of X, the row starts 4-aligned).
// matmul_unrolled.wgsl has its own. matmul_x_swiglu.wgsl is the same interface over a SwiGLU
// gate|up buffer.
//
// Bindings (group 0, declared by the prelude):
//   0 x : storage read  array<f32> / array<vec4<f32>>  [M, K], row stride K

// Index of element 0 of X row m; element k of the row is at x_row(m) + k.
fn x_row(m: u32) -> u32 {
  return m * p.k;
}

// Element i of x.
fn load_x1(i: u32) -> f32 {
  return x1(i);
}

// Elements base .. base + 3 of x.
fn load_x4(base: u32) -> vec4<f32> {
  return x4(base);
}

// The K tail of a row: elements base .. base + rem - 1 of x (rem in 1..3), then zeros (the
// elements past K belong to the next row of X; past the buffer's end WebGPU's robust access
// reads zeros or the last element, masked here all the same).
fn load_x4_tail(base: u32, rem: u32) -> vec4<f32> {
  return select(vec4<f32>(0.0), x4(base), vec4<bool>(true, rem > 1u, rem > 2u, false));
}
