// paged_attention_merge: combines the split-K partials of paged_attention_decode.wgsl by
// log-sum-exp. For sequence s, query head h, with P = ceil(context_lens[s] / partition_size)
// partitions, partial i holding (m_i, l_i) and the unnormalised output o_i:
//   M = max_i m_i,   out(s, h, :) = sum_i exp(m_i - M) o_i / sum_i exp(m_i - M) l_i
//
// Bindings (group 0):
//   0 context_lens : storage read  array<u32>       [num_seqs]
//   1 part_out     : storage read  array<vec4<f32>> [max_seqs, num_q_heads, max_partitions,
//                                                    head_dim]
//   2 part_ml      : storage read  array<vec2<f32>> [max_seqs, num_q_heads, max_partitions] (m, l)
//   3 out          : storage rw    array<vec4<f32>> [num_seqs, num_q_heads, head_dim]
//   4 p            : uniform       Params
// Prelude (kernels/paged_attention_decode.ts): `const UNROLL: u32`, the partials whose loads an
// invocation issues together. TEMPLATE (kernels/unroll.ts): a line containing dollar-c is
// emitted once per c < UNROLL, the marker replaced by the number.
// Workgroup: 64 invocations per (sequence, query head), each writing 4 output dims at a time
//   (head_dim / 4 <= 64 means one vec4 each); no barriers.
// Dispatch:  num_seqs * num_q_heads workgroups as a 1-D grid folded into (x, y)
//   (kernels/dispatch.ts dispatch1d).

struct Params {
  num_seqs: u32,
  num_q_heads: u32,
  head_dim: u32,
  partition_size: u32,
  max_partitions: u32,
}

@group(0) @binding(0) var<storage, read> context_lens: array<u32>;
@group(0) @binding(1) var<storage, read> part_out: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> part_ml: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let row = wid.x + wid.y * nwg.x; // seq * num_q_heads + head
  if (row >= p.num_seqs * p.num_q_heads) {
    return;
  }
  let seq = row / p.num_q_heads;
  let parts = (context_lens[seq] + p.partition_size - 1u) / p.partition_size;
  let ml0 = row * p.max_partitions;
  // UNROLL partials per iteration, their loads issued before any is used (past the last
  // partial: the last one again, which changes no maximum and is weighted 0 in the sums).
  var m = -3.0e38;
  for (var i0 = 0u; i0 < parts; i0 += UNROLL) {
    let mi$c = part_ml[ml0 + min(i0 + $cu, parts - 1u)].x;
    m = max(m, mi$c);
  }
  var l = 0.0;
  for (var i0 = 0u; i0 < parts; i0 += UNROLL) {
    let pm$c = part_ml[ml0 + min(i0 + $cu, parts - 1u)];
    l += select(0.0, exp(pm$c.x - m) * pm$c.y, i0 + $cu < parts);
  }
  let inv_l = select(0.0, 1.0 / l, l > 0.0);
  let d4s = p.head_dim / 4u;
  for (var d4 = lid; d4 < d4s; d4 += 64u) {
    var o = vec4<f32>(0.0);
    for (var i0 = 0u; i0 < parts; i0 += UNROLL) {
      let j$c = ml0 + min(i0 + $cu, parts - 1u);
      let e$c = select(0.0, exp(part_ml[j$c].x - m), i0 + $cu < parts);
      let v$c = part_out[j$c * d4s + d4];
      o += e$c * v$c;
    }
    out[row * d4s + d4] = o * inv_l;
  }
}
