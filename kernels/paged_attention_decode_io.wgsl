// paged_attention_decode_io: the parameters and bindings shared by the two decode attention
// kernels (paged_attention_decode.wgsl, paged_attention_decode_unrolled.wgsl), prepended to
// both by kernels/paged_attention_decode.ts, which writes Params. Shapes are listed in the
// kernels' headers. The cache bindings 1 (k_cache) and 2 (v_cache), `array<KVT>`, are declared
// by kernels/paged_attention_decode.ts beside it (read, or read_write in the variant that writes
// the new token's K and V); KVT, the element type of the caches, is defined around it: kernels/kv_codec.ts's
// (4 elements) for the workgroup kernel, kv_load8_{f16,f32,fp8}.wgsl's for the unrolled one.

// A score no real score reaches (the running max before any position).
const NEG_BIG: f32 = -3.0e38;

struct Params {
  num_q_heads: u32,
  num_kv_heads: u32,
  block_size: u32,
  bt_stride: u32,
  q_stride: u32,
  partition_size: u32,
  max_partitions: u32,
  split: u32,
  scale: f32,
  // Epsilon of the q/k head norms (paged_attention_decode_rope.wgsl only).
  eps: f32,
}

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;
@group(0) @binding(4) var<storage, read> context_lens: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> part_out: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> part_ml: array<vec2<f32>>;
@group(0) @binding(8) var<uniform> p: Params;

// First entry of sequence seq's row of block_tables: seq * bt_stride (packed rows), or, with
// bt_stride 0, the offset held in entry seq (rows kept across steps by the runner, found through
// a header of num_seqs offsets; engine/block_table_rows.ts).
fn table_row(seq: u32) -> u32 {
  if (p.bt_stride == 0u) {
    return block_tables[seq];
  }
  return seq * p.bt_stride;
}
