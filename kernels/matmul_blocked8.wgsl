// matmul_blocked8: Y = X W^T (+ bias), barrier-free, 8 weight elements per load, for CPU adapters.
//   y[m, n0 + n] = sum_k x[m, k] * w[n, k] (+ bias[n0 + n])   for m < M, n < rows, k < K
// One invocation computes an MB x RN block of Y (MB rows of X against RN consecutive rows of W).
// Per step of 8 along k it loads 8 weights of each of its RN rows with ONE 16-byte load per row
// (vec4<u32> of packed f16 pairs, or two vec4<f32>), then each X row's 8 values once, reused
// for all RN weight rows. Why this shape (measured on lavapipe, see kernels/matmul.ts): inside a
// loop lavapipe turns every storage load into a per-lane loop over its 32-bit components, so
// the cost is the number of load instructions and components, not bytes; wide weight loads and
// X loads shared by 8 rows cut both about in half against matmul_blocked.wgsl.
// Requires rowStride % 8 == 0 (whole 8-element steps inside every row; the padding is zero).
//
// Prelude (prepended by kernels/matmul.ts): `const MB: u32` (X rows per invocation),
// `const RN: u32` (W rows per invocation), `const WG: u32` (workgroup size), the weight binding
// `w` with `fn load_w8(i: u32) -> mat2x4<f32>` (the 8 weights of 8-element step i counted from
// the start of the part: columns 0 and 1 are elements 0..3 and 4..7) and
// `fn bias_at(n: u32) -> f32` (with the bias binding when there is one).
//
// Bindings (group 0):
//   0 x    : storage read  array<f32>               [M, K], row stride K
//   1 w    : storage read  array<vec4<u32>> (f16: 8 packed halves) or array<vec4<f32>> (f32)
//            [rows, rowStride] one GpuMatrix part, rowStride % 8 == 0, padding zero
//   2 bias : storage read  array<f32>               [N] (whole bias; only with bias)
//   3 y    : storage rw    array<f32>               [M, ldy]; columns [n0, n0 + rows) written
//   4 p    : uniform       Params (k4 = rowStride / 4)
// Workgroup: WG invocations, each RN rows of W x MB rows of X.
// Dispatch:  ceil(rows / (WG * RN)) workgroups folded into (x, y) (index wid.x + wid.y * nwg.x,
//            count p.groups_n), times ceil(M / MB) in z.

struct Params {
  m: u32,
  rows: u32,
  k: u32,
  k4: u32,
  ldy: u32,
  n0: u32,
  groups_n: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let group = wid.x + wid.y * nwg.x;
  if (group >= p.groups_n) {
    return;
  }
  let row0 = (group * WG + lid) * RN;
  if (row0 >= p.rows) {
    return;
  }
  let m0 = wid.z * MB;
  let k8 = p.k4 / 2u;
  // Rows past the end are clamped to the last valid row (read, never stored): no masks in the
  // inner loop.
  var wbase: array<u32, RN>;
  for (var r = 0u; r < RN; r++) {
    wbase[r] = min(row0 + r, p.rows - 1u) * k8;
  }
  var xbase: array<u32, MB>;
  for (var i = 0u; i < MB; i++) {
    xbase[i] = min(m0 + i, p.m - 1u) * p.k;
  }
  var acc: array<array<f32, RN>, MB>;
  let full = p.k / 8u;
  for (var q = 0u; q < full; q++) {
    var wv: array<mat2x4<f32>, RN>;
    for (var r = 0u; r < RN; r++) {
      wv[r] = load_w8(wbase[r] + q);
    }
    for (var i = 0u; i < MB; i++) {
      let b = xbase[i] + q * 8u;
      let x0 = vec4<f32>(x[b], x[b + 1u], x[b + 2u], x[b + 3u]);
      let x1 = vec4<f32>(x[b + 4u], x[b + 5u], x[b + 6u], x[b + 7u]);
      for (var r = 0u; r < RN; r++) {
        acc[i][r] += dot(x0, wv[r][0]) + dot(x1, wv[r][1]);
      }
    }
  }
  // K tail (fewer than 8 elements): the weight padding is zero up to rowStride; X past K is
  // masked to zero (it may be the next row of X).
  if (full * 8u < p.k) {
    let rem = p.k - full * 8u;
    var wv: array<mat2x4<f32>, RN>;
    for (var r = 0u; r < RN; r++) {
      wv[r] = load_w8(wbase[r] + full);
    }
    for (var i = 0u; i < MB; i++) {
      let b = xbase[i] + full * 8u;
      var xt: array<f32, 8>;
      for (var j = 0u; j < 8u; j++) {
        xt[j] = select(0.0, x[b + min(j, rem - 1u)], j < rem);
      }
      let x0 = vec4<f32>(xt[0], xt[1], xt[2], xt[3]);
      let x1 = vec4<f32>(xt[4], xt[5], xt[6], xt[7]);
      for (var r = 0u; r < RN; r++) {
        acc[i][r] += dot(x0, wv[r][0]) + dot(x1, wv[r][1]);
      }
    }
  }
  for (var i = 0u; i < MB; i++) {
    let m = m0 + i;
    if (m >= p.m) {
      break;
    }
    for (var r = 0u; r < RN; r++) {
      let n = row0 + r;
      if (n < p.rows) {
        y[m * p.ldy + p.n0 + n] = acc[i][r] + bias_at(p.n0 + n);
      }
    }
  }
}
