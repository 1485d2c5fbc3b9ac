// embedding: gathers table rows by token id, one dispatch per part of a split table.
//   out[t, c] = table[ids[t], c]          (ACCUMULATE = false: token embeddings)
//   out[t, c] += table[ids[t], c]         (ACCUMULATE = true: GPT-2's learned position
//                                          embeddings, with ids = positions)
// The table is a GpuMatrix [vocab, hidden] whose rows may be split across several buffers
// (engine/gpu/tensor.ts). This dispatch sees one part, rows [row_start, row_start + part_rows),
// and writes only the tokens whose id falls in it. An id >= vocab yields a zero row, written
// only by the dispatch with zero_writer = 1 (the first part), so together the dispatches write
// every element exactly once (with ACCUMULATE such rows are left unchanged: += 0).
// Table values come from `fn table_at(row: u32, c: u32) -> f32` (prelude, kernels/embedding.ts):
// element c of the part's row `row` converted to f32, from f16 / f32 storage or dequantized from
// int8 / int4
// (gpu/quant.ts: w' = q * scale, the scales at binding 4).
//
// Bindings (group 0):
//   0 p      : uniform       Params
//   1 ids    : storage read  array<u32>  [tokens]
//   2 table  : storage read  array<WT> [part_rows, row_stride] (one part; row_stride >= hidden),
//                            or array<u32> of packed int8 / int4 values [part_rows, hidden]
//                            (gpu/quant.ts word layouts), or texture_2d_array<u32> of those words
//                            (rgba32uint, 4 per texel: layout "texture")
//   3 out    : storage rw    array<f32>  [tokens, hidden]
//   4 scales : storage read  array<u32>  f16 pairs [ceil(part_rows / 8) * 8 * hidden / 32] in
//                                        blocks of 8 rows (gpu/quant.ts; quantized only)
// Override: ACCUMULATE (bool, default false).
// Workgroup: 256 invocations, one output element each; a workgroup covers 256 columns of one
//            token, so the id test is uniform across it.
// Dispatch:  tokens * ceil(hidden / 256) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d); workgroup g is token g / chunks, chunk g % chunks.

struct Params {
  tokens: u32,
  hidden: u32,
  row_stride: u32,
  row_start: u32,
  part_rows: u32,
  vocab: u32,
  zero_writer: u32,
}

override ACCUMULATE: bool = false;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let chunks = (p.hidden + 255u) / 256u;
  let g = wid.x + wid.y * nwg.x;
  let t = g / chunks;
  let c = (g - t * chunks) * 256u + lid;
  if (t >= p.tokens || c >= p.hidden) {
    return;
  }
  let i = t * p.hidden + c;
  let id = ids[t];
  if (id >= p.vocab) {
    if (p.zero_writer != 0u && !ACCUMULATE) {
      out[i] = 0.0;
    }
    return;
  }
  if (id < p.row_start || id - p.row_start >= p.part_rows) {
    return;
  }
  let v = table_at(id - p.row_start, c);
  if (ACCUMULATE) {
    out[i] += v;
  } else {
    out[i] = v;
  }
}
