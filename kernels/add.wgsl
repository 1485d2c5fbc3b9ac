// add: element-wise sum of two f32 tensors, the residual connection of GPT-2 blocks.
//   out[i] = a[i] + b[i],  i in [0, count)
// Out of place or in place (a[i] += b[i]). kernels/elementwise.ts prepends ONE of two preludes,
// which declare the bindings that differ and `store_out`:
//   out of place: 0 a : storage read array<f32> [count]; 2 out : storage rw array<f32> [count]
//   in place:     0 a : storage rw   array<f32> [count], also the output
// and appends elementwise.wgsl, the entry point `main` that calls element(i) for i < count.
//
// Bindings (group 0):
//   0 a   : storage read (rw in place)  array<f32>  [count]
//   1 b   : storage read                array<f32>  [count]
//   2 out : storage rw (out of place)   array<f32>  [count]
//   3 p   : uniform                     Params
// Workgroup: 256 invocations, one element each (elementwise.wgsl).
// Dispatch:  ceil(count / 256) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d).

struct Params {
  count: u32,
}

@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

fn element_count() -> u32 {
  return p.count;
}

fn element(i: u32) {
  store_out(i, a[i] + b[i]);
}
