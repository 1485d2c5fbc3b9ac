/**
 * Benchmarks `logits_process` and `top_logprobs` at Qwen's vocabulary (151936), batch 32:
 *   - logits_process with every penalty on, a 512-token prompt and 256 output tokens per
 *     sequence (a quarter of them `sampledRef`s) and 10 bias pairs; and the same batch with
 *     everything off (the skip path);
 *   - top_logprobs with 20 tokens per row, for each workgroup size (the chosen one first), next
 *     to the copy bandwidth measured in the same run (the kernel reads the logits once).
 *
 * Run: `deno bench -A bench/logits_process_bench.ts`. The printed lines are GPU times from
 * timestamp queries (bench/support.ts timeGpu). The `Deno.bench` entries time one submission
 * with the host clock, so they include the ~10 ms wait floor.
 *
 * @module
 */

import type { GpuContext } from "../gpu/context.ts";
import { STORAGE_RW } from "../gpu/context.ts";
import { ParamArena } from "../gpu/params.ts";
import {
  LogitsProcess,
  type LogitsProcessParams,
  packLogitsProcess,
} from "../kernels/logits_process.ts";
import { sampledRef } from "../kernels/token_feed.ts";
import {
  packTopLogprobCounts,
  TOP_LOGPROBS_MAX,
  TopLogprobs,
  topLogprobsWorkgroupFor,
} from "../kernels/top_logprobs.ts";
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
const BATCH = 32;
const PROMPT = 512;
const OUTPUT = 256;

/** Deterministic uniform (0, 1), shared by the logits and the token lists (in that order). */
const next = lcg(12345);
const token = () => Math.floor(next() * VOCAB);

function processCase(ctx: GpuContext, logits: GPUBuffer, on: boolean): KernelCase {
  const params: LogitsProcessParams[] = Array.from(
    { length: BATCH },
    (): LogitsProcessParams =>
      on
        ? {
          repetitionPenalty: 1.1,
          presencePenalty: 0.5,
          frequencyPenalty: 0.3,
          promptTokens: Array.from({ length: PROMPT }, token),
          outputTokens: Array.from(
            { length: OUTPUT },
            (_, i) => i % 4 === 0 ? sampledRef(Math.floor(next() * BATCH)) : token(),
          ),
          logitBias: Array.from({ length: 10 }, (_, i) => [i * 1000 + 7, -5] as const),
        }
        : {},
  );
  const packed = packLogitsProcess(params);
  const buffers = [
    uploadBuffer(ctx, "params", packed.params),
    uploadBuffer(ctx, "tokens", packed.tokens),
    uploadBuffer(ctx, "bias", packed.bias),
    uploadBuffer(ctx, "sampled", Uint32Array.from({ length: BATCH }, token)),
    ctx.createBuffer("table", packed.tableWords * 4, STORAGE_RW),
  ] as const;
  const arena = new ParamArena(ctx, 1);
  const op = new LogitsProcess(ctx).bind(arena, {
    logits: { buffer: logits },
    params: { buffer: buffers[0] },
    tokens: { buffer: buffers[1] },
    bias: { buffer: buffers[2] },
    sampled: { buffer: buffers[3] },
    table: { buffer: buffers[4] },
  });
  return {
    arena,
    encode: (pass) => op.encode(pass, BATCH, VOCAB),
    destroy: () => {
      for (const b of buffers) b.destroy();
      arena.destroy();
    },
  };
}

function topCase(ctx: GpuContext, logits: GPUBuffer, workgroup: number): KernelCase {
  const buffers = [
    uploadBuffer(ctx, "counts", packTopLogprobCounts(Array(BATCH).fill(TOP_LOGPROBS_MAX))),
    ctx.createBuffer("ids", BATCH * TOP_LOGPROBS_MAX * 4, STORAGE_RW),
    ctx.createBuffer("logprobs", BATCH * TOP_LOGPROBS_MAX * 4, STORAGE_RW),
  ] as const;
  const arena = new ParamArena(ctx, 1);
  const op = new TopLogprobs(ctx, workgroup).bind(arena, {
    logits: { buffer: logits },
    counts: { buffer: buffers[0] },
    ids: { buffer: buffers[1] },
    logprobs: { buffer: buffers[2] },
  });
  return {
    arena,
    encode: (pass) => op.encode(pass, BATCH, VOCAB, TOP_LOGPROBS_MAX),
    destroy: () => {
      for (const b of buffers) b.destroy();
      arena.destroy();
    },
  };
}

const { ctx, copyGBs } = await openKernelBench("logits_process / top_logprobs");
console.log(`vocab ${VOCAB}, batch ${BATCH}; ${copyBandwidthText(copyGBs)}`);
const logits = uploadBuffer(ctx, "logits", normalLogits(BATCH, VOCAB, next));

for (const on of [true, false]) {
  const t = await timeCase(ctx, () => processCase(ctx, logits, on), { warmup: 1, repeats: 5 });
  const what = on
    ? `all penalties, ${PROMPT} prompt + ${OUTPUT} output tokens, 10 biases`
    : "everything off (skip)";
  console.log(
    `  logits_process ${what}: ${medianText(t, 3)}, ` +
      `${(t.medianMs * 1000 / BATCH).toFixed(1)} us/seq (${t.method})`,
  );
}

const chosen = topLogprobsWorkgroupFor(ctx);
for (const wg of [chosen, ...[16, 32, 64, 128].filter((w) => w !== chosen)]) {
  const t = await timeCase(ctx, () => topCase(ctx, logits, wg), { warmup: 1, repeats: 3 });
  const gbs = (BATCH * VOCAB * 4) / (t.medianMs * 1e6);
  console.log(
    `  top_logprobs n ${TOP_LOGPROBS_MAX} [wg ${wg}${wg === chosen ? ", chosen" : ""}]: ` +
      `${medianText(t, 2)}, ${(t.medianMs / BATCH).toFixed(3)} ms/row, ` +
      `logits read once at ${gbs.toFixed(1)} GB/s (${t.method})`,
  );
}

const benches: [string, KernelCase][] = [
  ["logits_process batch 32, all penalties", processCase(ctx, logits, true)],
  ["top_logprobs batch 32, n 20", topCase(ctx, logits, chosen)],
];
for (const [name, c] of benches) benchSubmission(ctx, `${name} (host clock, one submission)`, c);
