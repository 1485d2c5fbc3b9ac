// kv_load8_f32: 8-element row loads of an f32 KV cache for the unrolled attention kernels, the
// f32 twin of kv_load8_f16.wgsl (same functions and KV8). The caches bind as
// array<KVT> = array<vec4<f32>>; row chunk i (elements 8i .. 8i + 7 of the flat cache
// [num_blocks, num_kv_heads, block_size, head_dim], head_dim % 8 == 0) is elements 2i, 2i + 1.

alias KVT = vec4<f32>;

// Eight consecutive cache elements: lo = elements 0..3, hi = 4..7.
struct KV8 {
  lo: vec4<f32>,
  hi: vec4<f32>,
}

fn load_k8(i: u32) -> KV8 {
  return KV8(k_cache[2u * i], k_cache[2u * i + 1u]);
}

fn load_v8(i: u32) -> KV8 {
  return KV8(v_cache[2u * i], v_cache[2u * i + 1u]);
}

// The fused decode attention's cache write (paged_attention_decode_rope.ts "vec4" layout).
fn kv_pack(v: vec4<f32>) -> KVT {
  return v;
}
