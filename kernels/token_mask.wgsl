// token_mask: structured outputs. Tokens a grammar does not allow get a logit of MASKED, before
// logits processing and sampling, in the rows of the constrained sequences only.
//   for m < num_masked, v < vocab:  if bit v of masks[m] is 0:  logits[rows[m], v] = MASKED
// masks[m] is an allowed-token bitmask of `words` u32 (bit v % 32 of word v / 32; the layout of
// xgrammar's getNextTokenBitmask). MASKED is -1e30, not -inf: softmax gives such tokens
// probability 0, every later step of the sampler (penalties, bias, temperature) keeps them far
// below any allowed logit, and a log-probability stays a finite JSON number.
//
// Bindings (group 0):
//   0 logits : storage rw    array<f32>  [num_rows, vocab] (row stride vocab)
//   1 masks  : storage read  array<u32>  [num_masked, words], words >= ceil(vocab / 32)
//   2 rows   : storage read  array<u32>  [num_masked] logits row of each mask
//   3 p      : uniform       Params
// Workgroup: 256 invocations, one logit each.
// Dispatch:  num_masked * ceil(vocab / 256) workgroups as a 1-D grid folded into (x, y)
//            (kernels/dispatch.ts dispatch1d); workgroup g is mask g / chunks, chunk g % chunks.

struct Params {
  num_masked: u32,
  vocab: u32,
  words: u32,
}

const MASKED: f32 = -1e30;

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;
@group(0) @binding(1) var<storage, read> masks: array<u32>;
@group(0) @binding(2) var<storage, read> rows: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let chunks = (p.vocab + 255u) / 256u;
  let g = wid.x + wid.y * nwg.x;
  let m = g / chunks;
  let v = (g - m * chunks) * 256u + lid;
  if (m >= p.num_masked || v >= p.vocab) {
    return;
  }
  let word = masks[m * p.words + v / 32u];
  if ((word & (1u << (v % 32u))) == 0u) {
    logits[rows[m] * p.vocab + v] = MASKED;
  }
}
