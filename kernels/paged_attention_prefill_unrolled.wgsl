// paged_attention_prefill_unrolled: the computation of paged_attention_prefill.wgsl (same
// bindings, parameters, tiles and output) for CPU adapters.
//   For sequence s with q_len(s) = cu_q_lens[s + 1] - cu_q_lens[s] new tokens, query i (packed
//   token t = cu_q_lens[s] + i) sits at position pos = context_lens[s] - q_len(s) + i and
//   out(t, h, :) = softmax_j(scale * q(t, h) . K(s, j, kvh)) V(s, j, kvh) over j = 0..pos,
//   kvh = h / GROUP, K/V read through the block table; online softmax in f32, exp2 based.
// Each of the 8 invocations of a workgroup is one query token of the tile (tile_q = 8) and
// holds the GROUP query heads of the workgroup's kv head, their running max / sum and outputs in
// registers; it walks its own keys 0..pos straight from the cache. No workgroup memory, no
// barriers.
//
// TEMPLATE (kernels/unroll.ts): a line containing the marker dollar-i is emitted once per query
// head i < GROUP of the kv head, a line containing dollar-r once per chunk r < D8 of 8 elements
// of a head (held as two vec4: _lo, _hi), a line with both GROUP x D8 times. Why (measured on
// lavapipe, see kernels/paged_attention_prefill.ts): the workgroup kernel's two barriers per
// chunk of keys are coroutine switches there, and its arrays indexed by loop counters run as
// per-lane memory. K and V rows are read 8 elements per load (load_k8 / load_v8).
//
// Prelude (prepended by kernels/paged_attention_prefill.ts): `const GROUP: u32`,
// `const D4: u32` (head_dim / 4), `const D8: u32` (head_dim / 8; head_dim a multiple of 8) and
// kv_load8_{f16,f32,fp8}.wgsl for the KV dtype (KVT, KV8, load_k8, load_v8).
//
// Bindings (group 0): as paged_attention_prefill.wgsl
//   0 q            : storage read  array<vec4<f32>>  q(t, h, d) at t * q_stride + h * D + d
//   1 k_cache      : storage read  array<KVT>   [num_blocks, num_kv_heads, block_size, D]
//                                              (f16: vec4<u32> of 8 packed halves; f32: vec4<f32>)
//   2 v_cache      : storage read  array<KVT>   same shape and type as k_cache
//   3 block_tables : storage read  array<u32>   [num_seqs, bt_stride] physical block ids
//                  (bt_stride 0: rows located by the io file's table_row)
//   4 cu_q_lens    : storage read  array<u32>   [num_seqs + 1] prefix sums of q_len
//   5 context_lens : storage read  array<u32>   [num_seqs] cached tokens incl. this step's
//   6 out          : storage rw    array<vec4<f32>>  [num_tokens, num_q_heads, D]
//   7 p            : uniform       Params (tile_q must be 8)
// Workgroup: 8 invocations, one query token each (rows past the tile compute a copy of the
// tile's last token and do not write).
// Dispatch: num_kv_heads * tiles workgroups as a 1-D grid folded into (x, y), as
// paged_attention_prefill.wgsl: w = wid.x + wid.y * nwg.x, kv head = w % num_kv_heads,
// tile = w / num_kv_heads.

// Params, the bindings, NEG_BIG and workgroup_tile: paged_attention_prefill_io.wgsl (prepended).

@compute @workgroup_size(8)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let tile = workgroup_tile(wid, nwg);
  if (!tile.found) {
    return;
  }
  let kvh = tile.kv_head;
  let live = lid < tile.rows;
  let i = tile.first + min(lid, tile.rows - 1u);
  let t = tile.q0 + i;
  let pos = tile.start_pos + i;

  let qb$i = t * (p.q_stride / 4u) + (kvh * GROUP + $iu) * D4;
  let q$i_$r_lo = q[qb$i + 2u * $ru] * p.scale_log2e;
  let q$i_$r_hi = q[qb$i + 2u * $ru + 1u] * p.scale_log2e;
  var m$i = NEG_BIG;
  var l$i = 0.0;
  var o$i_$r_lo = vec4<f32>(0.0);
  var o$i_$r_hi = vec4<f32>(0.0);
  let bt_row = table_row(tile.seq);
  for (var j = 0u; j <= pos; j++) {
    let blk = j / p.block_size;
    let base = ((block_tables[bt_row + blk] * p.num_kv_heads + kvh) * p.block_size + j - blk * p.block_size) * D8;
    let k$r = load_k8(base + $ru);
    var s$i = 0.0;
    s$i += dot(q$i_$r_lo, k$r.lo) + dot(q$i_$r_hi, k$r.hi);
    let mn$i = max(m$i, s$i);
    let al$i = exp2(m$i - mn$i);
    let e$i = exp2(s$i - mn$i);
    l$i = l$i * al$i + e$i;
    m$i = mn$i;
    let v$r = load_v8(base + $ru);
    o$i_$r_lo = o$i_$r_lo * al$i + e$i * v$r.lo;
    o$i_$r_hi = o$i_$r_hi * al$i + e$i * v$r.hi;
  }
  if (live) {
    let ob$i = (t * p.num_q_heads + kvh * GROUP + $iu) * D4;
    out[ob$i + 2u * $ru] = o$i_$r_lo / l$i;
    out[ob$i + 2u * $ru + 1u] = o$i_$r_hi / l$i;
  }
}
