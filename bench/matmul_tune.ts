/**
 * Matmul kernel configurations measured on this adapter: every variant (`gemv` with 1 and 4
 * weight rows per invocation and steps of 4 or 8 weights, or 32 for int8 / int4, `unrolled`,
 * `blocked`, and `tiled` under several tile shapes) on the Qwen3-0.6B projections at decode and prefill row counts, f16 weights (or `--format int8 |
 * int4`, gpu/quant.ts, with their f16 group scales), timed with GPU timestamps (median of one
 * pass, see bench/support.ts `timeGpuEach`: the candidates of one M in one submission). Prints GFLOP/s (2 M N K / time) and weight GB/s (the
 * weight's bytes, scales included, / time) per case: the detail behind what the engine's kernel
 * tuning (kernels/matmul_tuner.ts) measures on a model's own call sites at start-up.
 *
 *   deno run -A bench/matmul_tune.ts [--m 1,8,16,32,64,512] [--shapes qkv,o,gate_up,down]
 *     [--format f16|int8|int4] [--x-form plain|rms_residual|swiglu] [--x-loads vec4|scalar]
 *
 * `--x-form rms_residual` reads X as the engine's qkv and gate/up projections do under the `gpu`
 * profile: the residual stream plus the previous sub-layer's output, normed on the fly with an f16
 * norm weight, the sum written back (`gemv` and `tiled` only; `kernels/matmul_x_rms.wgsl`), so the
 * X form's own cost shows against plain X. `--x-form swiglu` reads X as the down projection does:
 * the SwiGLU of a gate|up buffer of 2K values per row, computed in every workgroup that loads it
 * (`kernels/matmul_x_swiglu.wgsl`). `gemv` reads X (and the norm form's residual stream) as vec4s
 * where K % 4 == 0, as the engine does; `--x-loads scalar` reads it in 4-byte loads as it did
 * before 2026-11-29, for an A/B in one run.
 *
 * Weights and X are zero (timing does not depend on the values here: no tensor cores, no sparsity
 * fast path).
 *
 * @module
 */

import { STORAGE_RW } from "../gpu/context.ts";
import { deviceScaleBytes } from "../gpu/quant.ts";
import {
  GEMV_ROW_BLOCKS,
  GEMV_STEPS,
  GEMV_TPRS,
  gemvStepMisfit,
  type KernelSource,
  kernelSource,
} from "../kernels/matmul_kernels.ts";
import { TILE_CANDIDATES, tileName, tileSplit } from "../kernels/matmul_tile.ts";
import { SPLIT_REDUCE_WG, splitReduceCode } from "../kernels/matmul_split.ts";
import { MAX_GROUPS_PER_DIM } from "../kernels/dispatch.ts";
import { benchContext, describeMachine, measureCopyBandwidth, timeGpuEach } from "./support.ts";
import { isPositiveInteger, oneOf, scriptFlags } from "./bench_io.ts";

const SHAPES = {
  qkv: { n: 4096, k: 1024 },
  o: { n: 1024, k: 2048 },
  gate_up: { n: 6144, k: 1024 },
  down: { n: 1024, k: 3072 },
  lm_head: { n: 151936, k: 1024 },
} as const;

const FORMATS = ["f16", "int8", "int4"] as const;
const X_FORMS = ["plain", "rms_residual", "swiglu"] as const;
const values = scriptFlags("bench/matmul_tune.ts", Deno.args, {
  m: { type: "string", default: "1,8,16,32,64,512" },
  shapes: { type: "string", default: "qkv,o,gate_up,down" },
  format: { type: "string", default: "f16" },
  "x-form": { type: "string", default: "plain" },
  "x-loads": { type: "string", default: "vec4" },
}, (v) => {
  if (!v.m.split(",").every(isPositiveInteger)) {
    throw new Error(`--m takes positive integers, got "${v.m}"`);
  }
  for (const shape of v.shapes.split(",")) {
    if (!Object.hasOwn(SHAPES, shape)) {
      throw new Error(`--shapes takes ${Object.keys(SHAPES).join(", ")}; got "${shape}"`);
    }
  }
  oneOf("format", v.format, FORMATS);
  oneOf("x-form", v["x-form"], X_FORMS);
  oneOf("x-loads", v["x-loads"], ["vec4", "scalar"]);
});
const ms = values.m.split(",").map(Number);
const shapes = values.shapes.split(",") as (keyof typeof SHAPES)[];
const format = oneOf("format", values.format, FORMATS);
const xForm = oneOf("x-form", values["x-form"], X_FORMS);
const xLoadsVec4 = values["x-loads"] === "vec4";
/** With a norm X form: its norm weight's dtype (the engine's f16 checkpoints). */
const NORM_DTYPE = "f16";
/** Bytes per weight of the format (the scales, 2 bytes per 32 weights, come on top). */
const WEIGHT_BYTES = { f16: 2, int8: 1, int4: 0.5 } as const;

const ctx = await benchContext();
console.log(`matmul_tune: ${describeMachine(ctx)}`);
console.log(
  `command: deno run -A bench/matmul_tune.ts ${
    Deno.args.join(" ")
  }; ${format} weights, X ${xForm}` +
    `, gemv X loads ${xLoadsVec4 ? "vec4 where K % 4 == 0" : "scalar"}`,
);
console.log(`copy bandwidth (same run): ${(await measureCopyBandwidth(ctx)).toFixed(1)} GB/s`);

/** The kernels measured at M = `m` on a weight of row stride `k`. */
function candidates(m: number, k: number): { name: string; src: KernelSource }[] {
  const out: { name: string; src: KernelSource }[] = [];
  for (const mb of [1, 2, 4, 8]) {
    if (mb > m && mb !== 1) continue;
    for (const ks of GEMV_STEPS.filter((step) => gemvStepMisfit(step, format, k) === null)) {
      for (const rb of GEMV_ROW_BLOCKS) {
        // Steps of 32 run their own invocations per row.
        for (const tpr of ks === 32 ? [64] : GEMV_TPRS) {
          const src = kernelSource(
            "gemv",
            mb,
            format,
            false,
            xLoadsVec4 && k % 4 === 0, // X as vec4s, as the engine's gemv reads it where K allows
            xForm,
            NORM_DTYPE,
            undefined,
            rb,
            ks,
            0,
            1,
            tpr,
          );
          const name = `gemv mb${mb}${rb > 1 ? ` rb${rb}` : ""}${ks > 4 ? ` ks${ks}` : ""}${
            tpr !== 64 ? ` tpr${tpr}` : ""
          }`;
          out.push({ name, src });
        }
      }
    }
  }
  // The cpu profile's kernels read plain X only.
  for (const mb of xForm === "plain" ? [1, 4, 8, 16] : []) {
    if (mb > m && mb !== 1) continue;
    out.push({ name: `unrolled mb${mb}`, src: kernelSource("unrolled", mb, format, false, true) });
  }
  if (xForm === "plain") {
    out.push({ name: "blocked mb8", src: kernelSource("blocked", 8, format, false, false) });
  }
  for (const t of TILE_CANDIDATES) {
    const name = `tiled ${tileName(t)}`;
    out.push({
      name,
      src: kernelSource("tiled", 0, format, false, false, xForm, NORM_DTYPE, t),
    });
  }
  return out;
}

for (const shapeName of shapes) {
  const { n, k } = SHAPES[shapeName];
  const maxM = Math.max(...ms);
  const wBytes = n * k * WEIGHT_BYTES[format];
  const w = ctx.createBuffer("w", wBytes, STORAGE_RW);
  // Quantized weights' f16 scales, one per 32 weights (zero, as the weights).
  const scales = format === "f16"
    ? null
    : ctx.createBuffer("scales", deviceScaleBytes(n, k), STORAGE_RW);
  const readBytes = wBytes + (scales?.size ?? 0);
  // SwiGLU: K gate values then K up values per row.
  const x = ctx.createBuffer("x", maxM * k * (xForm === "swiglu" ? 2 : 1) * 4, STORAGE_RW);
  const y = ctx.createBuffer("y", maxM * n * 4, STORAGE_RW);
  // One parameter buffer per candidate: the candidates of one M are timed in one submission.
  const params = new Map<string, GPUBuffer>();
  const paramsOf = (name: string) => {
    let b = params.get(name);
    if (b === undefined) {
      b = ctx.createBuffer(`p ${name}`, 48, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
      params.set(name, b);
    }
    return b;
  };
  // rms_residual: the sub-layer output added to the stream (delta), the f16 norm weight (K halves
  // in u32 pairs) and the stream's next buffer (written by weight part 0, here the only part).
  const norm = xForm !== "rms_residual" ? null : {
    delta: ctx.createBuffer("delta", maxM * k * 4, STORAGE_RW),
    gamma: ctx.createBuffer("gamma", k * 2, STORAGE_RW),
    hOut: ctx.createBuffer("h_out", maxM * k * 4, STORAGE_RW),
  };
  // Split-K tiles write their partial sums here and a second dispatch adds them up into y
  // (kernels/matmul_split.ts), as the engine runs them; both dispatches are timed.
  const maxSplit = Math.max(...TILE_CANDIDATES.map(tileSplit));
  const part = ctx.createBuffer("partials", maxSplit * maxM * (n + 1) * 4, STORAGE_RW);
  for (const m of ms) {
    const cases = candidates(m, k);
    const encodes: ((pass: GPUComputePassEncoder) => void)[] = [];
    for (const c of cases) {
      const p = paramsOf(c.name);
      const pipeline = ctx.pipeline(`tune/${shapeName}/${c.name}`, () => c.src.code);
      const split = c.src.split;
      const reduce = split === 1 ? null : ctx.pipeline(
        `tune/reduce/${split}/${xForm}`,
        () => splitReduceCode(split, false, xForm === "rms_residual"),
      );
      const group = ctx.device.createBindGroup({
        layout: pipeline.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: { buffer: x } },
          { binding: 1, resource: { buffer: w } },
          { binding: 3, resource: { buffer: reduce === null ? y : part } },
          { binding: 4, resource: { buffer: p } },
          ...(scales === null ? [] : [{ binding: 5, resource: { buffer: scales } }]),
          ...(norm === null ? [] : [
            { binding: 6, resource: { buffer: norm.delta } },
            { binding: 7, resource: { buffer: norm.gamma } },
            { binding: 8, resource: { buffer: norm.hOut } },
          ]),
        ],
      });
      const groupsN = Math.ceil(n / c.src.rowsPerGroup);
      const gy = Math.ceil(groupsN / MAX_GROUPS_PER_DIM);
      const gz = Math.ceil(m / c.src.mPerGroup) * split;
      const reduceGroup = reduce === null ? null : ctx.device.createBindGroup({
        layout: reduce.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: { buffer: part } },
          { binding: 3, resource: { buffer: y } },
          { binding: 4, resource: { buffer: p } },
        ],
      });
      // Params (kernels/matmul_io.wgsl): m, rows, k, k4, ldy, n0, groups_n, eps, keep.
      const values = new Uint32Array([m, n, k, k / 4, n, 0, groupsN, 0, norm === null ? 0 : 1]);
      new Float32Array(values.buffer, 7 * 4, 1)[0] = 1e-6;
      ctx.device.queue.writeBuffer(p, 0, values);
      encodes.push((pass) => {
        pass.setPipeline(pipeline);
        pass.setBindGroup(0, group);
        pass.dispatchWorkgroups(Math.ceil(groupsN / gy), gy, gz);
        if (reduce !== null && reduceGroup !== null) {
          pass.setPipeline(reduce);
          pass.setBindGroup(0, reduceGroup);
          pass.dispatchWorkgroups(Math.ceil(n / SPLIT_REDUCE_WG), m);
        }
      });
    }
    // Every candidate's warm-up and timed passes, one candidate after the other, in one
    // submission (one wait for the GPU instead of one per candidate).
    const times = await timeGpuEach(ctx, encodes);
    const rows = cases.map((c, i) => {
      const ms = times[i]!.medianMs;
      const s = ms / 1000;
      return `  ${c.name.padEnd(28)} ${ms.toFixed(4).padStart(9)} ms ` +
        `${(2 * m * n * k / s / 1e9).toFixed(0).padStart(7)} GFLOP/s ` +
        `${(readBytes / s / 1e9).toFixed(0).padStart(6)} GB/s of W`;
    });
    console.log(`${shapeName} N ${n} K ${k}, M ${m}:`);
    console.log(rows.join("\n"));
  }
  for (const b of [w, x, y, part, scales, norm?.delta, norm?.gamma, norm?.hOut]) b?.destroy();
  for (const b of params.values()) b.destroy();
}
