// token_feed: the next step's input token ids, taking previously sampled ids straight from the
// GPU (no readback):
//   ids[t] = sampled[host_ids[t] & 0x7fffffff]   if bit 31 of host_ids[t] is set
//   ids[t] = host_ids[t]                          otherwise
// host_ids is written by the host each step (prompt tokens, or 0x80000000 | s to take the token
// sampled for sequence s in the previous step); sampled is the previous `sample` output.
// An index past the end of `sampled` yields 0 (never an out-of-bounds read).
//
// Bindings (group 0):
//   0 host_ids : storage read   array<u32>  [tokens]
//   1 sampled  : storage read   array<u32>  [num_sampled]
//   2 ids      : storage rw     array<u32>  [tokens]
//   3 p        : uniform        Params
// Workgroup: 64 invocations, one token each.
// Dispatch:  ceil(tokens / 64) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d).

struct Params {
  tokens: u32,
}

@group(0) @binding(0) var<storage, read> host_ids: array<u32>;
@group(0) @binding(1) var<storage, read> sampled: array<u32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let t = (wid.x + wid.y * nwg.x) * 64u + lid;
  if (t >= p.tokens) {
    return;
  }
  let h = host_ids[t];
  var id = h;
  if ((h & 0x80000000u) != 0u) {
    let s = h & 0x7fffffffu;
    id = select(0u, sampled[min(s, arrayLength(&sampled) - 1u)], s < arrayLength(&sampled));
  }
  ids[t] = id;
}
