// paged_attention_prefill_io: the parameters, bindings and work lookup shared by the two
// prefill attention kernels (paged_attention_prefill.wgsl, paged_attention_prefill_unrolled.wgsl),
// prepended to both by kernels/paged_attention_prefill.ts, which writes Params. Shapes are
// listed in the kernels' headers. Needs the alias KVT, the
// element type of the caches, defined around it: kernels/kv_codec.ts's (4 elements) for the
// workgroup kernels, kv_load8_{f16,f32,fp8}.wgsl's for the unrolled one; and `const D4: u32` (head_dim / 4).

// A score no real score reaches; masked keys get it and then weight 0.
const NEG_BIG: f32 = -3.0e38;

struct Params {
  num_seqs: u32,
  num_q_heads: u32,
  num_kv_heads: u32,
  // Elements of q from one token to the next.
  q_stride: u32,
  block_size: u32,
  // Row stride of block_tables.
  bt_stride: u32,
  // Query tokens per tile.
  tile_q: u32,
  // Tiles dispatched (per kv head).
  num_tiles: u32,
  // Softmax scale times log2(e) (the kernels use exp2).
  scale_log2e: f32,
}

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_cache: array<KVT>;
@group(0) @binding(2) var<storage, read> v_cache: array<KVT>;
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;
@group(0) @binding(4) var<storage, read> cu_q_lens: array<u32>;
@group(0) @binding(5) var<storage, read> context_lens: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(7) var<uniform> p: Params;

// First entry of sequence seq's row of block_tables: seq * bt_stride (packed rows), or, with
// bt_stride 0, the offset held in entry seq (rows kept across steps by the runner, found through
// a header of num_seqs offsets; engine/block_table_rows.ts).
fn table_row(seq: u32) -> u32 {
  if (p.bt_stride == 0u) {
    return block_tables[seq];
  }
  return seq * p.bt_stride;
}

// The work of one workgroup: one tile of up to tile_q consecutive query tokens of one
// sequence, for one kv head.
struct Tile {
  // False when the tile index is past the last sequence's tiles (the workgroup exits).
  found: bool,
  kv_head: u32,
  seq: u32,
  // Packed index of the sequence's first new token.
  q0: u32,
  // Position of the sequence's first new token: context_lens[seq] - q_len.
  start_pos: u32,
  // The tile's first query (counted within the sequence) and its query count.
  first: u32,
  rows: u32,
}

// The tile of workgroup w = wid.x + wid.y * nwg.x: kv head w % num_kv_heads, tile index
// w / num_kv_heads. Tiles are numbered sequence by sequence (ceil(q_len / tile_q) each): walks
// cu_q_lens to find the tile, so no host-built tile table is needed. Uniform across the
// workgroup.
fn workgroup_tile(wid: vec3u, nwg: vec3u) -> Tile {
  let w = wid.x + wid.y * nwg.x;
  let kvh = w % p.num_kv_heads;
  var tile = w / p.num_kv_heads;
  if (tile < p.num_tiles) {
    for (var seq = 0u; seq < p.num_seqs; seq++) {
      let q0 = cu_q_lens[seq];
      let q_len = cu_q_lens[seq + 1u] - q0;
      let n = (q_len + p.tile_q - 1u) / p.tile_q;
      if (tile < n) {
        let first = tile * p.tile_q;
        let start_pos = context_lens[seq] - q_len;
        return Tile(true, kvh, seq, q0, start_pos, first, min(p.tile_q, q_len - first));
      }
      tile -= n;
    }
  }
  return Tile(false, kvh, 0u, 0u, 0u, 0u, 0u);
}

// Query vec4 d4 of row r of a tile whose rows are (query, head of the kv head's group) pairs,
// row r = i * group + g, scaled by scale_log2e; rows past the tile's last repeat it.
fn tile_query(tile: Tile, r: u32, d4: u32) -> vec4<f32> {
  let group = p.num_q_heads / p.num_kv_heads;
  let rr = min(r, tile.rows * group - 1u);
  let t = tile.q0 + tile.first + rr / group;
  let h = tile.kv_head * group + rr % group;
  return q[t * (p.q_stride / 4u) + h * D4 + d4] * p.scale_log2e;
}

// Index of K / V vec4 d4 of key `key` of kv head kvh in the caches (as KVT vec4s), the sequence's
// block-table row starting at bt_row (table_row).
fn kv_vec4(bt_row: u32, kvh: u32, key: u32, d4: u32) -> u32 {
  let block = block_tables[bt_row + key / p.block_size];
  return ((block * p.num_kv_heads + kvh) * p.block_size + key % p.block_size) * D4 + d4;
}
