// rope_angle: the rotary angle pos * f reduced to [-pi, pi], shared by the kernels that apply
// RoPE (rope_and_cache.wgsl; the fused decode attention, paged_attention_decode_rope.wgsl), which
// prepend it, so both rotate by the same f32 angle.
//
// Precision of the angle: pos and inv_freq are each split into two 12-bit halves, the four
// partial products are exact in f32, and each is reduced modulo 2 pi = TWO_PI_HI + TWO_PI_LO
// (TWO_PI_HI has 8 significant bits, so k * TWO_PI_HI is exact for k < 2^16). The reduced
// angle is accurate to a few 1e-6 rad for pos < 2^24 with inv_freq <= 1; cos and sin only see
// arguments in [-pi, pi]. Rounding pos * inv_freq to f32 first would cost up to 2^-10 rad at
// a = 32768.
//
// No bindings; functions only.

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
