// paged_attention_prefill: causal varlen attention of a batch of new query tokens over a paged
// KV cache (chunked prefill and prefix-cache hits included), flash-attention style.
//   For sequence s with q_len(s) = cu_q_lens[s + 1] - cu_q_lens[s] new tokens, query i (packed
//   token t = cu_q_lens[s] + i) sits at position pos = context_lens[s] - q_len(s) + i and
//   out(t, h, :) = softmax_j(scale * q(t, h) . K(s, j, kvh)) V(s, j, kvh) over j = 0..pos,
//   with kvh = h / G (G = num_q_heads / num_kv_heads, GQA) and K/V read through the block
//   table. The softmax is online (running max, running sum) in f32, exp2 based.
//
// Bindings (group 0):
//   0 q            : storage read  array<vec4<f32>>  q(t, h, d) at t * q_stride + h * D + d
//                                                    (q_stride >= num_q_heads * D, both % 4 == 0)
//   1 k_cache      : storage read  array<KVT>   [num_blocks, num_kv_heads, block_size, D]
//   2 v_cache      : storage read  array<KVT>   [num_blocks, num_kv_heads, block_size, D]
//   3 block_tables : storage read  array<u32>   [num_seqs, bt_stride] physical block ids
//                  (bt_stride 0: rows located by the io file's table_row)
//   4 cu_q_lens    : storage read  array<u32>   [num_seqs + 1] prefix sums of q_len
//   5 context_lens : storage read  array<u32>   [num_seqs] cached tokens incl. this step's
//   6 out          : storage rw    array<vec4<f32>>  [num_tokens, num_q_heads, D]
//   7 p            : uniform       Params
// Workgroup memory: ks, vs  array<vec4<f32>, KC * D4>  the step's K and V rows as f32;
//   sh_s  array<f32, KC * WG>  each row's scores of the step (key j of row lid at j * WG + lid).
// KVT (4 cache elements) and kv4 (them as vec4<f32>) come from the KV prelude
// (kernels/kv_codec.ts kvVec4Prelude). The prelude also defines
//   const D4: u32   head_dim / 4 (head_dim a multiple of 4, at most 256)
//   const KC: u32   keys per step: staged in workgroup memory, scored, then one online-softmax
//                   rescale of the running max / sum / accumulator ((2 * D + WG) * KC * 4 bytes
//                   of workgroup memory)
//   const WG: u32   the workgroup size.
//   const STAGE_U: u32  K / V vec4s an invocation loads per staging iteration, all before it
//                   stores any (kernels/paged_attention_prefill.ts stageUnroll).
//
// TEMPLATE (kernels/unroll.ts): a line containing the marker dollar-r is emitted once per
// r < D4 (the row's q and accumulator are D4 named vec4s, not arrays: on NVIDIA through Deno a
// register tile in an array indexed by loop counters ran 10-40x slower, docs/kernels.md), one
// containing dollar-w once per w < STAGE_U.
//
// Work split: a workgroup owns one (q tile, kv head): a tile is up to `tile_q` consecutive query
// tokens of ONE sequence, and the workgroup's WG invocations are the rows (query i, head g of
// the kv head's group) of the tile, row r = i * G + g (tile_q = floor(WG / G); rows past the
// tile idle and compute a copy of the last row, unwritten). Every row keeps its scaled q vector
// and its f32 accumulator in private memory. The key loop runs to the tile's last position in
// steps of KC keys: the workgroup copies the step's K and V rows (through the block table) into
// var<workgroup> as f32, converting each f16 value once per workgroup rather than once per row
// (2 barriers per step), then each row scores the KC keys, masking keys past its own position.
// Measured on lavapipe (f16 KV): reading K/V straight from the cache in every row without
// workgroup memory or barriers was 1.7x slower; packing several rows per invocation was slower.
// A row's scores of the step go to its own column of sh_s (only it reads them: no barrier).
// Tiles are numbered sequence by sequence (ceil(q_len / tile_q) each); a workgroup finds its
// sequence by walking cu_q_lens, so no host-built tile table is needed.
//
// Dispatch: num_kv_heads * tiles workgroups, tiles >= sum_s ceil(q_len(s) / tile_q) (extra
// workgroups exit), as a 1-D grid folded into (x, y) (kernels/dispatch.ts dispatch1d); linear
// workgroup index w = wid.x + wid.y * nwg.x, kv head = w % num_kv_heads, tile = w / num_kv_heads.

// Params, the bindings, NEG_BIG and workgroup_tile: paged_attention_prefill_io.wgsl (prepended).

var<workgroup> ks: array<vec4<f32>, KC * D4>;
var<workgroup> vs: array<vec4<f32>, KC * D4>;
var<workgroup> sh_s: array<f32, KC * WG>;

@compute @workgroup_size(WG)
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
  let rows = tile.rows;
  // Keys 0..kv_end-1 cover every row of the tile (uniform across the workgroup).
  let kv_end = tile.start_pos + tile.first + rows;

  let group = p.num_q_heads / p.num_kv_heads;
  let live = lid < rows * group;
  // Idle rows compute a copy of the tile's last row and do not write.
  let r = select(rows * group - 1u, lid, live);
  let i = tile.first + r / group;
  let h = kvh * group + r % group;
  let t = tile.q0 + i;
  let pos = tile.start_pos + i;

  let q_base = t * (p.q_stride / 4u) + h * D4;
  let qv$r = q[q_base + $ru] * p.scale_log2e;
  var acc$r = vec4<f32>(0.0);
  var m = NEG_BIG;
  var l = 0.0;
  let bt_row = table_row(tile.seq);

  for (var k0 = 0u; k0 < kv_end; k0 += KC) {
    let kn = min(KC, kv_end - k0);
    // Stage the chunk's K and V rows in workgroup memory as f32 (converted once per workgroup).
    workgroupBarrier();
    // STAGE_U vec4s of K and of V per invocation at a time, all loaded before any is stored
    // (past the chunk: its last key again, not stored).
    for (var e0 = lid; e0 < kn * D4; e0 += WG * STAGE_U) {
      let se$w = e0 + $wu * WG;
      let sg$w = kv_vec4(bt_row, kvh, k0 + min(se$w / D4, kn - 1u), se$w % D4);
      let sk$w = k_cache[sg$w];
      let sv$w = v_cache[sg$w];
      if (se$w < kn * D4) { ks[se$w] = kv4(sk$w); vs[se$w] = kv4(sv$w); }
    }
    workgroupBarrier();
    var cmax = NEG_BIG;
    for (var j = 0u; j < kn; j++) {
      let kb = j * D4;
      var dot = vec4<f32>(0.0);
      dot += qv$r * ks[kb + $ru];
      let sc = select(NEG_BIG, dot.x + dot.y + dot.z + dot.w, k0 + j <= pos);
      sh_s[j * WG + lid] = sc;
      cmax = max(cmax, sc);
    }
    // Key 0 is in the first step and never masked, so m is a real score from then on.
    let m_new = max(m, cmax);
    let corr = exp2(m - m_new);
    m = m_new;
    l *= corr;
    acc$r *= corr;
    for (var j = 0u; j < kn; j++) {
      let pj = select(0.0, exp2(sh_s[j * WG + lid] - m_new), k0 + j <= pos);
      l += pj;
      let vb = j * D4;
      acc$r += pj * vs[vb + $ru];
    }
  }

  if (live) {
    let inv = 1.0 / l;
    let o_base = (t * p.num_q_heads + h) * D4;
    out[o_base + $ru] = acc$r * inv;
  }
}
