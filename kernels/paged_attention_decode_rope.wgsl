// paged_attention_decode_rope: the prologue of the decode attention's fused variant
// (paged_attention_decode.wgsl or paged_attention_decode_unrolled.wgsl with FUSED = true;
// all-decode steps): the work of rope_and_cache.wgsl for the step's one new token per sequence,
// done by the attention's own workgroups, so the step has no rope_and_cache dispatch per layer.
//   every workgroup (partition, kv head kvh, sequence s), for its GROUP query heads h:
//     x = q row of head h (raw, from the fused [q | k | v] row of s);
//     norm (HAS_NORM): x[j] = x[j] * inverseSqrt(mean(x^2) + eps) * q_norm[j];
//     rope (rotate-half) at positions[s], angle rope_angle.wgsl's;
//     sh_q = scale * y (the attention's queries)
//   the workgroup that owns the new token (its partition holds position context_len - 1):
//     the same for k head kvh with k_norm, then k_cache / v_cache at slot_mapping[s] (skipped when
//     0xFFFFFFFF) = y / the raw v head, as CT; then a storage barrier, so its own tiles read them.
// The arithmetic is rope_and_cache.wgsl's, in the same order (x * scale * w, then the rotation,
// then the attention's scale); the sums of squares are grouped differently (here NORM_LANES
// strided partials of vec4 dots; rope_and_cache per lane, then across lanes), so the two paths
// can differ in the last bits.
// Other partitions of the sequence never read the new position, so only its owner writes it; the
// query heads are normed and rotated by every partition's workgroup (a few hundred FLOPs).
//
// Prelude (kernels/paged_attention_decode_rope.ts ropePrologueSource, joined in by
// kernels/paged_attention_decode.ts): rope_angle.wgsl; kernels/rope_and_cache.ts
// qkNormPrelude (HAS_NORM, NT, norm_weight; q_norm and k_norm at bindings 12 and 13);
// `fn store_kv4(i: u32, k: vec4<f32>, v: vec4<f32>)` (elements 4i .. 4i + 3 of the flat caches,
// as the kernel's KVT holds them); the kernel's constants WG, GROUP, HEAD_DIM, D4, P (= GROUP D4
// query vec4s), MAX_GROUP and MAX_D4, and its workgroup arrays sh_q (>= GROUP MAX_D4 vec4s) and
// sh_s (>= HEAD_DIM f32s), module scope: paged_attention_decode.wgsl or
// paged_attention_decode_unrolled.wgsl.
//
// Bindings (group 0), beside paged_attention_decode.wgsl's (which this variant binds with k_cache
// and v_cache read_write; q is the fused [q | k | v] row of each sequence, q_stride apart, with
// k at num_q_heads * HEAD_DIM and v at (num_q_heads + num_kv_heads) * HEAD_DIM):
//   9  positions    : storage read  array<u32>  [num_seqs] position of each sequence's new token
//   10 inv_freq     : storage read  array<f32>  [HEAD_DIM / 2]
//   11 slot_mapping : storage read  array<u32>  [num_seqs] cache slot of the new token, or
//                                                0xFFFFFFFF (no write)
//   12 q_norm       : storage read  array<NT>   [HEAD_DIM] (HAS_NORM only)
//   13 k_norm       : storage read  array<NT>   [HEAD_DIM] (HAS_NORM only)
// Workgroup and dispatch: the kernel's ((partitions, num_kv_heads, num_seqs); 64 invocations, or
// the unrolled kernel's 8).

@group(0) @binding(9) var<storage, read> positions: array<u32>;
@group(0) @binding(10) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(11) var<storage, read> slot_mapping: array<u32>;

const FUSED: bool = true;
const SKIP_SLOT: u32 = 0xFFFFFFFFu;

// Invocations summing one head's squares (each a strided share of its vec4s), so the sum is a
// chain of HEAD_DIM / 32 + 8 steps rather than HEAD_DIM.
const NORM_LANES: u32 = 8u;

var<workgroup> sh_rms: array<f32, MAX_GROUP + 1u>; // norm scale per head (GROUP: the k head)
var<workgroup> sh_sq: array<f32, (MAX_GROUP + 1u) * NORM_LANES>; // partial sums of squares

// Element d of head g of the prologue: query head g < GROUP in sh_q, the k head (g == GROUP)
// staged in sh_s.
fn head_get(g: u32, d: u32) -> f32 {
  if (g < GROUP) {
    return sh_q[g * MAX_D4 + d / 4u][d % 4u];
  }
  return sh_s[d];
}

// Elements 4 d4 .. 4 d4 + 3 of head g (as head_get).
fn head_get4(g: u32, d4: u32) -> vec4<f32> {
  if (g < GROUP) {
    return sh_q[g * MAX_D4 + d4];
  }
  return vec4<f32>(sh_s[4u * d4], sh_s[4u * d4 + 1u], sh_s[4u * d4 + 2u], sh_s[4u * d4 + 3u]);
}

fn head_set(g: u32, d: u32, v: f32) {
  if (g < GROUP) {
    sh_q[g * MAX_D4 + d / 4u][d % 4u] = v;
  } else {
    sh_s[d] = v;
  }
}

// Leaves sh_q holding the scaled, normed and rotated queries of heads head0 .. head0 + GROUP of
// sequence seq and, when `owner`, the new token's K and V in the caches. Called by every
// invocation of the workgroup (it has barriers); `owner` is uniform.
fn rope_prologue(seq: u32, kvh: u32, head0: u32, lid: u32, owner: bool) {
  let row = seq * p.q_stride;
  for (var i = lid; i < P; i += WG) {
    let g = i / D4;
    let d4 = i - g * D4;
    sh_q[g * MAX_D4 + d4] = q[(row + (head0 + g) * HEAD_DIM) / 4u + d4];
  }
  let k_row = (row + (p.num_q_heads + kvh) * HEAD_DIM) / 4u;
  if (owner) {
    for (var d4 = lid; d4 < D4; d4 += WG) {
      let v = q[k_row + d4];
      sh_s[4u * d4] = v.x;
      sh_s[4u * d4 + 1u] = v.y;
      sh_s[4u * d4 + 2u] = v.z;
      sh_s[4u * d4 + 3u] = v.w;
    }
  }
  workgroupBarrier();
  let heads = GROUP + select(0u, 1u, owner);
  if (HAS_NORM) {
    for (var i = lid; i < heads * NORM_LANES; i += WG) {
      let g = i / NORM_LANES;
      var sum = 0.0;
      for (var d4 = i - g * NORM_LANES; d4 < D4; d4 += NORM_LANES) {
        let v = head_get4(g, d4);
        sum += dot(v, v);
      }
      sh_sq[i] = sum;
    }
  }
  workgroupBarrier();
  if (lid < heads) {
    var scale = 1.0;
    if (HAS_NORM) {
      var sum_sq = 0.0;
      for (var l = 0u; l < NORM_LANES; l++) {
        sum_sq += sh_sq[lid * NORM_LANES + l];
      }
      scale = inverseSqrt(sum_sq / f32(HEAD_DIM) + p.eps);
    }
    sh_rms[lid] = scale;
  }
  workgroupBarrier();
  let half = HEAD_DIM / 2u;
  let pos = positions[seq];
  for (var i = lid; i < heads * half; i += WG) {
    let g = i / half;
    let j = i - g * half;
    let is_q = g < GROUP;
    let a = rope_angle(pos, inv_freq[j]);
    let cs = cos(a);
    let sn = sin(a);
    let s = sh_rms[g];
    let x0 = head_get(g, j) * s * norm_weight(is_q, j);
    let x1 = head_get(g, j + half) * s * norm_weight(is_q, j + half);
    let y0 = x0 * cs - x1 * sn;
    let y1 = x1 * cs + x0 * sn;
    if (is_q) {
      head_set(g, j, p.scale * y0);
      head_set(g, j + half, p.scale * y1);
    } else {
      head_set(g, j, y0);
      head_set(g, j + half, y1);
    }
  }
  workgroupBarrier();
  if (owner) {
    let slot = slot_mapping[seq];
    if (slot != SKIP_SLOT) {
      let block = slot / p.block_size;
      let o = slot - block * p.block_size;
      let dst = ((block * p.num_kv_heads + kvh) * p.block_size + o) * D4;
      let v_row = (row + (p.num_q_heads + p.num_kv_heads + kvh) * HEAD_DIM) / 4u;
      for (var d4 = lid; d4 < D4; d4 += WG) {
        store_kv4(dst + d4, head_get4(GROUP, d4), q[v_row + d4]);
      }
    }
  }
  storageBarrier();
}
