// paged_attention_prefill_tiled: the computation of paged_attention_prefill.wgsl (same bindings,
// parameters and output) split flash-attention style across the workgroup, for GPUs.
//   For sequence s with q_len(s) new tokens, query i (packed token t = cu_q_lens[s] + i) at
//   position pos = context_lens[s] - q_len(s) + i:
//   out(t, h, :) = softmax_j(scale * q(t, h) . K(s, j, kvh)) V(s, j, kvh) over j = 0..pos,
//   kvh = h / G (G = num_q_heads / num_kv_heads); online softmax in f32, exp2 based.
//
// Work split: a workgroup of 64 invocations owns one (q tile, kv head): BR rows, row r = i * G + g
// (query i of the tile, head g of the kv head's group; tile_q = floor(BR / G); rows past the tile
// compute a copy of its last row, unwritten). IPR = 64 / BR invocations share a row: invocation
// lid is row lid / IPR, part lid % IPR. Per step of BK keys (4 barriers):
//   1. the step's K and V rows are staged in workgroup memory as f32 (keys past the tile's last
//      position as zeros);
//   2. each invocation scores its row against keys part, part + IPR, ... (SK = BK / IPR of them)
//      from the row's scaled q (staged once in workgroup memory), writing sh_s[row, key]
//      (masked keys: NEG_BIG);
//   3. the row's first invocation turns its scores into weights: running max m and sum l kept in
//      its registers, the rescale of the row's output in sh_c[row];
//   4. each invocation rescales and accumulates OD = ceil(D4 / IPR) vec4s of its row's output
//      (dims part * OD ..), reading the weights and V rows from workgroup memory.
// Nothing lives in function-scope arrays (on NVIDIA through Deno a register tile in an array
// indexed by loop counters ran 10-40x slower, docs/kernels.md): the output block and the scores
// are named variables (TEMPLATE below), and a row's q is read from workgroup memory.
//
// TEMPLATE (kernels/unroll.ts): a line containing the marker dollar-i is emitted once per
// i < SK (the invocation's keys of a step), a line containing dollar-r once per r < OD (its
// output vec4s), one containing dollar-w once per w < STAGE_U (K / V vec4s it stages at a time).
//
// Prelude (prepended by kernels/paged_attention_prefill.ts): the KV prelude (kernels/kv_codec.ts
// kvVec4Prelude: KVT, 4 cache elements; WT4, the stage dtype's vec4; kv4, kv_stage); `const D4:
// u32` (head_dim / 4), `const BR: u32` (rows per workgroup, 8, 16 or 32), `const BK: u32` (keys per
// step, a multiple of IPR), `const IPR: u32` (64 / BR), `const OD: u32`, `const STAGE_U: u32`
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
// Workgroup memory: sh_q [BR * D4] vec4 (scaled queries), ks / vs [BK * D4] vec4 (the step's K
//   and V as f32), sh_s [BR * BK] f32 (scores, then weights), sh_c / sh_l [BR] f32:
//   16 * D4 * (BR + 2 * BK) + 4 * BR * (BK + 2) bytes.
// Dispatch: num_kv_heads * tiles workgroups as a 1-D grid folded into (x, y), as
//   paged_attention_prefill.wgsl (kernels/dispatch.ts dispatch1d).

var<workgroup> sh_q: array<vec4<f32>, BR * D4>;
var<workgroup> ks: array<vec4<f32>, BK * D4>;
var<workgroup> vs: array<vec4<f32>, BK * D4>;
var<workgroup> sh_s: array<f32, BR * BK>;
var<workgroup> sh_c: array<f32, BR>;
var<workgroup> sh_l: array<f32, BR>;

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
    sh_q[e] = tile_query(tile, e / D4, e % D4);
  }
  let row = lid / IPR;
  let part = lid % IPR;
  let rr = min(row, nrows - 1u);
  let pos = tile.start_pos + tile.first + rr / group;
  let key$i = part + IPR * $iu;
  // Output dims of this invocation (clamped for reads; stores check < D4).
  let od$r = min(part * OD + $ru, D4 - 1u);
  var o$r = vec4<f32>(0.0);
  var m = NEG_BIG;
  var l = 0.0;
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
      let sk$w = select(vec4<f32>(0.0), kv4(k_cache[sg$w]), sj$w < kn);
      let sv$w = select(vec4<f32>(0.0), kv4(v_cache[sg$w]), sj$w < kn);
      if (se$w < BK * D4) { ks[se$w] = sk$w; vs[se$w] = sv$w; }
    }
    workgroupBarrier();
    var dot$i = vec4<f32>(0.0);
    for (var d = 0u; d < D4; d++) {
      let qd = sh_q[rr * D4 + d];
      dot$i += qd * ks[key$i * D4 + d];
    }
    sh_s[row * BK + key$i] = select(NEG_BIG, dot$i.x + dot$i.y + dot$i.z + dot$i.w, key$i < kn && k0 + key$i <= pos);
    workgroupBarrier();
    if (part == 0u) {
      var cmax = NEG_BIG;
      for (var j = 0u; j < BK; j++) {
        cmax = max(cmax, sh_s[row * BK + j]);
      }
      // Key 0 is in the first step and never masked, so m is a real score from then on.
      let m_new = max(m, cmax);
      let corr = exp2(m - m_new);
      var sum = 0.0;
      for (var j = 0u; j < BK; j++) {
        let s = sh_s[row * BK + j];
        let w = select(0.0, exp2(s - m_new), s > NEG_BIG);
        sh_s[row * BK + j] = w;
        sum += w;
      }
      l = l * corr + sum;
      m = m_new;
      sh_c[row] = corr;
    }
    workgroupBarrier();
    let corr = sh_c[row];
    o$r *= corr;
    for (var j = 0u; j < BK; j++) {
      let w = sh_s[row * BK + j];
      o$r += w * vs[j * D4 + od$r];
    }
  }
  if (part == 0u) {
    sh_l[row] = l;
  }
  workgroupBarrier();
  if (row < nrows) {
    let inv = 1.0 / sh_l[row];
    let ob = ((tile.q0 + tile.first + row / group) * p.num_q_heads + kvh * group + row % group) * D4;
    if (part * OD + $ru < D4) { out[ob + part * OD + $ru] = o$r * inv; }
  }
}
