// gelu_new: GPT-2's tanh approximation of GELU, element-wise.
//   out[i] = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))),  x = inp[i]
// The tanh argument is clamped to [-15, 15] (tanh is +-1 in f32 there) so implementations that
// compute tanh through exp() cannot overflow to inf / inf = NaN.
// Out of place or in place. kernels/elementwise.ts prepends ONE of two preludes, which declare
// the bindings and `store_out`:
//   out of place: 0 inp : storage read array<f32> [count]; 1 out : storage rw array<f32> [count]
//   in place:     0 inp : storage rw   array<f32> [count], also the output
// and appends elementwise.wgsl, the entry point `main` that calls element(i) for i < count.
//
// Bindings (group 0):
//   0 inp : storage read (rw in place)  array<f32>  [count]
//   1 out : storage rw (out of place)   array<f32>  [count]
//   2 p   : uniform                     Params
// Workgroup: 256 invocations, one element each (elementwise.wgsl).
// Dispatch:  ceil(count / 256) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d).

struct Params {
  count: u32,
}

@group(0) @binding(2) var<uniform> p: Params;

const SQRT_2_OVER_PI: f32 = 0.7978845608028654;

fn element_count() -> u32 {
  return p.count;
}

fn element(i: u32) {
  let x = inp[i];
  let u = clamp(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x), -15.0, 15.0);
  store_out(i, 0.5 * x * (1.0 + tanh(u)));
}
