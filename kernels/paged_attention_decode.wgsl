// paged_attention_decode: attention of ONE new query token per sequence over its paged KV cache,
// optionally split over the context ("split-K": partials merged by paged_attention_merge.wgsl).
//   for sequence s, query head h (kv head kh = h / GROUP), over positions j in the partition
//   [part * partition_size, min(context_lens[s], (part + 1) * partition_size)):
//     x_j   = scale * q(s, h, :) . K(s, j, kh, :)
//     m     = max_j x_j,   l = sum_j exp(x_j - m),   o = sum_j exp(x_j - m) V(s, j, kh, :)
//   split == 0 (one partition covering the context): out(s, h, :) = o / l
//   split == 1: part_out(s, h, part, :) = o (unnormalised), part_ml(s, h, part) = (m, l)
// K(s, j, kh, d) lives at k_cache[((b * num_kv_heads + kh) * block_size + j % block_size)
// * HEAD_DIM + d] with b = block_tables[s * bt_stride + j / block_size]; same for V.
// Softmax is online (running max and sum, rescaled per tile of WG positions), all in f32.
// KVT (4 cache elements: vec4 of f16 / f32, or a u32 of 4 fp8 codes) and kv4 (its values as
// vec4<f32>) come from the KV prelude (kernels/kv_codec.ts kvVec4Prelude).
// Requirements: HEAD_DIM % 4 == 0 and HEAD_DIM <= 256; q_stride % 4 == 0;
// GROUP = num_q_heads / num_kv_heads in 1..8; partition_size a multiple of 16 (split only; a
// partition shorter than a tile is one partial tile).
//
// Prelude constants (kernels/paged_attention_decode.ts; one pipeline per combination):
//   GROUP    : u32  query heads per kv head (1..8)
//   HEAD_DIM : u32  elements per head (multiple of 4, <= 256)
//   UNROLL_K : u32  phase 1 walks an invocation's key row UNROLL_K vec4s at a time, and
//   UNROLL_V : u32  phase 3 its positions UNROLL_V at a time (PAIRS V vec4s each), each group's
//                   loads issued before any is used (the TEMPLATE's dollar-w and dollar-c
//                   lines). Why: with loops of one load each, a tile of 64 positions
//                   took ~23 us on an NVIDIA H200 (the direct path: 0.74 ms for 2,048 tokens,
//                   32 tiles, 2026-11-27), about a memory latency per loop step if each load
//                   waits for its use; the unrolled loops have not run on a GPU yet.
//   WG       : u32  invocations per workgroup and positions per tile: 64, or 256
//                   (kernels/paged_attention_decode.ts DECODE_WIDTHS; the wider one gives a
//                   short context one tile and 4x the invocations, the tuner measures both)
//   FUSED    : bool the fused variant: q/k head norms, RoPE and the new token's K/V write in
//                   the prologue (paged_attention_decode_rope.wgsl, prepended with its bindings
//                   9-13 and `rope_prologue`; the caches then bind read_write); otherwise false
//                   with an empty `rope_prologue`.
// TEMPLATE (kernels/unroll.ts): a line containing the marker dollar-i is emitted once per query
// head i < GROUP, a line containing dollar-r once per output vec4 r < PAIRS of an invocation, one
// containing dollar-w once per w < UNROLL_K and one containing dollar-c once per c < UNROLL_V
// (the loads an invocation issues together); the markers become the numbers. So the per-invocation scores and outputs live in named variables,
// never in arrays in function memory: on an NVIDIA H200 through Deno (wgpu, Vulkan) the array form
// of this kernel took 0.25 ms for one sequence of 512 tokens (8 GB/s of KV; bench/attention_bench.ts,
// 2026-11-26), the same pathology as the matmul register tile (see matmul_tiled.wgsl).
// Bindings (group 0):
//   0 q            : storage read  array<vec4<f32>> [num_seqs, q_stride / 4]; q(s, h, d) at
//                                                    s * q_stride + h * HEAD_DIM + d (f32)
//   1 k_cache      : storage read  array<KVT>       [num_blocks, num_kv_heads, block_size,
//                                                    HEAD_DIM] (read_write when FUSED)
//   2 v_cache      : storage read  array<KVT>       same shape as k_cache (read_write when FUSED)
//   3 block_tables : storage read  array<u32>       [num_seqs, bt_stride] physical block ids
//                  (bt_stride 0: rows located by the io file's table_row)
//   4 context_lens : storage read  array<u32>       [num_seqs] tokens in the cache incl. this one
//   5 out          : storage rw    array<vec4<f32>> [num_seqs, num_q_heads, HEAD_DIM] (split == 0)
//   6 part_out     : storage rw    array<vec4<f32>> [max_seqs, num_q_heads, max_partitions,
//                                                    HEAD_DIM] (split == 1)
//   7 part_ml      : storage rw    array<vec2<f32>> [max_seqs, num_q_heads, max_partitions]
//                                                    (m, l) (split == 1)
//   8 p            : uniform       Params
// Workgroup: WG invocations per (partition, kv head, sequence), handling the GROUP query heads
//   that share the kv head, so K and V are read once for all of them. Per tile of WG positions:
//   phase 1, invocation i scores position i against the GROUP queries (held in workgroup memory)
//   and folds its scores into the running maximum per query (workgroup atomicMax on the scores'
//   order-preserving bits); phase 2, every invocation reads the maxima, rescales (all keep the
//   previous ones) and turns its own position's scores into weights, in parallel (until
//   2026-11-29 invocation g < GROUP walked the tile's scores twice, serially, while the others
//   waited at a barrier); phase 3, each invocation accumulates (query, 4 dims) outputs and,
//   beside them, the sum of the weights over the tile.
//   With P = GROUP * HEAD_DIM / 4 output vec4s: P >= WG gives each invocation ceil(P / WG) of
//   them over all positions; P < WG splits the positions between floor(WG / P) invocation sets
//   whose sums are added at the end.
// Dispatch:  (partitions, num_kv_heads, num_seqs); partitions = 1 when split == 0, else
//   ceil(max context / partition_size). Workgroups past a sequence's context return at once
//   (a sequence with context 0 gets zeros when split == 0).

const TILE: u32 = WG;
const MAX_GROUP: u32 = 8u;
const MAX_D4: u32 = 64u;

const D4: u32 = HEAD_DIM / 4u; // vec4s per head
const P: u32 = GROUP * D4; // output vec4s per workgroup
const PAIRS: u32 = (P + WG - 1u) / WG; // output vec4s per invocation (phase 3)
const SUBS: u32 = max(1u, WG / P); // invocation sets splitting the positions (phase 3)

// Params, the bindings and NEG_BIG: paged_attention_decode_io.wgsl (prepended).

var<workgroup> sh_q: array<vec4<f32>, GROUP * MAX_D4>; // scaled queries [g, d4]
var<workgroup> sh_s: array<f32, HEAD_DIM>; // the fused prologue's staging (its k head)
var<workgroup> sh_w: array<f32, GROUP * TILE>; // softmax weights [g, i]
var<workgroup> sh_alpha: array<f32, MAX_GROUP>; // rescale of the running output, per g
var<workgroup> sh_base: array<u32, 2u * TILE>; // K/V vec4 index of position i, double-buffered
// The running maximum score per g, as order-preserving bits (ordered_bits): the phase-2 reads of a
// tile and the next tile's phase-1 updates are on either side of a barrier.
var<workgroup> sh_max: array<atomic<u32>, MAX_GROUP>;
var<workgroup> sh_red: array<vec4<f32>, WG>; // partial outputs of the invocation sets
var<workgroup> sh_red_l: array<f32, WG>; // their partial weight sums
var<workgroup> sh_len: u32;

// f32 -> u32 preserving order (u32 comparisons of the results order the floats), and back.
fn ordered_bits(f: f32) -> u32 {
  let b = bitcast<u32>(f);
  return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn from_ordered_bits(o: u32) -> f32 {
  return bitcast<f32>(select(~o, o & 0x7fffffffu, (o & 0x80000000u) != 0u));
}

// Stores output vec4 `pair` (query head head0 + pair / D4) of the workgroup: normalised by the
// head's weight sum `l` into out (split == 0) or as a split partial.
fn store_pair(seq: u32, head0: u32, part: u32, pair: u32, v: vec4<f32>, l: f32) {
  let g = pair / D4;
  let row = seq * p.num_q_heads + head0 + g;
  let d4 = pair - g * D4;
  if (p.split == 0u) {
    out[row * D4 + d4] = v / l;
  } else {
    part_out[(row * p.max_partitions + part) * D4 + d4] = v;
  }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let part = wid.x;
  let kvh = wid.y;
  let seq = wid.z;
  if (lid == 0u) {
    sh_len = context_lens[seq];
  }
  let ctx_len = workgroupUniformLoad(&sh_len);
  let start = part * p.partition_size;
  let head0 = kvh * GROUP;
  if (start >= ctx_len) {
    // Nothing to attend to: an empty context gives zeros (split partials are skipped by merge).
    if (p.split == 0u) {
      for (var i = lid; i < P; i += WG) {
        out[(seq * p.num_q_heads + head0) * D4 + i] = vec4<f32>(0.0);
      }
    }
    return;
  }
  let end = start + min(p.partition_size, ctx_len - start);

  // Queries of the GROUP heads, pre-multiplied by the scale. The fused variant norms and rotates
  // them first and, in the workgroup holding the new position, writes its K and V to the cache
  // (paged_attention_decode_rope.wgsl).
  if (FUSED) {
    rope_prologue(seq, kvh, head0, lid, end == ctx_len);
  } else {
    for (var i = lid; i < P; i += WG) {
      let g = i / D4;
      let d4 = i - g * D4;
      sh_q[g * MAX_D4 + d4] = p.scale * q[(seq * p.q_stride + (head0 + g) * HEAD_DIM) / 4u + d4];
    }
  }

  // Phase-3 role of this invocation: output vec4s first + r * WG of position set `sub`.
  let sub = lid / P;
  let first = lid - sub * P;
  var m_run$i = NEG_BIG; // running max of query i (every invocation keeps all of them)
  // Its output vec4s, r < PAIRS (valid when below P), their sums and their heads' weight sums.
  let pair$r = first + $ru * WG;
  let pc$r = min(pair$r, P - 1u); // the same, clamped to a real pair for loads
  var acc$r = vec4<f32>(0.0);
  var l$r = 0.0;
  let bt_row = table_row(seq);
  var parity = 0u;
  if (lid < MAX_GROUP) {
    atomicStore(&sh_max[lid], 0u);
  }
  workgroupBarrier();

  for (var t0 = start; t0 < end; t0 += TILE) {
    let n = min(TILE, end - t0);
    // Phase 1: invocation lid scores position t0 + lid against every query of the group.
    var s$i = NEG_BIG;
    if (lid < n) {
      let pos = t0 + lid;
      let blk = pos / p.block_size;
      let off = pos - blk * p.block_size;
      let base = ((block_tables[bt_row + blk] * p.num_kv_heads + kvh) * p.block_size + off) * D4;
      sh_base[parity * TILE + lid] = base;
      var dot$i = 0.0;
      // UNROLL_K vec4s of the key row per iteration, loaded before any is used (past D4: the
      // last one again, its product not added).
      for (var d0 = 0u; d0 < D4; d0 += UNROLL_K) {
        let kd$w = min(d0 + $wu, D4 - 1u);
        let kvec$w = kv4(k_cache[base + kd$w]);
        dot$i += select(0.0, dot(sh_q[$iu * MAX_D4 + kd$w], kvec$w), d0 + $wu < D4);
      }
      s$i = dot$i;
      atomicMax(&sh_max[$iu], ordered_bits(dot$i));
    }
    workgroupBarrier();
    // Phase 2: the new running maxima (every tile has a score per query, so they are real
    // scores), the rescale from the previous ones, and this position's weights.
    let mt$i = from_ordered_bits(atomicLoad(&sh_max[$iu]));
    let alpha$i = exp(m_run$i - mt$i);
    m_run$i = mt$i;
    if (lid < n) { sh_w[$iu * TILE + lid] = exp(s$i - mt$i); }
    if (lid == 0u) { sh_alpha[$iu] = alpha$i; }
    workgroupBarrier();
    // Phase 3: rescale the running outputs and sums, then add this tile's weighted V rows.
    // UNROLL_V positions of the set per iteration, their V vec4s loaded before any is used (past
    // the tile's n: the last position again, with weight 0). Pairs past P compute on a clamped
    // pair and are never stored.
    if (sub < SUBS) {
      if (pair$r < P) { let a = sh_alpha[pair$r / D4]; acc$r *= a; l$r *= a; }
      for (var i0 = sub; i0 < n; i0 += UNROLL_V * SUBS) {
        let vi$c = min(i0 + $cu * SUBS, n - 1u);
        let vb$c = sh_base[parity * TILE + vi$c];
        let vv$r_$c = kv4(v_cache[vb$c + pc$r % D4]);
        let vw$r_$c = select(0.0, sh_w[pc$r / D4 * TILE + vi$c], i0 + $cu * SUBS < n);
        acc$r += vw$r_$c * vv$r_$c;
        l$r += vw$r_$c;
      }
    }
    parity = 1u - parity;
  }

  if (SUBS > 1u && sub < SUBS) {
    sh_red[lid] = acc0;
    sh_red_l[lid] = l0;
  }
  workgroupBarrier();
  if (sub != 0u) {
    return;
  }
  if (SUBS > 1u) {
    for (var j = 1u; j < SUBS; j++) {
      acc0 += sh_red[j * P + first];
      l0 += sh_red_l[j * P + first];
    }
  }
  if (pair$r < P) { store_pair(seq, head0, part, pair$r, acc$r, l$r); }
  // A head's (max, sum) by the invocation holding its first output vec4.
  var m_pair$r = NEG_BIG;
  m_pair$r = select(m_pair$r, m_run$i, pair$r / D4 == $iu);
  let ml$r = (seq * p.num_q_heads + head0 + pair$r / D4) * p.max_partitions + part;
  if (p.split != 0u && pair$r < P && pair$r % D4 == 0u) { part_ml[ml$r] = vec2<f32>(m_pair$r, l$r); }
}
