// logit_row: the helpers shared by the kernels that read rows of logits (sample.wgsl,
// top_logprobs.wgsl, logits_process.wgsl), prepended to each by kernels/logit_row.ts (which also
// expands the ROW_SCAN lines of sample and top_logprobs, see there).
// Bindings: none.

// Finite sentinels (WGSL constants cannot be infinite): -inf logits compare below NEG_INF.
const NEG_INF: f32 = -0x1.fffffep+127f;
const POS_INF: f32 = 0x1.fffffep+127f;

/// Order-preserving map f32 -> u32 (a < b  <=>  key(a) < key(b)); -0 maps like +0. Finite and
/// infinite values map to keys > 0 (key 0 is never a real value).
fn order_key(x: f32) -> u32 {
  let b = select(bitcast<u32>(x), 0u, x == 0.0);
  return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

/// 32-bit integer finaliser (bijective): sample's counter-based RNG, logits_process's table hash.
fn mix32(x: u32) -> u32 {
  var h = x;
  h ^= h >> 16u;
  h *= 0x7feb352du;
  h ^= h >> 15u;
  h *= 0x846ca68bu;
  h ^= h >> 16u;
  return h;
}
