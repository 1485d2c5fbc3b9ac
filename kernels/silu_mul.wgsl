// silu_mul: the SwiGLU activation of Llama / Qwen MLPs.
//   out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i],  silu(x) = x / (1 + exp(-x))
// gate_up is the output of the fused gate/up projection: per token, `inter` gate values then
// `inter` up values. kernels/elementwise.ts appends elementwise.wgsl, the entry point `main` that
// calls element(i) for i < tokens * inter.
//
// Bindings (group 0):
//   0 gate_up : storage read   array<f32>  [tokens, 2 * inter]
//   1 out     : storage rw     array<f32>  [tokens, inter]
//   2 p       : uniform        Params
// Workgroup: 256 invocations, one output element each (elementwise.wgsl).
// Dispatch:  ceil(tokens * inter / 256) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d).

struct Params {
  tokens: u32,
  inter: u32,
}

@group(0) @binding(0) var<storage, read> gate_up: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

fn element_count() -> u32 {
  return p.tokens * p.inter;
}

fn element(i: u32) {
  let t = i / p.inter;
  let c = i - t * p.inter;
  let g = gate_up[t * 2u * p.inter + c];
  let u = gate_up[t * 2u * p.inter + p.inter + c];
  out[i] = g / (1.0 + exp(-g)) * u;
}
