// matmul_x_rms: X read as the RMSNorm of the residual stream, so a projection needs no rms_norm
// dispatch before it (the `gemv` and `tiled` kernels only; kernels/matmul_kernels.ts):
//   r[m, k] = h[m, k] (+ delta[m, k] with RESIDUAL, the sub-layer output added to the stream)
//   X[m, k] = r[m, k] * gamma[k] * inverseSqrt(sum_k r[m, k]^2 / K + eps)
// The kernels load r * gamma (load_x1_stat / load_x4_stat / load_x4_tail_stat) together with
// r^2, add the squares up per row across the invocations that loaded the row, and scale each
// row's dot products by x_scale(sum) in their epilogue (the rsqrt factor is common to a row).
// With RESIDUAL, a load flagged `keep` also writes r to h_out, the residual stream's next
// buffer: the kernels flag each element of each row of X exactly once (weight part 0, its first
// workgroup column), and h and h_out are different buffers, so no workgroup reads what another
// writes.
//
// Prepended by kernels/matmul_kernels.ts (kernelSource) after the prelude
// (kernels/matmul_bindings.ts `xRmsPrelude`) that declares the bindings below and
// `fn raw1(i: u32) -> f32` / `fn raw4(base: u32) -> vec4<f32>` (r at element i, at elements
// base .. base + 3), `fn keep1(i: u32, v: f32)` / `fn keep4(base: u32, v: vec4<f32>)` (h_out
// there = v, or nothing), `fn gamma_at(k: u32) -> f32` / `fn gamma4(k: u32) -> vec4<f32>`: x,
// delta and h_out as f32 scalars, or as vec4s where K % 4 == 0 (`gemv`: one 16-byte load or
// store per vec4 and buffer, the rows start 4-aligned). Params (p.k, p.eps) is matmul_io.wgsl's.
//
// Bindings (group 0):
//   0 x     : storage read  array<f32> / array<vec4<f32>>    [M, K] the residual stream h
//   6 delta : storage read  array<f32> / array<vec4<f32>>    [M, K] (residual form only)
//   7 gamma : storage read  array<f32> / array<u32> (f16 pairs)  [K] the norm's weight
//   8 h_out : storage rw    array<f32> / array<vec4<f32>>    [M, K] r (residual form only)

// The kernels reduce the squares (X_STAT) and scale by x_scale.
const X_STAT = true;

// A loaded X value and the square of the value it was normalised from.
struct XLoad1 {
  v: f32,
  sq: f32,
}

// Four loaded X values and the sum of the squares of the values they were normalised from.
struct XLoad4 {
  v: vec4<f32>,
  sq: f32,
}

// Index of element 0 of X row m; element k of the row is at x_row(m) + k.
fn x_row(m: u32) -> u32 {
  return m * p.k;
}

// X element i (= x_row(m) + k, the caller knows k: no division here) before the row's rsqrt
// factor.
fn load_x1_stat(i: u32, k: u32, keep: bool) -> XLoad1 {
  let r = raw1(i);
  if (keep) {
    keep1(i, r);
  }
  return XLoad1(r * gamma_at(k), r * r);
}

// X elements base .. base + 3 of one row (columns k .. k + 3) before the row's rsqrt factor.
fn load_x4_stat(base: u32, k: u32, keep: bool) -> XLoad4 {
  let r = raw4(base);
  if (keep) {
    keep4(base, r);
  }
  let g = gamma4(k);
  return XLoad4(r * g, dot(r, r));
}

// The K tail of a row: elements base .. base + rem - 1 (columns k .. k + rem - 1, rem in 1..3),
// then zeros (past K lies the next row); only the rem elements are kept.
fn load_x4_tail_stat(base: u32, k: u32, rem: u32, keep: bool) -> XLoad4 {
  let r = vec4<f32>(
    raw1(base),
    select(0.0, raw1(base + 1u), rem > 1u),
    select(0.0, raw1(base + 2u), rem > 2u),
    0.0,
  );
  if (keep) {
    for (var j = 0u; j < rem; j++) {
      keep1(base + j, r[j]);
    }
  }
  let g = vec4<f32>(
    gamma_at(k),
    select(0.0, gamma_at(k + 1u), rem > 1u),
    select(0.0, gamma_at(k + 2u), rem > 2u),
    0.0,
  );
  return XLoad4(r * g, dot(r, r));
}

// The rsqrt factor of a row whose squares add up to sum.
fn x_scale(sum: f32) -> f32 {
  return inverseSqrt(sum / f32(p.k) + p.eps);
}
