// gather_rows: copies selected rows of a matrix into a compact one.
//   out[i, c] = src[indices[i] * cols + c]      for i < rows, c < cols
// The engine uses it to pick the last token of each sequence that samples this step out of the
// [tokens, hidden] residual stream before the final norm and the LM head (logits are computed
// only for rows that are sampled). kernels/elementwise.ts appends elementwise.wgsl, the entry
// point `main` that calls element(i) for i < rows * cols.
//
// Bindings (group 0):
//   0 src     : storage read   array<f32>  [src_rows, cols]
//   1 indices : storage read   array<u32>  [rows]   (each < src_rows)
//   2 out     : storage rw     array<f32>  [rows, cols]
//   3 p       : uniform        Params
// Workgroup: 256 invocations, one output element each (elementwise.wgsl).
// Dispatch:  ceil(rows * cols / 256) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d).

struct Params {
  rows: u32,
  cols: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> indices: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

fn element_count() -> u32 {
  return p.rows * p.cols;
}

fn element(i: u32) {
  let r = i / p.cols;
  let c = i - r * p.cols;
  out[i] = src[indices[r] * p.cols + c];
}
