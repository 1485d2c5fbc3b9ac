// add: element-wise sum of two f32 tensors, the residual connection of GPT-2 blocks.
//   out[i] = a[i] + b[i],  i in [0, count)
// Out of place or in place (a[i] += b[i]); the TS wrapper (kernels/add.ts) prepends ONE of
// these preludes, which declare the bindings that differ and `store_out`:
//   out of place: 0 a : storage read array<f32> [count]; 2 out : storage rw array<f32> [count]
//   in place:     0 a : storage rw   array<f32> [count], also the output
//
// Bindings (group 0):
//   0 a   : storage read (rw in place)  array<f32>  [count]
//   1 b   : storage read                array<f32>  [count]
//   2 out : storage rw (out of place)   array<f32>  [count]
//   3 p   : uniform                     Params
// Workgroup: 256 invocations, one element each.
// Dispatch:  ceil(count / 256) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d).

struct Params {
  count: u32,
}

@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let i = (wid.x + wid.y * nwg.x) * 256u + lid;
  if (i >= p.count) {
    return;
  }
  store_out(i, a[i] + b[i]);
}
