// matmul_tiled_w8: the W tile items of matmul_tiled.wgsl (`WItem`, `WSTEP`, `load_item`,
// `put_w`) for int8 / int4 weights, 8 weights per load: item e of the tile is weight row bn + e /
// (BK / 8), elements k0 + 8 (e % (BK / 8)) .. + 7, read by one `load_w8` (int4: one u32 word and
// one f16 scale; int8: one vec2<u32> and one scale) and written, transposed, to 8 lines of ws.
// The vec4 staging it replaces reads one word and one scale per 4 weights (two invocations load
// the same int4 word): twice the loads of f16's one vec2<u32> per 4 weights, in the
// barrier-bound K loop. Measured on an NVIDIA H200 before it (2026-11-26, bench/model_bench.ts):
// prefill 512 ran at 0.50x of f16 with int4 weights and 0.47x with int8.
//
// FRAGMENT: kernels/matmul_kernels.ts puts this file in place of the part of matmul_tiled.wgsl
// between its "W STAGING BEGIN" and "W STAGING END" lines (BK % 8 == 0; the rest of that kernel,
// single or double buffered, is shared).
//
// Prelude (besides matmul_tiled.wgsl's): the weight bindings `w` and `w_scales` with
// `fn load_w8(row: u32, q: u32) -> mat2x4<f32>` (kernels/matmul_weight_bindings.ts weightBinding8:
// elements 8q .. 8q + 7 of row `row`, dequantized; K % 32 == 0).

alias WItem = mat2x4<f32>;
const WSTEP: u32 = 8u;

// Item q of weight row n (weights 8q .. 8q + 7), dequantized; q below the row's items.
fn load_item(n: u32, q: u32) -> WItem {
  return load_w8(n, q);
}

// Item e, transposed, into the W tile at wo: 8 lines of ws.
fn put_w(wo: u32, e: u32, v: WItem) {
  if (e < W_ITEMS) {
    let s = item_slot(wo, e);
    ws[s.x][s.y] = v[0].x;
    ws[s.x + WL][s.y] = v[0].y;
    ws[s.x + 2u * WL][s.y] = v[0].z;
    ws[s.x + 3u * WL][s.y] = v[0].w;
    ws[s.x + 4u * WL][s.y] = v[1].x;
    ws[s.x + 5u * WL][s.y] = v[1].y;
    ws[s.x + 6u * WL][s.y] = v[1].z;
    ws[s.x + 7u * WL][s.y] = v[1].w;
  }
}
