// rope_and_cache: one step's q/k head RMSNorm (Qwen3, optional), rotary position embedding of
// q and k, and the K/V cache write (what reshape_and_cache does), in one dispatch over the fused
// qkv activations [q | k | v]. Row (t, h), h in [0, Hq + 2 Hkv), is head h of token t:
//   x   = qkv[base .. base + head_dim),  base = t * token_stride + h * head_dim
//   norm (NORM variant, q and k heads): x[j] = x[j] / sqrt(mean(x^2) + eps) * w[j], w = q_norm
//        or k_norm [head_dim] (rounded as rms_norm.wgsl rounds: x * scale * w, f32 sums)
//   rope (q and k heads), rotate-half (GPT-NeoX, Hugging Face Llama / Qwen), i in [0, half):
//        a = positions[t] * inv_freq[i], half = head_dim / 2
//        y[i] = x[i] cos(a) - x[i + half] sin(a),  y[i + half] = x[i + half] cos(a) + x[i] sin(a)
//   q heads: y written back IN PLACE into qkv (the attention kernels read q there);
//   k heads: y, and v heads: x, written in the KV dtype to the cache slot s = slot_mapping[t]
//        (skipped when s = 0xFFFFFFFF), head kh in [0, Hkv), d in [0, head_dim):
//        k_cache[((block * Hkv + kh) * block_size + o) * head_dim + d],
//        block = s / block_size, o = s % block_size   (the layout of reshape_and_cache.wgsl)
// The k and v heads of qkv are read only. The angle is rope_angle.wgsl's (prepended; its precision
// is stated there): inv_freq already holds any rope_scaling variant (linear, llama3), computed on
// the host. The decode attention's fused variant (paged_attention_decode_rope.wgsl) does the same
// work for all-decode steps of the gpu profile.
//
// Prelude (kernels/rope_and_cache.ts): the access width: VW elements per access, `XV` (f32 or
// vec4<f32>), `CV` (VW cache elements: an f16 / f32 scalar, or kv_codec.ts's KVT: a vec4, or a
// u32 of 4 fp8 codes), `to_cv(x)` (XV rounded to the KV dtype), `sq(v)` (the sum of squares of
// one XV) and `angles(pos, f)` (rope_angle of each element); in the NORM variant,
// `alias NT` (norm weight type) with bindings 6 and 7; `HAS_NORM`, `norm_weight(is_q, i)` (XV
// unit i of the weight); the shape constants ROW_THREADS, ROWS_PER_WG and norm_rows.wgsl
// (row_lane, row_sum and its workgroup memory, (ROW_THREADS * ROWS_PER_WG + ROWS_PER_WG) f32).
// VW = 4 when head_dim is a multiple of 8 (so each half of a head is whole vec4s): lavapipe runs
// each storage access as a loop over its SIMD lanes, and a 16-byte access costs about a third of
// four 4-byte ones. Indices below (base, dst, c, i, half) count XV units; Params count elements.
//
// Bindings (group 0):
//   0 qkv          : storage rw    array<XV>   [tokens, token_stride]; q heads rewritten
//   1 positions    : storage read  array<u32>  [tokens]
//   2 inv_freq     : storage read  array<XV>   [half]
//   3 slot_mapping : storage read  array<u32>  [tokens]; 0xFFFFFFFF = no cache write
//   4 k_cache      : storage rw    array<CV>   [num_blocks, Hkv, block_size, head_dim]
//   5 v_cache      : storage rw    array<CV>   same shape as k_cache
//   6 q_norm       : storage read  array<NT or vec4<NT>>   [head_dim]   (NORM variant only)
//   7 k_norm       : storage read  array<NT or vec4<NT>>   [head_dim]   (NORM variant only)
//   8 p            : uniform       Params
// Workgroup: ROW_THREADS * ROWS_PER_WG invocations: ROW_THREADS lanes per row (lane l handles
//            units / pairs l, l + ROW_THREADS, ...), ROWS_PER_WG rows; the cpu profile uses
//            1 x 64 (no barrier), the gpu profile 64 x 1 (see rms_norm.ts defaultNormShape).
// Dispatch:  ceil(tokens * (Hq + 2 Hkv) / ROWS_PER_WG) workgroups as a 1-D grid folded into
//            (x, y) (kernels/dispatch.ts dispatch1d).

struct Params {
  tokens: u32,
  hq: u32,
  hkv: u32,
  head_dim: u32,
  token_stride: u32,
  block_size: u32,
  eps: f32,
}

@group(0) @binding(0) var<storage, read_write> qkv: array<XV>;
@group(0) @binding(1) var<storage, read> positions: array<u32>;
@group(0) @binding(2) var<storage, read> inv_freq: array<XV>;
@group(0) @binding(3) var<storage, read> slot_mapping: array<u32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<CV>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<CV>;
@group(0) @binding(8) var<uniform> p: Params;

const SKIP_SLOT: u32 = 0xFFFFFFFFu;
// First XV unit of kv head kh's vector for cache slot s.
fn cache_base(s: u32, kh: u32) -> u32 {
  let block = s / p.block_size;
  let o = s - block * p.block_size;
  return ((block * p.hkv + kh) * p.block_size + o) * (p.head_dim / VW);
}

@compute @workgroup_size(ROW_THREADS * ROWS_PER_WG)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let at = row_lane(wid, nwg, lid);
  let lane = at.lane;
  let heads = p.hq + 2u * p.hkv;
  let units = p.head_dim / VW;
  // No early return before row_sum: with ROW_THREADS > 1 every invocation reaches its barriers.
  let in_range = at.row < p.tokens * heads;
  var t = 0u;
  var h = 0u;
  var base = 0u;
  var sum_sq = 0.0;
  if (in_range) {
    t = at.row / heads;
    h = at.row - t * heads;
    base = (t * p.token_stride + h * p.head_dim) / VW;
    if (HAS_NORM && h < p.hq + p.hkv) {
      for (var c = lane; c < units; c += ROW_THREADS) {
        sum_sq += sq(qkv[base + c]);
      }
    }
  }
  var scale = 1.0;
  if (HAS_NORM) {
    scale = inverseSqrt(row_sum(sum_sq, at) / f32(p.head_dim) + p.eps);
  }
  if (!in_range) {
    return;
  }
  let slot = slot_mapping[t];
  let is_q = h < p.hq;
  if (!is_q && slot == SKIP_SLOT) {
    return;
  }
  if (h >= p.hq + p.hkv) {
    let dst = cache_base(slot, h - p.hq - p.hkv);
    for (var c = lane; c < units; c += ROW_THREADS) {
      v_cache[dst + c] = to_cv(qkv[base + c]);
    }
    return;
  }
  var dst = 0u;
  if (!is_q) {
    dst = cache_base(slot, h - p.hq);
  }
  let half = units / 2u;
  let pos = positions[t];
  for (var i = lane; i < half; i += ROW_THREADS) {
    let a = angles(pos, inv_freq[i]);
    let cs = cos(a);
    let sn = sin(a);
    let x0 = qkv[base + i] * scale * norm_weight(is_q, i);
    let x1 = qkv[base + i + half] * scale * norm_weight(is_q, i + half);
    let y0 = x0 * cs - x1 * sn;
    let y1 = x1 * cs + x0 * sn;
    if (is_q) {
      qkv[base + i] = y0;
      qkv[base + i + half] = y1;
    } else {
      k_cache[dst + i] = to_cv(y0);
      k_cache[dst + i + half] = to_cv(y1);
    }
  }
}
