/**
 * Matmul kernels on the Qwen3-0.6B projection shapes (hidden 1024, intermediate 3072, 16 q heads
 * and 8 kv heads of 128, vocab 151936).
 *
 * - prefill, M = 128 (and 512 with `MATMUL_BENCH_LARGE=1`): GFLOP/s (2 M N K / time) of the
 *   `unrolled`, `blocked` and `tiled` kernels, f16 and f32 weights, next to the CPU's sgemm peak;
 * - decode, M = 1 and 8: weight GB/s (bytes of W read / time) of the `unrolled`, `blocked` and
 *   `gemv` kernels (the LM head with the policy's kernel only), next to the copy bandwidth measured
 *   in the same run; then int8 and int4 weights (gpu/quant.ts) with the `unrolled` and `gemv`
 *   kernels, each line with its weights per second, so the formats compare within one run.
 *
 * The figures are printed when the file loads: GPU timestamps of one pass (median of several,
 * see bench/support.ts `timeGpu`). The `Deno.bench` entries (one decode step per projection)
 * time a submission on the host, ~10 ms wait included; they are listed, not the figures. Run: `deno bench -A bench/matmul_bench.ts`
 * (`MATMUL_BENCH_PHASES=decode` for the decode figures only).
 *
 * Weights are left zero (timing does not depend on the values; CPUs have no zero fast path for
 * FMAs). The header names the kernels the adapter's policy picks.
 *
 * @module
 */

import { benchSubmission } from "./lib/kernel_bench.ts";
import { benchContext, describeMachine, measureCopyBandwidth, timeGpu } from "./support.ts";
import { STORAGE_RW } from "../gpu/context.ts";
import type { DType } from "../gpu/dtype.ts";
import type { QuantFormat } from "../gpu/quant.ts";
import { ParamArena } from "../gpu/params.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import { defaultMatmulPolicy, Matmul, type MatmulVariant } from "../kernels/matmul.ts";

/** sgemm peak of OpenBLAS on this machine kind, from /work/shared/platform-notes.md. */
const CPU_SGEMM_PEAK_GFLOPS = 240;

const PROJECTIONS = [
  { name: "qkv", n: 4096, k: 1024 },
  { name: "o", n: 1024, k: 2048 },
  { name: "gate_up", n: 6144, k: 1024 },
  { name: "down", n: 1024, k: 3072 },
] as const;
const LM_HEAD = { name: "lm_head", n: 151936, k: 1024 } as const;
const DTYPES: readonly DType[] = ["f16", "f32"];
const PREFILL_M = Deno.env.get("MATMUL_BENCH_LARGE") === "1" ? [128, 512] : [128];
const DECODE_M = [1, 8];
/** `MATMUL_BENCH_PHASES=decode` (or `prefill`) runs one phase only. */
const PHASES = (Deno.env.get("MATMUL_BENCH_PHASES") ?? "prefill,decode").split(",");

const ctx = await benchContext();

/** Times `variants` of y = x W^T for one shape at each m; prints one line per measurement. */
async function run(
  phase: "prefill" | "decode",
  shape: { name: string; n: number; k: number },
  format: DType | QuantFormat,
  ms: readonly number[],
  variants: readonly MatmulVariant[],
): Promise<void> {
  const quant = format === "int8" || format === "int4" ? format : null;
  const matmul = new Matmul(ctx, { dtype: quant === null ? format as DType : "f16", bias: false });
  const maxM = Math.max(...ms);
  const x = ctx.createBuffer("x", maxM * shape.k * 4, STORAGE_RW);
  const y = ctx.createBuffer("y", maxM * shape.n * 4, STORAGE_RW);
  try {
    for (const variant of variants) {
      // Quantized words where the engine keeps them for this kernel: the profile's layout for the
      // policy's own kernel (a texture under the cpu profile), a buffer for a forced other one.
      const own = variant === (matmul.policy === "cpu" ? "unrolled" : "gemv");
      const weight = quant === null
        ? GpuMatrix.create(ctx, shape.name, shape.n, shape.k, format as DType, { padColsTo: 4 })
        : GpuMatrix.createQuantized(ctx, shape.name, shape.n, shape.k, quant, {
          ...(own ? {} : { wordStorage: "buffer" }),
        });
      const arena = new ParamArena(ctx, weight.parts.length);
      try {
        const op = matmul.bind(arena, { x: { buffer: x }, weight, y: { buffer: y } });
        for (const m of ms) {
          const big = 2 * m * shape.n * shape.k > 1e9 || weight.byteSize > 1e8;
          const t = await timeGpu(ctx, (pass) => op.encode(pass, m, { variant }), {
            arena,
            warmup: 1,
            repeats: big ? 2 : 5,
          });
          const head = `matmul ${phase} ${shape.name} ${format} M=${m} N=${shape.n} K=${shape.k} ` +
            `${variant}: ${t.medianMs.toFixed(2)} ms (min ${t.minMs.toFixed(2)})`;
          if (phase === "prefill") {
            const gflops = (2 * m * shape.n * shape.k) / (t.medianMs * 1e6);
            console.log(
              `${head}, ${gflops.toFixed(1)} GFLOP/s = ` +
                `${((100 * gflops) / CPU_SGEMM_PEAK_GFLOPS).toFixed(1)}% of the CPU sgemm peak`,
            );
          } else {
            const gbs = weight.byteSize / (t.medianMs * 1e6);
            const weights = (shape.n * shape.k) / (t.medianMs * 1e6);
            console.log(
              `${head}, W ${gbs.toFixed(2)} GB/s = ${((100 * gbs) / copyBandwidth).toFixed(0)}% ` +
                `of copy bandwidth, ${weights.toFixed(2)} G weights/s`,
            );
          }
        }
      } finally {
        weight.destroy();
        arena.destroy();
      }
    }
  } finally {
    x.destroy();
    y.destroy();
  }
}

// The figures: measured once, at load (Deno.bench re-runs its functions many times and ignores
// `n`, so GPU-timed measurements do not belong inside them).
const copyBandwidth = await measureCopyBandwidth(ctx);
console.log(describeMachine(ctx));
console.log(
  `ceilings: copy bandwidth ${copyBandwidth.toFixed(1)} GB/s (read + write, measured now); ` +
    `CPU sgemm peak ~${CPU_SGEMM_PEAK_GFLOPS} GFLOP/s (OpenBLAS, 2 threads, from ` +
    `platform-notes.md, not measured here); timing by ` +
    `${ctx.hasTimestamps ? "timestamp-query" : "host clock / N passes"}`,
);
const policy = defaultMatmulPolicy(ctx);
console.log(
  `matmul policy on this adapter: ${policy} (${
    policy === "cpu"
      ? "unrolled (row stride % 8 == 0, else blocked) for decode and prefill"
      : "gemv for decode, tiled for prefill"
  })`,
);
for (const dtype of PHASES.includes("prefill") ? DTYPES : []) {
  for (const shape of PROJECTIONS) {
    await run("prefill", shape, dtype, PREFILL_M, ["unrolled", "blocked", "tiled"]);
  }
}
for (const dtype of PHASES.includes("decode") ? DTYPES : []) {
  for (const shape of PROJECTIONS) {
    await run("decode", shape, dtype, DECODE_M, ["unrolled", "blocked", "gemv"]);
  }
  // The LM head only with the policy's decode kernel (the other one takes seconds on lavapipe).
  await run("decode", LM_HEAD, dtype, DECODE_M, [policy === "cpu" ? "unrolled" : "gemv"]);
}

for (const quant of PHASES.includes("decode") ? ["int8", "int4"] as const : []) {
  for (const shape of PROJECTIONS) {
    await run("decode", shape, quant, DECODE_M, ["unrolled", "gemv"]);
  }
  await run("decode", LM_HEAD, quant, DECODE_M, [policy === "cpu" ? "unrolled" : "gemv"]);
}

// Listed entries: one decode step (M = 1, the policy's kernel) per projection, submitted and
// awaited, so their host times include the ~10 ms wait; the figures are the lines above.
for (const dtype of DTYPES) {
  for (const shape of PROJECTIONS) {
    const matmul = new Matmul(ctx, { dtype, bias: false });
    const weight = GpuMatrix.create(ctx, shape.name, shape.n, shape.k, dtype, { padColsTo: 4 });
    const x = ctx.createBuffer("x", shape.k * 4, STORAGE_RW);
    const y = ctx.createBuffer("y", shape.n * 4, STORAGE_RW);
    const arena = new ParamArena(ctx, weight.parts.length);
    const op = matmul.bind(arena, { x: { buffer: x }, weight, y: { buffer: y } });
    benchSubmission(
      ctx,
      `matmul decode M=1 ${shape.name} ${dtype} (host time, incl. ~10 ms wait)`,
      { arena, encode: (pass) => op.encode(pass, 1) },
      {},
    );
  }
}
