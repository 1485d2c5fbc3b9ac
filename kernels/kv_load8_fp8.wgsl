// kv_load8_fp8: 8-element row loads of an fp8 (e4m3) KV cache for the unrolled attention
// kernels, the 8-bit twin of kv_load8_f16.wgsl (same functions and KV8), after
// kv_fp8_e4m3.wgsl. The caches bind as array<KVT> = array<vec2<u32>>, 8 codes per element:
// element i holds elements 8i .. 8i + 7 of the flat cache [num_blocks, num_kv_heads,
// block_size, head_dim] (head_dim % 8 == 0).

alias KVT = vec2<u32>;

// Eight consecutive cache elements as f32: lo = elements 0..3, hi = 4..7.
struct KV8 {
  lo: vec4<f32>,
  hi: vec4<f32>,
}

fn load_k8(i: u32) -> KV8 {
  let w = k_cache[i];
  return KV8(e4m3_unpack4(w.x), e4m3_unpack4(w.y));
}

fn load_v8(i: u32) -> KV8 {
  let w = v_cache[i];
  return KV8(e4m3_unpack4(w.x), e4m3_unpack4(w.y));
}
