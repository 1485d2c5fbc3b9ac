/**
 * Benchmarks `sample` at Qwen's vocabulary (151936) for batches of 1, 8 and 32 rows:
 * greedy, top-k 50 and top-p 0.9 (temperature 1), on two kinds of logits:
 *   - "flat":   N(0, 2) logits; top-p 0.9 then keeps ~40% of the vocabulary (the worst case:
 *               every search pass and the draw scan the whole row);
 *   - "peaked": the same plus 16 logits at +12..+16, like a confident LM; top-p 0.9 keeps a few
 *               tokens (the candidate list takes over after 1-2 passes).
 *
 * Run: `deno bench -A bench/sample_bench.ts`. The printed lines are GPU times from timestamp
 * queries (bench/support.ts timeGpu), with the logits read rate (one pass over the logits per
 * call) next to the copy bandwidth measured in the same run. The `Deno.bench` entries time one
 * submission with the host clock, so they include the ~10 ms wait floor.
 *
 * Set `SAMPLE_SWEEP=1` to also time the other compiled shape (workgroup / buckets).
 *
 * @module
 */

import type { GpuContext } from "../gpu/context.ts";
import { STORAGE_RW } from "../gpu/context.ts";
import { ParamArena } from "../gpu/params.ts";
import {
  packSampleParams,
  Sample,
  type SampleParams,
  type SampleVariant,
  sampleVariantFor,
} from "../kernels/sample.ts";
import { benchContext, describeMachine, measureCopyBandwidth, timeGpu } from "./support.ts";

const VOCAB = 151936;
const BATCHES = [1, 8, 32] as const;
const MODES: readonly { name: string; params: SampleParams; peaked: boolean }[] = [
  { name: "greedy", params: {}, peaked: false },
  { name: "top-k 50", params: { temperature: 1, topK: 50 }, peaked: false },
  { name: "top-p 0.9 flat", params: { temperature: 1, topP: 0.9 }, peaked: false },
  { name: "top-p 0.9 peaked", params: { temperature: 1, topP: 0.9 }, peaked: true },
];

/** Deterministic N(0, 2) logits (plus 16 spikes per row when `peaked`). */
function makeLogits(rows: number, peaked: boolean): Float32Array<ArrayBuffer> {
  let state = 12345;
  const next = () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return (state + 0.5) / 4294967296;
  };
  const out = new Float32Array(rows * VOCAB);
  for (let i = 0; i < out.length; i++) {
    out[i] = 2 * Math.sqrt(-2 * Math.log(next())) * Math.cos(2 * Math.PI * next());
  }
  if (peaked) {
    for (let r = 0; r < rows; r++) {
      for (let j = 0; j < 16; j++) out[r * VOCAB + Math.floor(next() * VOCAB)] = 12 + j / 4;
    }
  }
  return out;
}

function setup(
  ctx: GpuContext,
  rows: number,
  mode: typeof MODES[number],
  variant: SampleVariant,
) {
  const logits = makeLogits(rows, mode.peaked);
  const params = packSampleParams(
    Array.from({ length: rows }, (_, s) => ({ ...mode.params, seed: 7, counter: s })),
  );
  const buffers = [
    ctx.createBuffer("logits", logits.byteLength, STORAGE_RW),
    ctx.createBuffer("params", params.byteLength, STORAGE_RW),
    ctx.createBuffer("tokens", rows * 4, STORAGE_RW),
    ctx.createBuffer("logprobs", rows * 4, STORAGE_RW),
  ] as const;
  ctx.device.queue.writeBuffer(buffers[0], 0, logits);
  ctx.device.queue.writeBuffer(buffers[1], 0, params);
  const arena = new ParamArena(ctx, 1);
  const op = new Sample(ctx, variant).bind(arena, {
    logits: { buffer: buffers[0] },
    params: { buffer: buffers[1] },
    tokens: { buffer: buffers[2] },
    logprobs: { buffer: buffers[3] },
  });
  return {
    arena,
    encode: (pass: GPUComputePassEncoder) => op.encode(pass, rows, VOCAB),
    destroy: () => {
      for (const b of buffers) b.destroy();
      arena.destroy();
    },
  };
}

const ctx = await benchContext();
const bandwidth = await measureCopyBandwidth(ctx);
const chosen = sampleVariantFor(ctx);
console.log(`sample, ${describeMachine(ctx)}`);
console.log(`vocab ${VOCAB}; copy bandwidth ${bandwidth.toFixed(1)} GB/s (read + write)`);

async function report(rows: number, mode: typeof MODES[number], variant: SampleVariant) {
  const s = setup(ctx, rows, mode, variant);
  try {
    const t = await timeGpu(ctx, s.encode, { arena: s.arena, warmup: 1, repeats: 3 });
    const gbs = (rows * VOCAB * 4) / (t.medianMs * 1e6);
    console.log(
      `  batch ${String(rows).padStart(2)} ${mode.name.padEnd(16)} ` +
        `[wg ${variant.workgroup}, nb ${variant.buckets}]: ${t.medianMs.toFixed(2)} ms median ` +
        `(min ${t.minMs.toFixed(2)}), ${(t.medianMs / rows).toFixed(3)} ms/row, ` +
        `logits read once at ${gbs.toFixed(1)} GB/s (${t.method})`,
    );
  } finally {
    s.destroy();
  }
}

for (const rows of BATCHES) {
  for (const mode of MODES) await report(rows, mode, chosen);
}
if (Deno.env.get("SAMPLE_SWEEP") === "1") {
  const other = chosen.workgroup === 16
    ? { workgroup: 128, buckets: 16 }
    : { workgroup: 16, buckets: 128 };
  for (const rows of BATCHES) {
    for (const mode of MODES) await report(rows, mode, other);
  }
}

for (const mode of MODES) {
  const s = setup(ctx, 8, mode, chosen);
  Deno.bench({
    name: `sample batch 8 ${mode.name} (host clock, one submission)`,
    n: 3,
    warmup: 1,
    async fn() {
      const encoder = ctx.device.createCommandEncoder();
      const pass = encoder.beginComputePass();
      s.encode(pass);
      pass.end();
      s.arena.flush();
      ctx.device.queue.submit([encoder.finish()]);
      await ctx.device.queue.onSubmittedWorkDone();
    },
  });
}
