// matmul_tiled: Y = X W^T (+ bias) for prefill and batched decode (M > 16), tiled through
// workgroup memory, with each invocation's TM x TN register block (TM, TN = 4 or 8) in
// TM * TN / 4 vec4 variables.
//   y[m, n0 + n] = sum_k x[m, k] * w[n, k] (+ bias[n0 + n])   for m < M, n < rows, k < K
// A workgroup of WX x WY invocations computes a BM x BN tile of Y (BM = TM WY, BN = TN WX).
// It walks K in steps of BK: the X tile [BM, BK] and the W tile [BN, BK] (W read as vec4 along
// k) are staged in var<workgroup> transposed to [BK, BM] / [BK, BN], stored as vec4s of four
// consecutive rows / columns (each line of BM / 4 or BN / 4 vec4s padded by one vec4 so the
// transposing writes spread over the banks). Invocation (tx, ty) owns rows TM ty .. TM ty + TM - 1
// and columns TN tx .. TN tx + TN - 1 of the tile: per k it reads RQ = TM / 4 vec4s of X and
// CQ = TN / 4 of W from workgroup memory and does TM TN FMAs. Out-of-range rows, columns and the
// K tail load zeros.
//
// No arrays in function memory: on an NVIDIA H100 / H200 through Deno (wgpu, Vulkan) a register
// block kept in `array<array<f32, 4>, 4>` indexed by loop counters ran 10-40x slower than this
// kernel's named variables (bench/matmul_tune.ts, 2026-11-26: the earlier array form took
// 11.6 ms for Qwen3-0.6B's down projection at M = 64, 35 GFLOP/s). The X staging, XPER elements
// per invocation per K step, is written out line by line by kernels/unroll.ts (lines with the
// marker dollar-i, once per i < XPER) for the same reason, and so are the register block's row
// quads (lines with the marker dollar-r, once per r < RQ: rows TM ty + 4 r .. TM ty + 4 r + 3)
// and column quads (marker dollar-c, once per c < CQ: columns TN tx + 4 c .. TN tx + 4 c + 3).
//
// X forms with a row statistic (matmul_x_rms.wgsl, X_STAT): invocation lid stages the same X
// rows at every K step (elements lid + i * THREADS of the tile, THREADS % BK == 0), so it adds
// up their squares in registers; after the K loop the partial sums are staged in xs and each
// invocation adds up those of its TM rows and scales their outputs by x_scale.
//
// The W tile is staged through `stage_w` (an item's global load: WSTEP weights of one row) and
// `put_w` (its transposed write to ws); invocation lid stages items lid + j THREADS, j < WPER
// (lines with the marker dollar-w, written out by kernels/unroll.ts). Quantized weights (int8 /
// int4) are staged 8 at a time instead: kernels/matmul_kernels.ts puts matmul_tiled_w8.wgsl (its
// WItem, WSTEP, load_item and put_w) in place of the lines between "W STAGING BEGIN" and "W
// STAGING END".
//
// Double buffering (NB = 2, a tile's `db`): xs and ws hold two K steps. Before the loop the first
// step is staged; at each K step every invocation issues the global loads of the next step into
// registers, runs the current step's FMAs from one buffer, then writes the loaded values to the
// other buffer, and one barrier ends the step (the FMAs of a step never wait for its own global
// loads, which the GPU overlaps with the previous step's arithmetic). NB = 1: load, store,
// barrier, FMAs, barrier, as before.
//
// Split-K (SPLIT > 1, a tile's `sk`): grid z holds SPLIT workgroups per tile row of Y, each
// walking one slice of the K steps, ceil(ceil(K / BK) / SPLIT) steps (the last ends at K; one past
// K is empty). Each writes its unscaled partial sums instead of Y: y is then the partial buffer,
//   y[(sk * M + m) * ldy + n0 + n] = sum over slice sk of x[m, k] * w[n, k]   (no bias)
// and, with a row statistic, workgroup column 0 of part 0 writes the slice's sums of squares of
// its rows at y[SPLIT * M * ldy + sk * M + m]; kernels/matmul_split.ts adds the slices up, scales
// and adds the bias. With the residual X form each slice's first workgroup column writes its own
// columns of the residual stream, so each element is still written once.
//
// Prelude (prepended by kernels/matmul_kernels.ts): `const WX, WY, BK, TM, TN, NB, WPER, SPLIT:
// u32` (BK % 4 == 0, TM and TN of 4 or 8, THREADS % BK == 0, (TM WY BK) % THREADS == 0, NB of 1 or
// 2, WPER = ceil(W_ITEMS / THREADS), SPLIT of 1, 2, 4 or 8), the weight binding `w` with
// `fn load_w4(row: u32, q: u32) -> vec4<f32>` (vec4 q of row `row`; f16 weights are read as packed u32 pairs),
// `fn bias_at(n: u32) -> f32` (with the bias binding when there is one), the X form (x_row,
// load_x1_stat, x_scale, X_STAT: matmul_x.wgsl or matmul_x_swiglu.wgsl with
// matmul_x_nostat.wgsl, or matmul_x_rms.wgsl) and matmul_io.wgsl (Params, bindings y and p,
// store_y).
//
// Bindings (group 0):
//   0 x    : storage read  array<f32>               [M, K], row stride K (matmul_x.wgsl), or
//            [M, 2K] gate|up read as its SwiGLU (matmul_x_swiglu.wgsl), or the residual
//            stream normalised on the fly (matmul_x_rms.wgsl, bindings 6-8 there)
//   1 w    : storage read  vec4 of f32 / 2 x u32 (f16 pairs)  [rows, rowStride] one GpuMatrix
//            part, rowStride % 4 == 0, padding zero; index = row * k4 + k / 4
//   2 bias : storage read  array<f32>               [N] (whole bias; only with bias)
//   3 y    : storage rw    array<f32>               [M, ldy]; columns [n0, n0 + rows) written
//            (SPLIT > 1: the partial buffer, f32 [SPLIT, M, ldy] then [SPLIT, M] sums of squares)
//   4 p    : uniform       Params
// Workgroup memory: xs NB * BK * XL and ws NB * BK * WL vec4s.
// Workgroup: (WX, WY) invocations, TM x TN outputs each.
// Dispatch:  ceil(rows / BN) workgroups folded into (x, y) (index wid.x + wid.y * nwg.x, count
//            p.groups_n), times ceil(M / BM) * SPLIT in z.

// Params, the bindings x, y, p, x_row, load_x1_stat and store_y: the X form and matmul_io.wgsl
// (prepended).

const BM = WY * TM;
const BN = WX * TN;
const RQ = TM / 4u;
const CQ = TN / 4u;
const THREADS = WX * WY;
// Line strides of the staged tiles in vec4s (one vec4 of padding).
const XL = WY * RQ + 1u;
const WL = WX * CQ + 1u;

// Buffer b of a K step k0: xs[b BK XL + kk * XL + mm / 4][mm % 4] = X[bm + mm, k0 + kk];
// ws[b BK WL + kk * WL + nn / 4][nn % 4] = W[bn + nn, k0 + kk].
var<workgroup> xs: array<vec4<f32>, NB * BK * XL>;
var<workgroup> ws: array<vec4<f32>, NB * BK * WL>;

// W STAGING BEGIN (quantized weights: matmul_tiled_w8.wgsl instead)
// An item of the W tile: WSTEP consecutive weights of one row, here a vec4 (f16 / f32 weights).
alias WItem = vec4<f32>;
const WSTEP: u32 = 4u;

// Item q of weight row n (weights WSTEP q .. WSTEP q + WSTEP - 1), q below the row's items.
fn load_item(n: u32, q: u32) -> WItem {
  return load_w4(n, q);
}

// Item e, transposed, into the W tile at wo: WSTEP lines of ws.
fn put_w(wo: u32, e: u32, v: WItem) {
  if (e < W_ITEMS) {
    let s = item_slot(wo, e);
    ws[s.x][s.y] = v.x;
    ws[s.x + WL][s.y] = v.y;
    ws[s.x + 2u * WL][s.y] = v.z;
    ws[s.x + 3u * WL][s.y] = v.w;
  }
}
// W STAGING END

// Items of a K step's W tile: item e is weight row bn + e / (BK / WSTEP), its item k0 / WSTEP + e
// % (BK / WSTEP).
const W_ITEMS: u32 = BN * BK / WSTEP;

// Item e's global load; zeros past the part's rows, past the K slice's end ke and past the items
// (an item that starts before K may run into the row's zero padding).
fn stage_w(bn: u32, k0: u32, e: u32, ke: u32) -> WItem {
  let n = bn + e / (BK / WSTEP);
  let q = k0 / WSTEP + e % (BK / WSTEP);
  if (e < W_ITEMS && n < p.rows && WSTEP * q < ke) {
    return load_item(n, q);
  }
  return WItem();
}

// Where item e's first weight goes in the W tile at wo: (vec4 line, component); weight j of the
// item goes WL * j vec4s further.
fn item_slot(wo: u32, e: u32) -> vec2<u32> {
  let nn = e / (BK / WSTEP);
  return vec2<u32>(wo + (e % (BK / WSTEP)) * WSTEP * WL + nn / 4u, nn % 4u);
}

// X[m, k] of the tile (its row statistic too), zero outside rows [0, M) and the K slice's end ke.
fn stage_x(m: u32, k: u32, ke: u32, keep: bool) -> XLoad1 {
  if (m < p.m && k < ke) {
    return load_x1_stat(x_row(m) + k, k, keep);
  }
  return XLoad1(0.0, 0.0);
}

// Y[m, n] of the part (SPLIT == 1), or K slice sk's partial sum of it (split-K: y is the partial
// buffer, see the header).
fn store_out(m: u32, n: u32, sk: u32, v: f32) {
  if (SPLIT == 1u) {
    store_y(m, n, v);
  } else {
    y[(sk * p.m + m) * p.ldy + p.n0 + n] = v;
  }
}

// Stores v (columns n .. n + 3 of row m), skipping columns past the part's rows.
fn store4(m: u32, n: u32, sk: u32, v: vec4<f32>) {
  if (n < p.rows) {
    store_out(m, n, sk, v.x);
  }
  if (n + 1u < p.rows) {
    store_out(m, n + 1u, sk, v.y);
  }
  if (n + 2u < p.rows) {
    store_out(m, n + 2u, sk, v.z);
  }
  if (n + 3u < p.rows) {
    store_out(m, n + 3u, sk, v.w);
  }
}

// Split-K with a row statistic: K slice sk's sums of squares of rows m .. m + 3 (those below M).
fn store_stats(m: u32, sk: u32, sum: vec4<f32>) {
  let base = SPLIT * p.m * p.ldy + sk * p.m;
  for (var j = 0u; j < 4u; j++) {
    if (m + j < p.m) {
      y[base + m + j] = sum[j];
    }
  }
}

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
  // Grid z: SPLIT K slices per tile row of Y.
  let sk = wid.z % SPLIT;
  let bm = (wid.z / SPLIT) * BM;
  // This workgroup's K slice [kb, ke): whole K steps, the last slice ending at K (SPLIT == 1:
  // all of K; a slice past K is empty and writes zeros).
  let ks = ((p.k + BK - 1u) / BK + SPLIT - 1u) / SPLIT * BK;
  let kb = min(p.k, sk * ks);
  let ke = min(p.k, kb + ks);
  let tx = lid3.x;
  let ty = lid3.y;
  // Row TM ty + 4 r + j (j < 4), columns TN tx + 4 c .. + 3 of the block accumulate in
  // acc{r}_{j}_{c}.
  var acc$r_0_$c = vec4<f32>(0.0);
  var acc$r_1_$c = vec4<f32>(0.0);
  var acc$r_2_$c = vec4<f32>(0.0);
  var acc$r_3_$c = vec4<f32>(0.0);
  // The tile elements this invocation stages, lid + i * THREADS for i < XPER: row e / BK, column
  // e % BK at every K step; the sq variables add up their squares (X_STAT; zero otherwise).
  let e$i = lid + $iu * THREADS;
  let xm$i = e$i / BK;
  let xi$i = (e$i % BK) * XL + xm$i / 4u;
  var sq$i = 0.0;
  // Whether this invocation writes the residual stream's next buffer: the first workgroup column
  // of weight part 0 stages every element of its rows once.
  let keeper = p.keep != 0u && group == 0u;
  // Offsets of the buffers the FMAs read (xo, wo); NB == 2 stages the first K step first.
  var xo = 0u;
  var wo = 0u;
  if (NB == 2u) {
    let fx$i = stage_x(bm + xm$i, kb + e$i % BK, ke, keeper);
    sq$i += fx$i.sq;
    xs[xi$i][xm$i % 4u] = fx$i.v;
    let fw$w = stage_w(bn, kb, lid + $wu * THREADS, ke);
    put_w(0u, lid + $wu * THREADS, fw$w);
    workgroupBarrier();
  }
  for (var k0 = kb; k0 < ke; k0 += BK) {
    // The K step loaded now: this one (NB == 1) or the next (NB == 2; zeros past the slice).
    let kl = select(k0, k0 + BK, NB == 2u);
    // X tile: BM * BK scalars, consecutive invocations walk k (contiguous in memory).
    let xv$i = stage_x(bm + xm$i, kl + e$i % BK, ke, keeper);
    sq$i += xv$i.sq;
    // W tile: W_ITEMS items.
    let wv$w = stage_w(bn, kl, lid + $wu * THREADS, ke);
    if (NB == 1u) {
      xs[xi$i][xm$i % 4u] = xv$i.v;
      put_w(0u, lid + $wu * THREADS, wv$w);
      workgroupBarrier();
    }
    for (var kk = 0u; kk < BK; kk++) {
      let b$c = ws[wo + kk * WL + tx * CQ + $cu];
      let a$r = xs[xo + kk * XL + ty * RQ + $ru];
      acc$r_0_$c = fma(vec4<f32>(a$r.x), b$c, acc$r_0_$c);
      acc$r_1_$c = fma(vec4<f32>(a$r.y), b$c, acc$r_1_$c);
      acc$r_2_$c = fma(vec4<f32>(a$r.z), b$c, acc$r_2_$c);
      acc$r_3_$c = fma(vec4<f32>(a$r.w), b$c, acc$r_3_$c);
    }
    if (NB == 2u) {
      // The other buffer: read by no invocation since the last barrier.
      xo = BK * XL - xo;
      wo = BK * WL - wo;
      xs[xo + xi$i][xm$i % 4u] = xv$i.v;
      put_w(wo, lid + $wu * THREADS, wv$w);
    }
    workgroupBarrier();
  }
  var scale$r = vec4<f32>(1.0);
  if (X_STAT) {
    // Row mm's partial sums land where its tile values did: xs[kk * XL + mm / 4][mm % 4].
    xs[xi$i][xm$i % 4u] = sq$i;
    workgroupBarrier();
    var sum$r = vec4<f32>(0.0);
    for (var kk = 0u; kk < BK; kk++) {
      sum$r += xs[kk * XL + ty * RQ + $ru];
    }
    if (SPLIT == 1u) {
      scale$r = vec4<f32>(x_scale(sum$r.x), x_scale(sum$r.y), x_scale(sum$r.z), x_scale(sum$r.w));
    } else if (group == 0u && p.n0 == 0u && tx == 0u) {
      // The slice's partial sums; the reduce scales by the whole row's (kernels/matmul_split.ts).
      store_stats(bm + TM * ty + 4u * $ru, sk, sum$r);
    }
  }
  let n$c = bn + TN * tx + 4u * $cu;
  let m$r = bm + TM * ty + 4u * $ru;
  if (m$r < p.m) { store4(m$r, n$c, sk, acc$r_0_$c * scale$r.x); }
  if (m$r + 1u < p.m) { store4(m$r + 1u, n$c, sk, acc$r_1_$c * scale$r.y); }
  if (m$r + 2u < p.m) { store4(m$r + 2u, n$c, sk, acc$r_2_$c * scale$r.z); }
  if (m$r + 3u < p.m) { store4(m$r + 3u, n$c, sk, acc$r_3_$c * scale$r.w); }
}
