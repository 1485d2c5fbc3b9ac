// kv_load8_f16: 8-element row loads of an f16 KV cache for the unrolled attention kernels
// (paged_attention_decode_unrolled.wgsl, paged_attention_prefill_unrolled.wgsl), prepended by
// their wrappers. With it the caches bind as array<KVT> = array<vec4<u32>>, 8 packed halves per
// element: on lavapipe a storage load costs about the same per 32-bit component whatever its
// type, so one vec4<u32> (4 components, 8 halves) replaces two vec4<f16> loads (8 components).
// Element i of k_cache / v_cache (declared in the *_io.wgsl prelude) is elements 8i .. 8i + 7
// of the flat cache [num_blocks, num_kv_heads, block_size, head_dim] (head_dim % 8 == 0).

alias KVT = vec4<u32>;

// Eight consecutive cache elements as f32: lo = elements 0..3, hi = 4..7.
struct KV8 {
  lo: vec4<f32>,
  hi: vec4<f32>,
}

fn unpack_kv8(w: vec4<u32>) -> KV8 {
  return KV8(
    vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
    vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
  );
}

fn load_k8(i: u32) -> KV8 {
  return unpack_kv8(k_cache[i]);
}

fn load_v8(i: u32) -> KV8 {
  return unpack_kv8(v_cache[i]);
}
