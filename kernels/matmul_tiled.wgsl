// matmul_tiled: Y = X W^T (+ bias) for prefill (M large), tiled through workgroup memory.
//   y[m, n0 + n] = sum_k x[m, k] * w[n, k] (+ bias[n0 + n])   for m < M, n < rows, k < K
// A workgroup of WX x WY invocations computes a BM x BN tile of Y (BM = WY * TM, BN = WX * TN).
// It walks K in steps of BK: the X tile [BM, BK] and the W tile [BN, BK] (W read as vec4 along
// k) are staged in var<workgroup> transposed to [BK, BM] / [BK, BN], then every invocation
// accumulates its TM x TN register block in f32. Invocation (tx, ty) owns rows ty + i * WY and
// columns tx + j * WX of the tile (strided, so neighbouring invocations read neighbouring
// workgroup words). Out-of-range rows, columns and the K tail load zeros.
//
// X forms with a row statistic (matmul_x_rms.wgsl, X_STAT): invocation lid stages the same X
// rows at every K step (elements lid + j * THREADS of the tile, THREADS % BK == 0), so it adds
// up their squares in registers; after the K loop the partial sums are staged in xs and each
// invocation adds up those of its TM rows and scales their outputs by x_scale.
//
// Prelude (prepended by kernels/matmul_kernels.ts): `const TM, TN, WX, WY, BK: u32`
// (BK % 4 == 0), the weight binding `w` with `fn load_w4(i: u32) -> vec4<f32>` (f16 weights are
// read as packed u32 pairs), `fn bias_at(n: u32) -> f32` (with the bias binding when there is
// one), the X form (x_row, load_x1_stat, x_scale, X_STAT: matmul_x.wgsl or matmul_x_swiglu.wgsl
// with matmul_x_nostat.wgsl, or matmul_x_rms.wgsl) and matmul_io.wgsl (Params, bindings y and
// p, store_y).
//
// Bindings (group 0):
//   0 x    : storage read  array<f32>               [M, K], row stride K (matmul_x.wgsl), or
//            [M, 2K] gate|up read as its SwiGLU (matmul_x_swiglu.wgsl), or the residual
//            stream normalised on the fly (matmul_x_rms.wgsl, bindings 6-8 there)
//   1 w    : storage read  vec4 of f32 / 2 x u32 (f16 pairs)  [rows, rowStride] one GpuMatrix
//            part, rowStride % 4 == 0, padding zero; index = row * k4 + k / 4
//   2 bias : storage read  array<f32>               [N] (whole bias; only with bias)
//   3 y    : storage rw    array<f32>               [M, ldy]; columns [n0, n0 + rows) written
//   4 p    : uniform       Params
// Workgroup: (WX, WY) invocations, TM x TN outputs each.
// Dispatch:  ceil(rows / BN) workgroups folded into (x, y) (index wid.x + wid.y * nwg.x, count
//            p.groups_n), times ceil(M / BM) in z.

// Params, the bindings x, y, p, x_row, load_x1_stat and store_y: the X form and matmul_io.wgsl
// (prepended).

const BM = WY * TM;
const BN = WX * TN;
const THREADS = WX * WY;
// X tile elements each invocation stages per K step.
const XPER = BM * BK / THREADS;

var<workgroup> xs: array<f32, BK * BM>;
var<workgroup> ws: array<f32, BK * BN>;

@compute @workgroup_size(WX, WY)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_id) lid3: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let group = wid.x + wid.y * nwg.x;
  if (group >= p.groups_n) {
    return;
  }
  let bn = group * BN;
  let bm = wid.z * BM;
  let tx = lid3.x;
  let ty = lid3.y;
  var acc: array<array<f32, TN>, TM>;
  // Squares of the X rows this invocation stages (X_STAT), and whether it writes them to the
  // residual stream's next buffer (the first workgroup column of weight part 0: every element of
  // the tile's rows once).
  var sq: array<f32, XPER>;
  let keeper = p.keep != 0u && group == 0u;
  for (var k0 = 0u; k0 < p.k; k0 += BK) {
    // X tile: BM * BK scalars, consecutive invocations walk k (contiguous in memory).
    for (var j = 0u; j < XPER; j++) {
      let e = lid + j * THREADS;
      let mm = e / BK;
      let kk = e % BK;
      let m = bm + mm;
      let k = k0 + kk;
      var v = 0.0;
      if (m < p.m && k < p.k) {
        let xv = load_x1_stat(x_row(m) + k, keeper);
        v = xv.v;
        if (X_STAT) {
          sq[j] += xv.sq;
        }
      }
      xs[kk * BM + mm] = v;
    }
    // W tile: BN * BK / 4 vec4s.
    for (var e = lid; e < BN * BK / 4u; e += THREADS) {
      let nn = e / (BK / 4u);
      let kq = e % (BK / 4u);
      let n = bn + nn;
      let q = k0 / 4u + kq;
      var v = vec4<f32>(0.0);
      if (n < p.rows && q < p.k4) {
        v = load_w4(n * p.k4 + q);
      }
      let o = kq * 4u * BN + nn;
      ws[o] = v.x;
      ws[o + BN] = v.y;
      ws[o + 2u * BN] = v.z;
      ws[o + 3u * BN] = v.w;
    }
    workgroupBarrier();
    for (var kk = 0u; kk < BK; kk++) {
      var a: array<f32, TM>;
      var b: array<f32, TN>;
      for (var i = 0u; i < TM; i++) {
        a[i] = xs[kk * BM + ty + i * WY];
      }
      for (var j = 0u; j < TN; j++) {
        b[j] = ws[kk * BN + tx + j * WX];
      }
      for (var i = 0u; i < TM; i++) {
        for (var j = 0u; j < TN; j++) {
          acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
      }
    }
    workgroupBarrier();
  }
  var scale: array<f32, TM>;
  for (var i = 0u; i < TM; i++) {
    scale[i] = 1.0;
  }
  if (X_STAT) {
    // Row mm's partial sums land where its tile values did: xs[kk * BM + mm], kk < BK.
    for (var j = 0u; j < XPER; j++) {
      let e = lid + j * THREADS;
      xs[(e % BK) * BM + e / BK] = sq[j];
    }
    workgroupBarrier();
    for (var i = 0u; i < TM; i++) {
      var sum = 0.0;
      for (var kk = 0u; kk < BK; kk++) {
        sum += xs[kk * BM + ty + i * WY];
      }
      scale[i] = x_scale(sum);
    }
  }
  for (var i = 0u; i < TM; i++) {
    let m = bm + ty + i * WY;
    if (m >= p.m) {
      break;
    }
    for (var j = 0u; j < TN; j++) {
      let n = bn + tx + j * WX;
      if (n < p.rows) {
        store_y(m, n, acc[i][j] * scale[i]);
      }
    }
  }
}
