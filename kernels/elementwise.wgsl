// elementwise: the entry point of the one-invocation-per-element kernels (add.wgsl,
// gelu_new.wgsl, gather_rows.wgsl), appended to each kernel file by
// kernels/elementwise.ts. The kernel file declares its Params `p`, its bindings and
//   fn element_count() -> u32   elements of this dispatch (read from p)
//   fn element(i: u32)          computes and stores element i (i < element_count())
// Bindings: the kernel file's (no binding of its own).
// Workgroup: 256 invocations, one element each.
// Dispatch:  ceil(element_count() / 256) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d); invocations past the end return.

@compute @workgroup_size(256)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let i = (wid.x + wid.y * nwg.x) * 256u + lid;
  if (i >= element_count()) {
    return;
  }
  element(i);
}
