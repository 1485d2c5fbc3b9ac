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
import {
  benchSubmission,
  copyBandwidthText,
  type KernelCase,
  lcg,
  medianText,
  normalLogits,
  openKernelBench,
  timeCase,
  uploadBuffer,
} from "./lib/kernel_bench.ts";

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
  const next = lcg(12345);
  const out = normalLogits(rows, VOCAB, next);
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
): KernelCase {
  const params = packSampleParams(
    Array.from({ length: rows }, (_, s) => ({ ...mode.params, seed: 7, counter: s })),
  );
  const buffers = [
    uploadBuffer(ctx, "logits", makeLogits(rows, mode.peaked)),
    uploadBuffer(ctx, "params", new Uint8Array(params)),
    ctx.createBuffer("tokens", rows * 4, STORAGE_RW),
    ctx.createBuffer("logprobs", rows * 4, STORAGE_RW),
  ] as const;
  const arena = new ParamArena(ctx, 1);
  const op = new Sample(ctx, variant).bind(arena, {
    logits: { buffer: buffers[0] },
    params: { buffer: buffers[1] },
    tokens: { buffer: buffers[2] },
    logprobs: { buffer: buffers[3] },
  });
  return {
    arena,
    encode: (pass) => op.encode(pass, rows, VOCAB),
    destroy: () => {
      for (const b of buffers) b.destroy();
      arena.destroy();
    },
  };
}

const { ctx, copyGBs } = await openKernelBench("sample");
const chosen = sampleVariantFor(ctx);
console.log(`vocab ${VOCAB}; ${copyBandwidthText(copyGBs)}`);

async function report(rows: number, mode: typeof MODES[number], variant: SampleVariant) {
  const t = await timeCase(ctx, () => setup(ctx, rows, mode, variant), { warmup: 1, repeats: 3 });
  const gbs = (rows * VOCAB * 4) / (t.medianMs * 1e6);
  console.log(
    `  batch ${String(rows).padStart(2)} ${mode.name.padEnd(16)} ` +
      `[wg ${variant.workgroup}, nb ${variant.buckets}]: ${medianText(t, 2)}, ` +
      `${(t.medianMs / rows).toFixed(3)} ms/row, ` +
      `logits read once at ${gbs.toFixed(1)} GB/s (${t.method})`,
  );
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
  const name = `sample batch 8 ${mode.name} (host clock, one submission)`;
  benchSubmission(ctx, name, setup(ctx, 8, mode, chosen));
}
