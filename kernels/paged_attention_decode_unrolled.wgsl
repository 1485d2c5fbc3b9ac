// paged_attention_decode_unrolled: the computation of paged_attention_decode.wgsl (same
// bindings, parameters, grid and outputs, split-K partials included) for CPU adapters.
//   for sequence s, query head h (kv head kh = h / GROUP), over positions j in the partition
//   [part * partition_size, min(context_lens[s], (part + 1) * partition_size)):
//     x_j = scale * q(s, h, :) . K(s, j, kh, :),  m = max_j x_j,  l = sum_j exp(x_j - m),
//     o = sum_j exp(x_j - m) V(s, j, kh, :)
//   split == 0: out(s, h, :) = o / l;  split == 1: part_out(s, h, part, :) = o, part_ml = (m, l)
// The 8 invocations of a workgroup take every 8th position of the partition, each with its own
// online softmax (running max and sum) and output for the GROUP query heads in registers; one
// barrier at the end merges the 8 partial results by log-sum-exp.
//
// TEMPLATE (kernels/unroll.ts): a line containing the marker dollar-i is emitted once per query
// head i < GROUP of the kv head, a line containing dollar-r once per chunk r < D8 of 8 elements
// of a head (held as two vec4: _lo, _hi), a line with both GROUP x D8 times. So the queries and
// outputs live in named variables and the position loop has no inner loops. Why (measured on
// lavapipe, see kernels/paged_attention_decode.ts): the workgroup kernel's three barriers per
// tile of 64 positions are coroutine switches there, and its loops over arrays run as per-lane
// memory. K and V rows are read 8 elements per load (load_k8 / load_v8).
//
// Fused variant (FUSED, kernels/paged_attention_decode_rope.ts: the cpu profile's all-decode
// steps): paged_attention_decode_rope.wgsl's `rope_prologue` first norms and rotates the GROUP
// queries into sh_q (scaled) and, in the workgroup holding the new position, writes its K and V
// to the caches (then a storage barrier); every invocation loads the queries from sh_q, and a
// barrier follows before sh_q is reused for the outputs.
//
// Prelude (prepended by kernels/paged_attention_decode.ts): `const GROUP: u32` (query heads
// per kv head), `const HEAD_DIM: u32` (a multiple of 8), `const D4: u32` (= HEAD_DIM / 4),
// `const D8: u32` (= HEAD_DIM / 8), kv_load8_{f16,f32,fp8}.wgsl for the KV dtype (KVT, KV8,
// load_k8, load_v8), and `const FUSED: bool` with `fn rope_prologue(seq, kvh, head0, lid,
// owner)` (paged_attention_decode_rope.wgsl, or empty). Requires WG * GROUP * D4 * 16 bytes of
// workgroup memory (<= 16 KiB: GROUP * HEAD_DIM <= 512), and for FUSED the prologue's own
// (sh_s, HEAD_DIM f32s, and its norm sums).
//
// Bindings (group 0): as paged_attention_decode.wgsl
//   0 q            : storage read  array<vec4<f32>> q(s, h, d) at s * q_stride + h * HEAD_DIM + d
//   1 k_cache      : storage read  array<KVT>       [num_blocks, num_kv_heads, block_size, HEAD_DIM]
//                                                    (f16: vec4<u32> of 8 packed halves; f32:
//                                                    vec4<f32>; fp8: vec2<u32> of 8 codes)
//   2 v_cache      : storage read  array<KVT>       same shape and type as k_cache
//   3 block_tables : storage read  array<u32>       [num_seqs, bt_stride] physical block ids
//                  (bt_stride 0: rows located by the io file's table_row)
//   4 context_lens : storage read  array<u32>       [num_seqs] tokens in the cache incl. this one
//   5 out          : storage rw    array<vec4<f32>> [num_seqs, num_q_heads, HEAD_DIM] (split == 0)
//   6 part_out     : storage rw    array<vec4<f32>> [max_seqs, num_q_heads, max_partitions,
//                                                    HEAD_DIM] (split == 1)
//   7 part_ml      : storage rw    array<vec2<f32>> [max_seqs, num_q_heads, max_partitions]
//                                                    (m, l) (split == 1)
//   8 p            : uniform       Params
// Workgroup: 8 invocations per (partition, kv head, sequence).
// Dispatch:  (partitions, num_kv_heads, num_seqs), as paged_attention_decode.wgsl.

const WG: u32 = 8u;
// The prologue's shapes (paged_attention_decode_rope.wgsl): query vec4s, heads and head vec4s.
const P: u32 = GROUP * D4;
const MAX_GROUP: u32 = GROUP;
const MAX_D4: u32 = D4;
// Params, the bindings and NEG_BIG: paged_attention_decode_io.wgsl (prepended).

var<workgroup> sh_ml: array<vec2<f32>, WG * GROUP>; // (max, sum) per [invocation, g]
// Outputs per [invocation, g, d4]; FUSED: first the scaled queries per [g, d4].
var<workgroup> sh_q: array<vec4<f32>, WG * GROUP * D4>;

// Vec4 d4 of query head g (its elements at qb * 4 of q when not FUSED), times the scale.
fn query4(g: u32, qb: u32, d4: u32) -> vec4<f32> {
  if (FUSED) {
    return sh_q[g * MAX_D4 + d4];
  }
  return p.scale * q[qb + d4];
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let part = wid.x;
  let kvh = wid.y;
  let seq = wid.z;
  let ctx_len = context_lens[seq];
  let start = part * p.partition_size;
  let head0 = kvh * GROUP;
  if (start >= ctx_len) {
    // Nothing to attend to (the same for the whole workgroup): an empty context gives zeros
    // (split partials are skipped by merge).
    if (p.split == 0u) {
      for (var t = lid; t < GROUP * D4; t += WG) {
        out[(seq * p.num_q_heads + head0) * D4 + t] = vec4<f32>(0.0);
      }
    }
    return;
  }
  let end = start + min(p.partition_size, ctx_len - start);

  // The GROUP queries, pre-multiplied by the scale (FUSED: normed and rotated first, and the new
  // position's K and V written by the workgroup that holds it).
  if (FUSED) {
    rope_prologue(seq, kvh, head0, lid, end == ctx_len);
  }
  let qb$i = (seq * p.q_stride + (head0 + $iu) * HEAD_DIM) / 4u;
  let q$i_$r_lo = query4($iu, qb$i, 2u * $ru);
  let q$i_$r_hi = query4($iu, qb$i, 2u * $ru + 1u);
  if (FUSED) {
    // Every invocation holds its queries before sh_q takes the outputs.
    workgroupBarrier();
  }
  var m$i = NEG_BIG;
  var l$i = 0.0;
  var o$i_$r_lo = vec4<f32>(0.0);
  var o$i_$r_hi = vec4<f32>(0.0);
  let bt_row = table_row(seq);
  for (var pos = start + lid; pos < end; pos += WG) {
    let blk = pos / p.block_size;
    let off = pos - blk * p.block_size;
    let base = ((block_tables[bt_row + blk] * p.num_kv_heads + kvh) * p.block_size + off) * D8;
    let k$r = load_k8(base + $ru);
    var s$i = 0.0;
    s$i += dot(q$i_$r_lo, k$r.lo) + dot(q$i_$r_hi, k$r.hi);
    let mn$i = max(m$i, s$i);
    let al$i = exp(m$i - mn$i);
    let e$i = exp(s$i - mn$i);
    l$i = l$i * al$i + e$i;
    m$i = mn$i;
    let v$r = load_v8(base + $ru);
    o$i_$r_lo = o$i_$r_lo * al$i + e$i * v$r.lo;
    o$i_$r_hi = o$i_$r_hi * al$i + e$i * v$r.hi;
  }

  // Merge the 8 invocations' partial softmaxes (an invocation without positions has max
  // NEG_BIG and weight 0; invocation 0 always has one).
  sh_ml[lid * GROUP + $iu] = vec2<f32>(m$i, l$i);
  sh_q[(lid * GROUP + $iu) * D4 + 2u * $ru] = o$i_$r_lo;
  sh_q[(lid * GROUP + $iu) * D4 + 2u * $ru + 1u] = o$i_$r_hi;
  workgroupBarrier();
  for (var t = lid; t < GROUP * D4; t += WG) {
    let g = t / D4;
    let d4 = t - g * D4;
    var mx = NEG_BIG;
    for (var j = 0u; j < WG; j++) {
      mx = max(mx, sh_ml[j * GROUP + g].x);
    }
    var l = 0.0;
    var o = vec4<f32>(0.0);
    for (var j = 0u; j < WG; j++) {
      let ml = sh_ml[j * GROUP + g];
      let w = exp(ml.x - mx);
      l += w * ml.y;
      o += w * sh_q[(j * GROUP + g) * D4 + d4];
    }
    let row = seq * p.num_q_heads + head0 + g;
    if (p.split == 0u) {
      out[row * D4 + d4] = o / l;
    } else {
      part_out[(row * p.max_partitions + part) * D4 + d4] = o;
      if (d4 == 0u) {
        part_ml[row * p.max_partitions + part] = vec2<f32>(mx, l);
      }
    }
  }
}
