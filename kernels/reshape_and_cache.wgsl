// reshape_and_cache: writes this step's new K and V vectors into the paged KV cache.
//   for every token t with slot_mapping[t] != 0xFFFFFFFF, kv head h, dim d:
//     slot = slot_mapping[t], block = slot / block_size, o = slot % block_size
//     k_cache[((block * num_kv_heads + h) * block_size + o) * head_dim + d]
//       = src[t * src_stride + k_offset + h * head_dim + d]   (rounded to the KV dtype)
//     v_cache[...same index...] = src[t * src_stride + v_offset + h * head_dim + d]
// src is normally the fused [q | k | v] projection output (k_offset = Hq * D,
// v_offset = (Hq + Hkv) * D, src_stride = (Hq + 2 Hkv) * D), read in place.
// KVT (4 cache elements: vec4 of f16 / f32, or a u32 of 4 fp8 codes) and kv_pack come from the
// KV prelude (kernels/kv_codec.ts kvVec4Prelude).
// Requires head_dim, src_stride, k_offset and v_offset to be multiples of 4.
//
// Bindings (group 0):
//   0 src          : storage read   array<f32>       [tokens, src_stride]
//   1 slot_mapping : storage read   array<u32>       [tokens]; 0xFFFFFFFF = skip the token
//   2 k_cache      : storage rw     array<KVT>       [num_blocks, num_kv_heads, block_size,
//                                                     head_dim] elements of the KV dtype
//   3 v_cache      : storage rw     array<KVT>       same shape as k_cache
//   4 p            : uniform        Params
// Workgroup: 64 invocations, one (token, kv head, 4 dims) each.
// Dispatch:  ceil(tokens * num_kv_heads * head_dim / 4 / 64) workgroups as a 1-D grid folded
//            into (x, y) (kernels/dispatch.ts dispatch1d).

struct Params {
  tokens: u32,
  num_kv_heads: u32,
  head_dim: u32,
  block_size: u32,
  src_stride: u32,
  k_offset: u32,
  v_offset: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> slot_mapping: array<u32>;
@group(0) @binding(2) var<storage, read_write> k_cache: array<KVT>;
@group(0) @binding(3) var<storage, read_write> v_cache: array<KVT>;
@group(0) @binding(4) var<uniform> p: Params;

fn load4(base: u32) -> KVT {
  return kv_pack(vec4<f32>(src[base], src[base + 1u], src[base + 2u], src[base + 3u]));
}

@compute @workgroup_size(64)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let d4s = p.head_dim / 4u;
  let per_token = p.num_kv_heads * d4s;
  let i = (wid.x + wid.y * nwg.x) * 64u + lid;
  if (i >= p.tokens * per_token) {
    return;
  }
  let t = i / per_token;
  let r = i - t * per_token; // h * d4s + d4
  let slot = slot_mapping[t];
  if (slot == 0xFFFFFFFFu) {
    return;
  }
  let block = slot / p.block_size;
  let o = slot - block * p.block_size;
  let h = r / d4s;
  let d4 = r - h * d4s;
  let dst = ((block * p.num_kv_heads + h) * p.block_size + o) * d4s + d4;
  let base = t * p.src_stride + r * 4u;
  k_cache[dst] = load4(base + p.k_offset);
  v_cache[dst] = load4(base + p.v_offset);
}
