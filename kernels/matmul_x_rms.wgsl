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
// Prepended by kernels/matmul_kernels.ts (kernelSource) after the prelude that declares
// `const RESIDUAL: bool`, the bindings below and `fn raw1(i: u32) -> f32` (r at element i),
// `fn keep1(i: u32, v: f32)` (h_out[i] = v, or nothing) and `fn gamma_at(k: u32) -> f32`.
// Params (p.k, p.eps) is matmul_io.wgsl's.
//
// Bindings (group 0):
//   0 x     : storage read  array<f32>                       [M, K] the residual stream h
//   6 delta : storage read  array<f32>                       [M, K] (RESIDUAL only)
//   7 gamma : storage read  array<f32> / array<u32> (f16 pairs)  [K] the norm's weight
//   8 h_out : storage rw    array<f32>                       [M, K] r (RESIDUAL only)

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
  let r = vec4<f32>(raw1(base), raw1(base + 1u), raw1(base + 2u), raw1(base + 3u));
  if (keep) {
    keep1(base, r.x);
    keep1(base + 1u, r.y);
    keep1(base + 2u, r.z);
    keep1(base + 3u, r.w);
  }
  let g = vec4<f32>(gamma_at(k), gamma_at(k + 1u), gamma_at(k + 2u), gamma_at(k + 3u));
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
