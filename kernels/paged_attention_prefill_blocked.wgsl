// paged_attention_prefill_blocked: the computation of paged_attention_prefill.wgsl (same
// bindings, parameters and output) as flash attention with register blocks, for GPUs.
//   For sequence s with q_len(s) new tokens, query i (packed token t = cu_q_lens[s] + i) at
//   position pos = context_lens[s] - q_len(s) + i:
//   out(t, h, :) = softmax_j(scale * q(t, h) . K(s, j, kvh)) V(s, j, kvh) over j = 0..pos,
//   kvh = h / G (G = num_q_heads / num_kv_heads); online softmax in f32, exp2 based.
//
// Work split: a workgroup of 64 invocations owns one (q tile, kv head): BR = 8 * RR rows, row
// r = i * G + g (query i of the tile, head g of the kv head's group; tile_q = floor(BR / G); rows
// past the tile compute a copy of its last row, unwritten). Invocation lid is (ty, tx) =
// (lid / 8, lid % 8); it owns rows ty + 8a (a < RR) for the whole kernel, and per step of BK =
// 8 * KR keys the keys tx + 8b (b < KR) of the scores and the output vec4s tx + 8c (c < OD =
// ceil(D4 / 8)). Unlike paged_attention_prefill_tiled.wgsl (one invocation per row and part,
// about one workgroup load per vec4 multiply-add, a row's softmax by one invocation), a vec4 step
// of the scores costs RR + KR loads for RR x KR dot products and one of the outputs RR weights
// and OD V vec4s for RR x OD multiply-adds (at 4 x 4: half a load each), and the softmax is
// shared by the row's 8 invocations.
// Per step (4 barriers):
//   1. the step's K and V rows are staged in workgroup memory in the cache's type (keys past the
//      tile's last position as zeros);
//   2. the invocation's RR x KR scores in registers (masked keys: NEG_BIG); their maximum per
//      row to sh_m[row, tx];
//   3. the row's maximum over its 8 invocations: the rescale of the running sums and output
//      (registers), the weights to sh_s[row, key], each invocation's part of the row sum;
//   4. the output block rescaled and accumulated from the weights and V rows.
// At the end the 8 parts of each row sum go through sh_m. Nothing lives in function-scope
// arrays (docs/kernels.md): the blocks are named variables (TEMPLATE below).
//
// TEMPLATE (kernels/unroll.ts): a line containing dollar-r is emitted once per r < RR (rows),
// dollar-i once per i < KR (keys of a step), dollar-c once per c < OD (output vec4s), dollar-w
// once per w < STAGE_U (K / V vec4s an invocation stages at a time).
//
// Prelude (prepended by kernels/paged_attention_prefill.ts): the KV prelude (kernels/kv_codec.ts
// kvVec4Prelude: KVT, 4 cache elements; WT4, the stage dtype's vec4; kv4, kv_stage); `const D4:
// u32` (head_dim / 4), `const BR: u32` (8 * RR), `const BK: u32` (8 * KR), `const STAGE_U: u32`
// (kernels/paged_attention_prefill.ts stageUnroll); paged_attention_prefill_io.wgsl (Params,
// bindings, workgroup_tile, tile_query).
//
// Bindings (group 0): as paged_attention_prefill.wgsl
//   0 q            : storage read  array<vec4<f32>>  q(t, h, d) at t * q_stride + h * D + d
//   1 k_cache      : storage read  array<KVT>   [num_blocks, num_kv_heads, block_size, D]
//   2 v_cache      : storage read  array<KVT>   same shape as k_cache
//   3 block_tables : storage read  array<u32>   [num_seqs, bt_stride] physical block ids
//                  (bt_stride 0: rows located by the io file's table_row)
//   4 cu_q_lens    : storage read  array<u32>   [num_seqs + 1] prefix sums of q_len
//   5 context_lens : storage read  array<u32>   [num_seqs] cached tokens incl. this step's
//   6 out          : storage rw    array<vec4<f32>>  [num_tokens, num_q_heads, D]
//   7 p            : uniform       Params (tile_q = floor(BR / G))
// Workgroup memory (rows padded to QS = D4 + 1 vec4s and SS = BK + 1 scores, so the 8
// invocations of a row group read 8 distinct banks): sh_q [BR * QS] vec4<f32> (scaled queries),
//   ks / vs [BK * QS] WT4 (the step's K and V), sh_s [BR * SS] f32 (weights), sh_m [BR * 8] f32
//   (row maxima, then row sums, by tx): 16 * BR * QS + 2 * BK * QS * sizeof(WT4)
//   + 4 * BR * (SS + 8) bytes.
// Dispatch: num_kv_heads * tiles workgroups as a 1-D grid folded into (x, y), as
//   paged_attention_prefill.wgsl (kernels/dispatch.ts dispatch1d).

const QS: u32 = D4 + 1u;
const SS: u32 = BK + 1u;

var<workgroup> sh_q: array<vec4<f32>, BR * QS>;
var<workgroup> ks: array<WT4, BK * QS>;
var<workgroup> vs: array<WT4, BK * QS>;
var<workgroup> sh_s: array<f32, BR * SS>;
var<workgroup> sh_m: array<f32, BR * 8>;

@compute @workgroup_size(64)
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
  let group = p.num_q_heads / p.num_kv_heads;
  let nrows = tile.rows * group;
  // Keys 0..kv_end-1 cover every row of the tile (uniform across the workgroup).
  let kv_end = tile.start_pos + tile.first + tile.rows;

  // The tile's queries, scaled, row by row (rows past the tile repeat its last row).
  for (var e = lid; e < BR * D4; e += 64u) {
    sh_q[(e / D4) * QS + e % D4] = tile_query(tile, e / D4, e % D4);
  }
  let ty = lid / 8u;
  let tx = lid % 8u;
  let row$r = ty + 8u * $ru;
  let pos$r = tile.start_pos + tile.first + min(row$r, nrows - 1u) / group;
  let key$i = tx + 8u * $iu;
  // Output vec4s of this invocation (clamped for reads; stores check < D4).
  let od$c = min(tx + 8u * $cu, D4 - 1u);
  var o$r_$c = vec4<f32>(0.0);
  var m$r = NEG_BIG;
  var l$r = 0.0;
  let bt_row = table_row(tile.seq);

  for (var k0 = 0u; k0 < kv_end; k0 += BK) {
    let kn = min(BK, kv_end - k0);
    workgroupBarrier();
    // STAGE_U vec4s of K and of V per invocation at a time, all loaded before any is stored
    // (keys past the step's kn: its last key loaded again, zeros stored).
    for (var e0 = lid; e0 < BK * D4; e0 += 64u * STAGE_U) {
      let se$w = e0 + $wu * 64u;
      let sj$w = se$w / D4;
      let sg$w = kv_vec4(bt_row, kvh, k0 + min(sj$w, kn - 1u), se$w % D4);
      let sk$w = select(WT4(0.0), kv_stage(k_cache[sg$w]), sj$w < kn);
      let sv$w = select(WT4(0.0), kv_stage(v_cache[sg$w]), sj$w < kn);
      if (se$w < BK * D4) { ks[sj$w * QS + se$w % D4] = sk$w; vs[sj$w * QS + se$w % D4] = sv$w; }
    }
    workgroupBarrier();
    var s$r_$i = 0.0;
    for (var d = 0u; d < D4; d++) {
      let q$r = sh_q[row$r * QS + d];
      let kk$i = vec4<f32>(ks[key$i * QS + d]);
      s$r_$i += dot(q$r, kk$i);
    }
    s$r_$i = select(NEG_BIG, s$r_$i, key$i < kn && k0 + key$i <= pos$r);
    var mx$r = m$r;
    mx$r = max(mx$r, s$r_$i);
    sh_m[row$r * 8u + tx] = mx$r;
    workgroupBarrier();
    for (var t = 0u; t < 8u; t++) {
      mx$r = max(mx$r, sh_m[row$r * 8u + t]);
    }
    // Key 0 is in the first step and never masked, so m is a real score from then on.
    let corr$r = exp2(m$r - mx$r);
    m$r = mx$r;
    l$r *= corr$r;
    let w$r_$i = select(0.0, exp2(s$r_$i - mx$r), s$r_$i > NEG_BIG);
    l$r += w$r_$i;
    sh_s[row$r * SS + key$i] = w$r_$i;
    workgroupBarrier();
    o$r_$c *= corr$r;
    for (var j = 0u; j < kn; j++) {
      let w$r = sh_s[row$r * SS + j];
      let vc$c = vec4<f32>(vs[j * QS + od$c]);
      o$r_$c += w$r * vc$c;
    }
  }
  // Each row's sum: the parts of its 8 invocations (sh_m was last read before the last step's
  // fourth barrier).
  sh_m[row$r * 8u + tx] = l$r;
  workgroupBarrier();
  var lt$r = 0.0;
  for (var t = 0u; t < 8u; t++) {
    lt$r += sh_m[row$r * 8u + t];
  }
  let head$r = kvh * group + row$r % group;
  let ob$r = ((tile.q0 + tile.first + row$r / group) * p.num_q_heads + head$r) * D4;
  if (row$r < nrows && tx + 8u * $cu < D4) { out[ob$r + tx + 8u * $cu] = o$r_$c / lt$r; }
}
