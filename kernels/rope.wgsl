// rope: rotary position embedding, rotate-half convention (GPT-NeoX, Hugging Face Llama / Qwen),
// IN PLACE on the fused qkv activations.
// For token t at position pos = positions[t], every head h in [0, heads) and i in [0, half):
//   a  = pos * inv_freq[i]
//   x0 = qkv[base + i], x1 = qkv[base + i + half],  base = offset + t * token_stride + h * head_dim
//   qkv[base + i]        = x0 * cos(a) - x1 * sin(a)
//   qkv[base + i + half] = x1 * cos(a) + x0 * sin(a)
// half = rotary_dim / 2 (rotary_dim = head_dim unless partial rotary); elements
// [rotary_dim, head_dim) of each head and everything outside the addressed heads are untouched.
// In the fused [q | k | v] layout the q heads and then the k heads are contiguous, so one
// dispatch with heads = Hq + Hkv rotates both.
//
// Precision: a is formed and reduced to [-pi, pi] without rounding the large product: pos and
// inv_freq are each split into two 12-bit halves, the four partial products are exact in f32,
// and each is reduced modulo 2 pi = TWO_PI_HI + TWO_PI_LO (TWO_PI_HI has 8 significant bits,
// so k * TWO_PI_HI is exact for k < 2^16). The reduced angle is then accurate to a few 1e-6 rad
// for pos < 2^24 with inv_freq <= 1 and exact reduction up to pos * inv_freq ~ 4e5; cos and sin
// only ever see arguments in [-pi, pi] (where WGSL bounds their error). Rounding the product
// a = pos * inv_freq to f32 first would cost up to ulp(a) / 2 = 2^-10 rad at a = 32768.
//
// Bindings (group 0):
//   0 p         : uniform       Params
//   1 positions : storage read  array<u32>  [tokens]
//   2 inv_freq  : storage read  array<f32>  [half]
//   3 qkv       : storage rw    array<f32>  rows addressed as above
// Workgroup: 256 invocations; invocation (t, i) computes cos / sin once and rotates pair i of
//            every head of token t.
// Dispatch:  ceil(tokens * half / 256) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d).

struct Params {
  tokens: u32,
  heads: u32,
  head_dim: u32,
  half: u32,
  token_stride: u32,
  offset: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> positions: array<u32>;
@group(0) @binding(2) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(3) var<storage, read_write> qkv: array<f32>;

const INV_TWO_PI: f32 = 0.15915494309189535;
const TWO_PI_HI: f32 = 6.28125;
const TWO_PI_LO: f32 = 0.0019353071795864769;

// v minus the nearest multiple of 2 pi; v - k * TWO_PI_HI is exact (Sterbenz) for large v.
fn reduce(v: f32) -> f32 {
  let k = round(v * INV_TWO_PI);
  return (v - k * TWO_PI_HI) - k * TWO_PI_LO;
}

// pos * f reduced to [-pi, pi] (see Precision above).
fn rope_angle(pos: u32, f: f32) -> f32 {
  let p_hi = f32(pos & 0xfffff000u);
  let p_lo = f32(pos & 0xfffu);
  let f_hi = bitcast<f32>(bitcast<u32>(f) & 0xfffff000u);
  let f_lo = f - f_hi;
  let r = reduce(p_hi * f_hi) + reduce(p_hi * f_lo) + reduce(p_lo * f_hi) + p_lo * f_lo;
  return reduce(r);
}

@compute @workgroup_size(256)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let g = (wid.x + wid.y * nwg.x) * 256u + lid;
  if (g >= p.tokens * p.half) {
    return;
  }
  let t = g / p.half;
  let i = g - t * p.half;
  let a = rope_angle(positions[t], inv_freq[i]);
  let c = cos(a);
  let s = sin(a);
  var j = p.offset + t * p.token_stride + i;
  for (var h = 0u; h < p.heads; h++) {
    let x0 = qkv[j];
    let x1 = qkv[j + p.half];
    qkv[j] = x0 * c - x1 * s;
    qkv[j + p.half] = x1 * c + x0 * s;
    j += p.head_dim;
  }
}
