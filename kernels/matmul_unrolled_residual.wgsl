// matmul_unrolled_residual: the residual epilogue of matmul_unrolled.wgsl (and of its quantized
// k loop), for the `cpu` profile's decoder: a projection that ends a sub-layer (o, down) adds
// its output to the residual stream itself and leaves the next RMSNorm's input ready, so the
// next projection (qkv, gate_up, X form rms_partials) needs no rms_norm dispatch before it.
//   h[m, n]        = y[m, n] + x_rscale(m) sum_k x[m, k] w'[n, k] (+ bias[n])   (y: the stream)
//   normed[m, n]   = h[m, n] * gamma[n]
//   partials[m, b] = sum of h[m, n]^2 over the 128 = WG * RN columns n of workgroup b
//                    (NORM_PARTIAL_ROWS, kernels/matmul_bindings.ts)
// The next projection scales its dot products over normed by rsqrt(sum_b partials[m, b] / N +
// eps), the RMSNorm's row factor (reassociated: the norm's product is taken after the sum). Why
// (measured on lavapipe, 2 cores, Qwen3-0.6B preset, int4, batch 1, 2026-11-29): each dispatch
// there costs ~30 us or more of thread-pool hand-off whatever its work, and a decode step without
// its 55 rms_norm dispatches took 72.7 / 69.8 ms against 80.0 / 75.5 ms with them.
//
// FRAGMENT: kernels/matmul_kernels.ts puts this file (less its comment lines) in place of the
// lines of matmul_unrolled.wgsl between "EPILOGUE BEGIN" and "EPILOGUE END", and drops that
// kernel's "ROW GUARD" (the early return of invocations past the last weight row: they take part
// in the barrier below, their clamped rows read and never stored). Uses the kernel's row0, m0,
// lid, group, xr$i and acc$i_$r (see there for the TEMPLATE markers).
//
// Prelude (kernels/matmul_bindings.ts residualOutBinding): the bindings below, `fn
// store_residual(m: u32, n: u32, v: f32) -> f32` (writes h and normed for X row m and weight
// row n of the part, returns h^2) and `var<workgroup> sh_sq: array<f32, WG * MB>`.
//
// Bindings (group 0), beside matmul_unrolled.wgsl's (whose y is the stream h, read and written):
//   10 out_gamma  : storage read  array<f32> / array<u32> (f16 pairs)  [N] the next norm's weight
//   11 normed     : storage rw    array<f32>   [M, ldy] h * gamma (columns [n0, n0 + rows))
//   12 y_partials : storage rw    array<f32>   [M, groups_n] (one weight part: n0 == 0)
// Workgroup memory: sh_sq, WG * MB f32 (each invocation's sums of squares per X row).

  let rs$i = x_rscale(xr$i);
  let n$r = row0 + $ru;
  var sq$i = 0.0;
  if (m0 + $iu < p.m && n$r < p.rows) { sq$i += store_residual(m0 + $iu, n$r, acc$i_$r * rs$i); }
  sh_sq[lid * MB + $iu] = sq$i;
  workgroupBarrier();
  if (lid == 0u) {
    for (var i = 0u; i < MB; i++) {
      if (m0 + i < p.m) {
        var sum = 0.0;
        for (var j = 0u; j < WG; j++) {
          sum += sh_sq[j * MB + i];
        }
        y_partials[(m0 + i) * p.groups_n + group] = sum;
      }
    }
  }
