/**
 * Whole-model throughput of the real {@linkcode ModelRunner} on the Qwen3-0.6B shapes
 * (28 layers, hidden 1024, 16 q / 8 kv heads of 128, intermediate 3072, vocab 151936, tied
 * embeddings), with the weights in the context's dtype (f16 where `shader-f16` exists):
 *
 * - prefill tokens/s of one 128-token and one 512-token prompt (wall time from the submit to
 *   the readback of the sampled token);
 * - decode tokens/s at batch 1, 8 and 32: every sequence holds a 128-token prompt in the KV
 *   cache, then `--steps` decode steps are submitted back to back, each fed from the previous
 *   step's samples on the GPU (`runner.sampledRef`), never waiting per step (at most
 *   `runner.maxInFlight` in flight). tokens/s = batch * steps / (first decode submit -> last
 *   readback). The prompt is prefilled once and its KV blocks are shared by every sequence
 *   (prefix caching), so a batch of 32 does not spend minutes in prefill; each sequence writes
 *   its own blocks from position 128 on. Process CPU time (lavapipe runs its threads inside this
 *   process) is printed next to the wall time, as the machine is shared and noisy;
 * - a per-kernel breakdown of one decode step at batch 1 and 8 (`--breakdown-batches`): each kernel group of the
 *   forward pass (all 28 layers' dispatches of it, with 28 distinct weight matrices so nothing
 *   is served from the CPU cache that would not be in the real model) is timed as one compute
 *   pass with GPU timestamps (bench/support.ts `timeGpu`), at the model's exact shapes.
 *
 * Run: `deno bench -A bench/model_bench.ts` (figures printed when the file loads; the
 * `Deno.bench` entries time one decode step on the host, ~10 ms wait included), or
 * `deno run -A bench/model_bench.ts [--model DIR] [--steps N] [--batches 1,8,32]
 * [--no-breakdown] [--json]`. Without `--model` the qwen3-0.6b preset is generated (random
 * bf16 weights, 1.2 GB) into a temporary directory, deleted at exit.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { parseKernelProfileChoice } from "../gpu/kernel_profile.ts";
import { benchContext, describeMachine, measureCopyBandwidth, timeGpu } from "./support.ts";
import { StepCostProbe } from "./lib/step_cost.ts";
import { reportUsage, UsageError } from "./bench_io.ts";
import { checkModelDir } from "../cli/engine_flags.ts";
import { STORAGE_RW } from "../gpu/context.ts";
import { ParamArena } from "../gpu/params.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import { KvCache } from "../engine/kv_cache.ts";
import { ModelRunner } from "../engine/model_runner.ts";
import { StepBuffers } from "../engine/step_buffers.ts";
import { AttentionKernels } from "../engine/models/attention_block.ts";
import { KernelSet } from "../engine/models/kernel_set.ts";
import { Matmul, type MatmulVariant } from "../kernels/matmul.ts";
import { packSampleParams } from "../kernels/sample.ts";
import { parseQuantization, type Quantization } from "../gpu/quant.ts";

const USAGE = `usage: deno task bench:model [options]
  --model DIR                  checkpoint (default: the qwen3-0.6b preset, generated, bf16)
  --steps N                    decode steps per batch size (default 8)
  --batches LIST               decode batch sizes (default 1,8,32)
  --prefill LIST               prefill lengths (default 128,512)
  --no-breakdown               skip the per-kernel breakdown
  --breakdown-batches LIST     batch sizes of the breakdown (default 1,8)
  --matmul-variant V           force one matmul kernel (tiled, gemv, blocked, unrolled)
  --force-f32                  f32 weights even with shader-f16
  --kernel-profile auto|cpu|gpu   kernel variants (default auto: from the adapter)
  --quantization LIST          weight formats to measure, one runner each, e.g. none,int8,int4
                               (default none); ratios to the first are printed
  --json                       print one JSON report`;

function parseModelBenchArgs(argv: string[]) {
  try {
    const { values } = parseArgs({
      args: argv,
      options: {
        model: { type: "string" },
        steps: { type: "string", default: "8" },
        batches: { type: "string", default: "1,8,32" },
        prefill: { type: "string", default: "128,512" },
        "no-breakdown": { type: "boolean", default: false },
        "breakdown-batches": { type: "string", default: "1,8" },
        "matmul-variant": { type: "string" },
        "force-f32": { type: "boolean", default: false },
        "kernel-profile": { type: "string" },
        quantization: { type: "string", default: "none" },
        json: { type: "boolean", default: false },
        help: { type: "boolean", default: false },
      },
    });
    if (values.help) throw new UsageError(USAGE);
    return values;
  } catch (error) {
    const usage = error instanceof UsageError
      ? error
      : new UsageError(error instanceof Error ? error.message : String(error));
    Deno.exit(reportUsage(usage, { log: console.log, err: console.error }, "bench:model"));
  }
}

const args = parseModelBenchArgs(Deno.args);
let QUANTIZATIONS: Quantization[];
try {
  QUANTIZATIONS = args.quantization.split(",").filter((q) => q !== "").map(parseQuantization);
} catch (error) {
  console.error(`error: ${error instanceof Error ? error.message : error}`);
  Deno.exit(2);
}
const STEPS = Number(args.steps);
const BATCHES = args.batches.split(",").filter((s) => s !== "").map(Number);
const PREFILLS = args.prefill.split(",").filter((s) => s !== "").map(Number);
const PROMPT = 128;
const BLOCK = 16;
const log = args.json ? (..._: unknown[]) => {} : console.log;

/** Process CPU seconds (user + system, all threads; lavapipe's workers included). */
function cpuSeconds(): number {
  try {
    const stat = Deno.readTextFileSync("/proc/self/stat");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return NaN;
  }
}

async function generateModel(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "model_bench_" });
  const tool = new URL("../tools/make_model.ts", import.meta.url).pathname;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", tool, "--out", dir, "--preset", "qwen3-0.6b", "--dtype", "bf16"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`make-model failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  return dir;
}

const MATMUL_VARIANTS: readonly MatmulVariant[] = [
  "tiled",
  "gemv",
  "blocked",
  "unrolled",
];
const forced = MATMUL_VARIANTS.find((v) => v === args["matmul-variant"]);
if (args["matmul-variant"] !== undefined && forced === undefined) {
  throw new TypeError(`--matmul-variant must be one of ${MATMUL_VARIANTS.join(", ")}`);
}
if (forced !== undefined) {
  // A/B runs: every matmul of the runner uses the named kernel instead of the policy's choice.
  const choose = Matmul.prototype.choose;
  Matmul.prototype.choose = function (m, cols, rowStride, _variant, format) {
    return choose.call(this, m, cols, rowStride, forced, format);
  };
}

const ctx = await benchContext({
  forceF32: args["force-f32"],
  kernelProfile: parseKernelProfileChoice(args["kernel-profile"]),
});
const generated = args.model === undefined;
if (args.model !== undefined) {
  try {
    await checkModelDir(args.model);
  } catch (error) {
    console.error(`error: ${error instanceof Error ? error.message : error}`);
    Deno.exit(1);
  }
}
const modelDir = args.model ?? await generateModel();
const command = Deno.args.length > 0 || !import.meta.main
  ? `deno ${import.meta.main ? "run" : "bench"} -A bench/model_bench.ts ${Deno.args.join(" ")}`
  : "deno run -A bench/model_bench.ts";
const report: Record<string, unknown> = {
  machine: describeMachine(ctx),
  date: new Date().toISOString(),
  command: command.trim(),
  model: generated ? `qwen3-0.6b preset generated into ${modelDir}` : modelDir,
  weightDtype: ctx.weightDtype,
  lpNumThreads: Deno.env.get("LP_NUM_THREADS") ?? "(default)",
  matmulVariant: forced ?? "(policy)",
};
log(`model_bench: ${report.machine}`);
log(
  `command: ${report.command}; date ${report.date}; LP_NUM_THREADS ${report.lpNumThreads}; ` +
    `matmul kernel ${report.matmulVariant}`,
);
log(`model: ${report.model} (weights ${ctx.weightDtype})`);

const maxSeqs = Math.max(1, ...BATCHES);
const maxModelLen = Math.max(PROMPT, ...PREFILLS) + STEPS + 16;
const blocksPerSeq = Math.ceil(maxModelLen / BLOCK);
const vocabTokens = () => Math.min(runner.config.vocabSize, 500);
const promptOf = (n: number, seed: number) =>
  Uint32Array.from({ length: n }, (_, i) => (i * 7 + seed * 13 + 1) % vocabTokens());

/** Prefills `n` tokens of one sequence in blocks [base, base + ceil(n / BLOCK)); awaits it. */
async function prefill(n: number, base: number): Promise<number> {
  const positions = Uint32Array.from({ length: n }, (_, i) => i);
  const table = Array.from({ length: Math.ceil(n / BLOCK) }, (_, j) => base + j);
  const start = performance.now();
  const step = runner.execute({
    inputIds: promptOf(n, base),
    positions,
    slotMapping: positions.map((p) => table[Math.floor(p / BLOCK)]! * BLOCK + (p % BLOCK)),
    seqs: [{ queryLen: n, contextLen: n, blockTable: table, sample: { temperature: 0 } }],
  });
  await step.result;
  return performance.now() - start;
}

/** Decodes `steps` steps of `batch` sequences sharing the prompt in blocks [0, PROMPT/BLOCK). */
async function decode(batch: number, steps: number) {
  const promptBlocks = Array.from({ length: PROMPT / BLOCK }, (_, j) => j);
  const own = (s: number) => blocksPerSeq * (s + 1);
  const tables = Array.from({ length: batch }, (_, s) => {
    const extra = Array.from({ length: blocksPerSeq - promptBlocks.length }, (_, j) => own(s) + j);
    return [...promptBlocks, ...extra];
  });
  // Step 0: each sequence's last prompt token (position PROMPT - 1) recomputed as a decode step.
  const pending: Promise<unknown>[] = [];
  const probe = new StepCostProbe();
  let prev = -1;
  let start = 0;
  let cpu0 = 0;
  for (let i = 0; i <= steps; i++) {
    if (i === 1) {
      await pending[0];
      start = performance.now();
      cpu0 = cpuSeconds();
    }
    const pos = PROMPT - 1 + i;
    const slot = (s: number) => tables[s]![Math.floor(pos / BLOCK)]! * BLOCK + (pos % BLOCK);
    const input = {
      inputIds: Uint32Array.from(
        { length: batch },
        (_, s) => i === 0 ? PROMPT % vocabTokens() : runner.sampledRef(prev, s),
      ),
      positions: new Uint32Array(batch).fill(pos),
      slotMapping: Uint32Array.from({ length: batch }, (_, s) => slot(s)),
      seqs: tables.map((t) => ({
        queryLen: 1,
        contextLen: pos + 1,
        blockTable: t.slice(0, Math.ceil((pos + 1) / BLOCK)),
        sample: { temperature: 0 },
      })),
    };
    // Steps after the first are timed for their host cost (dispatches, encode + submit).
    const h = i === 0 ? runner.execute(input) : probe.measure(() => runner.execute(input));
    prev = h.step;
    pending.push(h.result);
    if (i >= 1 && pending.length - 1 >= runner.maxInFlight + 1) {
      await pending[pending.length - 1 - runner.maxInFlight];
    }
  }
  await Promise.all(pending);
  const wallMs = performance.now() - start;
  const cpuS = cpuSeconds() - cpu0;
  const cost = probe.result();
  return { batch, steps, wallMs, cpuS, tokensPerS: (batch * steps) / (wallMs / 1000), cost };
}

let runner: ModelRunner;
let c: ModelRunner["config"];

/** Loads a runner with `quantization`, measures prefill and decode, and records them. */
async function measure(quantization: Quantization) {
  const t0 = performance.now();
  runner = await ModelRunner.load(ctx, modelDir, {
    maxTokens: Math.max(512, ...PREFILLS),
    maxSeqs,
    maxModelLen,
    blockSize: BLOCK,
    numKvBlocks: blocksPerSeq * (maxSeqs + 1),
    showProgress: false,
    quantization,
  });
  log(
    `loaded in ${((performance.now() - t0) / 1000).toFixed(1)} s; weights ${quantization}: ` +
      `${(runner.weights.device / 2 ** 20).toFixed(1)} MiB on the device` +
      (quantization === "none"
        ? ""
        : ` (${
          (runner.weights.device / runner.weights.unquantized).toFixed(3)
        }x of ${ctx.weightDtype})`),
  );
  const copyBandwidth = await measureCopyBandwidth(ctx);
  report.copyBandwidthGBs = copyBandwidth;
  log(`copy bandwidth ceiling (same run): ${copyBandwidth.toFixed(1)} GB/s`);

  // Warm-up: pipelines are compiled lazily by the driver on first use.
  await prefill(16, blocksPerSeq * maxSeqs);
  await decode(1, 2);

  const prefillResults: { tokens: number; ms: number; tokensPerS: number; cpuS: number }[] = [];
  for (const n of PREFILLS) {
    const c0 = cpuSeconds();
    const ms = await prefill(n, 0);
    const r = { tokens: n, ms, tokensPerS: n / (ms / 1000), cpuS: cpuSeconds() - c0 };
    prefillResults.push(r);
    log(
      `prefill ${n} tokens: ${ms.toFixed(0)} ms, ${r.tokensPerS.toFixed(1)} tok/s ` +
        `(CPU ${r.cpuS.toFixed(1)} s)`,
    );
  }

  // The decode prompt: 128 tokens in blocks [0, 8).
  if (!PREFILLS.includes(PROMPT) || PREFILLS.indexOf(PROMPT) !== PREFILLS.length - 1) {
    await prefill(PROMPT, 0);
  }

  c = runner.config;
  // The projections and LM head one decode step reads, at the bytes they have on the device.
  const stepWeightBytes = runner.weights.device -
    c.vocabSize * c.hiddenSize * (c.tieWordEmbeddings ? 0 : (ctx.weightDtype === "f16" ? 2 : 4));
  const decodeResults = [];
  for (const batch of BATCHES) {
    const r = await decode(batch, STEPS);
    decodeResults.push(r);
    const msPerStep = r.wallMs / r.steps;
    log(
      `decode batch ${batch}: ${r.tokensPerS.toFixed(2)} tok/s, ${msPerStep.toFixed(1)} ms/step ` +
        `(${r.steps} steps, CPU ${(r.cpuS / r.steps * 1000).toFixed(0)} ms/step), weights ` +
        `${(stepWeightBytes / (msPerStep * 1e6)).toFixed(2)} GB/s`,
    );
    const k = r.cost;
    log(
      `  host per step: ${k.dispatchesPerCall.toFixed(0)} dispatches ` +
        `(${(k.dispatchesPerCall / c.numLayers).toFixed(1)} per layer, fixed ones included), ` +
        `${k.hostMsPerCall.toFixed(2)} ms to prepare, encode and submit; blocked in WebGPU: ` +
        `${k.submitMsPerCall.toFixed(1)} ms in queue.submit, ${
          k.mapAsyncMsPerCall.toFixed(1)
        } ms ` +
        `in mapAsync (the device's work, where the adapter does it on this thread)`,
    );
  }
  return {
    quantization,
    weightBytes: runner.weights.device,
    unquantizedWeightBytes: runner.weights.unquantized,
    prefill: prefillResults,
    decode: decodeResults,
  };
}

const measured = [];
for (const [i, quantization] of QUANTIZATIONS.entries()) {
  if (i > 0) runner!.destroy();
  measured.push(await measure(quantization));
}
report.runs = measured;
if (measured.length > 1) {
  const [base] = measured;
  log(`ratios to ${base!.quantization} (same run):`);
  for (const r of measured.slice(1)) {
    const decode = r.decode.map((d, j) =>
      `batch ${d.batch} ${(d.tokensPerS / base!.decode[j]!.tokensPerS).toFixed(2)}x`
    );
    const prefill = r.prefill.map((p, j) =>
      `prefill ${p.tokens} ${(p.tokensPerS / base!.prefill[j]!.tokensPerS).toFixed(2)}x`
    );
    log(
      `  ${r.quantization}: weight bytes ${(r.weightBytes / base!.weightBytes).toFixed(3)}x; ` +
        [...decode, ...prefill].join(", "),
    );
  }
}

// ---- Per-kernel breakdown of one decode step, at the model's exact shapes. ----

interface Group {
  name: string;
  ms: number;
}

async function breakdown(batch: number): Promise<Group[]> {
  const dtype = ctx.weightDtype;
  const L = c.numLayers;
  const H = c.hiddenSize;
  const D = c.headDim;
  const I = c.intermediateSize;
  const qkvWidth = (c.numHeads + 2 * c.numKvHeads) * D;
  const context = PROMPT + 1;
  const bt = Math.ceil(maxModelLen / BLOCK);
  const destroy: { destroy(): void }[] = [];
  const kv = new KvCache(ctx, {
    numLayers: L,
    numKvHeads: c.numKvHeads,
    headDim: D,
    blockSize: BLOCK,
    dtype,
  }, bt * batch);
  destroy.push(kv);
  const bufs = new StepBuffers(ctx, { maxTokens: batch, maxSeqs: batch, maxBlocksPerSeq: bt }, {
    hidden: H,
    qkv: qkvWidth,
    attn: c.numHeads * D,
    mlp: 2 * I,
    vocab: c.vocabSize,
  });
  destroy.push(bufs);
  const arena = new ParamArena(ctx, 64 + 40 * L);
  destroy.push(arena);
  const kernels = new KernelSet(ctx, dtype);
  const attention = new AttentionKernels(
    ctx,
    {
      numHeads: c.numHeads,
      numKvHeads: c.numKvHeads,
      headDim: D,
      qkvWidth,
      kOffset: c.numHeads * D,
      vOffset: (c.numHeads + c.numKvHeads) * D,
      maxModelLen,
    },
    kv,
    batch,
  );
  destroy.push(attention);
  const q = ctx.device.queue;
  const tables = new Uint32Array(batch * bt).map((_, i) => i);
  q.writeBuffer(bufs.blockTables, 0, tables);
  q.writeBuffer(bufs.contextLens, 0, new Uint32Array(batch).fill(context));
  q.writeBuffer(
    bufs.slotMapping,
    0,
    Uint32Array.from({ length: batch }, (_, s) => s * bt * BLOCK + context - 1),
  );
  q.writeBuffer(bufs.positions, 0, new Uint32Array(batch).fill(context - 1));
  q.writeBuffer(bufs.sampleIndices, 0, Uint32Array.from({ length: batch }, (_, s) => s));
  q.writeBuffer(
    bufs.sampleParams,
    0,
    packSampleParams(Array.from({ length: batch }, () => ({ temperature: 0 }))),
  );
  const inv = Float32Array.from({ length: D / 2 }, (_, i) => Math.pow(1e6, (-2 * i) / D));
  const invFreq = ctx.createBuffer("invFreq", inv.byteLength, STORAGE_RW);
  q.writeBuffer(invFreq, 0, inv);
  destroy.push(invFreq);
  const b = (buffer: GPUBuffer) => ({ buffer });
  const mat = (name: string, rows: number, cols: number) => {
    const m = GpuMatrix.create(ctx, name, rows, cols, dtype, { padColsTo: 4 });
    destroy.push(m);
    return m;
  };
  const vec = (name: string, n: number) => {
    const m = GpuMatrix.fromArray(ctx, name, new Float32Array(n).fill(1), 1, n, dtype);
    destroy.push(m);
    return m;
  };
  const normW = vec("norm", H);
  const headW = vec("head_norm", D);
  const layers = Array.from({ length: L }, (_, l) => ({
    qkv: kernels.matmul(false).bind(arena, {
      x: b(bufs.normed),
      weight: mat(`qkv${l}`, qkvWidth, H),
      y: b(bufs.qkv),
    }),
    o: kernels.matmul(false).bind(arena, {
      x: b(bufs.attnOut),
      weight: mat(`o${l}`, H, c.numHeads * D),
      y: b(bufs.delta),
    }),
    gateUp: kernels.matmul(false).bind(arena, {
      x: b(bufs.normed),
      weight: mat(`gate_up${l}`, 2 * I, H),
      y: b(bufs.mlpUp),
    }),
    down: kernels.matmul(false).bind(arena, {
      x: b(bufs.mlpAct),
      weight: mat(`down${l}`, H, I),
      y: b(bufs.delta),
    }),
    norm: kernels.rmsNorm.bind(arena, {
      weight: normW,
      x: b(bufs.delta),
      residual: b(bufs.hidden),
      out: b(bufs.normed),
    }, { eps: 1e-6 }),
    qNorm: kernels.rmsNorm.bind(arena, { weight: headW, x: b(bufs.qkv) }, {
      heads: c.numHeads,
      tokenStride: qkvWidth,
      offset: 0,
      eps: 1e-6,
    }),
    kNorm: kernels.rmsNorm.bind(arena, { weight: headW, x: b(bufs.qkv) }, {
      heads: c.numKvHeads,
      tokenStride: qkvWidth,
      offset: c.numHeads * D,
      eps: 1e-6,
    }),
    rope: kernels.rope.bind(
      arena,
      { qkv: b(bufs.qkv), positions: b(bufs.positions), invFreq: b(invFreq) },
      { heads: c.numHeads + c.numKvHeads, headDim: D, tokenStride: qkvWidth },
    ),
    attn: attention.bind(arena, bufs, kv, l),
    act: kernels.siluMul.bind(arena, { gateUp: b(bufs.mlpUp), out: b(bufs.mlpAct) }),
  }));
  const lmHead = kernels.matmul(false).bind(arena, {
    x: b(bufs.lastNormed),
    weight: mat("lm_head", c.vocabSize, H),
    y: b(bufs.logits),
  });
  const embed = kernels.embedding.bind(arena, {
    ids: b(bufs.ids),
    table: mat("embed", c.vocabSize, H),
    out: b(bufs.hidden),
  });
  const feed = kernels.tokenFeed.bind(arena, {
    hostIds: b(bufs.hostIds),
    sampled: b(bufs.sampled),
    ids: b(bufs.ids),
  });
  const add = kernels.add.bind(arena, { a: b(bufs.hidden), b: b(bufs.delta) });
  const gather = kernels.gatherRows.bind(arena, {
    src: b(bufs.hidden),
    indices: b(bufs.sampleIndices),
    out: b(bufs.lastHidden),
  });
  const finalNorm = kernels.rmsNorm.bind(arena, {
    weight: normW,
    x: b(bufs.lastHidden),
    out: b(bufs.lastNormed),
  }, { eps: 1e-6 });
  const sample = kernels.sample.bind(arena, {
    logits: b(bufs.logits),
    params: b(bufs.sampleParams),
    tokens: bufs.sampledTokens(0),
    logprobs: bufs.sampledLogprobs(0),
  });
  const step = {
    numTokens: batch,
    numSeqs: batch,
    allDecode: true,
    maxContextLen: context,
    numSampled: batch,
  };
  type Enc = (pass: GPUComputePassEncoder) => void;
  const perLayer =
    (f: (l: typeof layers[number], pass: GPUComputePassEncoder) => void): Enc => (pass) => {
      for (const l of layers) f(l, pass);
    };
  const groups: [string, Enc][] = [
    ["embedding + token feed", (p) => {
      feed.encode(p, batch);
      embed.encode(p, batch);
    }],
    [
      "rms_norm (2 per layer, fused residual)",
      perLayer((l, p) => {
        l.norm.encode(p, batch);
        l.norm.encode(p, batch);
      }),
    ],
    ["matmul qkv", perLayer((l, p) => l.qkv.encode(p, batch))],
    [
      "q/k head norm",
      perLayer((l, p) => {
        l.qNorm.encode(p, batch);
        l.kNorm.encode(p, batch);
      }),
    ],
    ["rope", perLayer((l, p) => l.rope.encode(p, batch))],
    ["reshape_and_cache + attention", perLayer((l, p) => l.attn.encode(p, step))],
    ["matmul o", perLayer((l, p) => l.o.encode(p, batch))],
    ["matmul gate_up", perLayer((l, p) => l.gateUp.encode(p, batch))],
    ["silu_mul", perLayer((l, p) => l.act.encode(p, batch, I))],
    ["matmul down", perLayer((l, p) => l.down.encode(p, batch))],
    ["final add + gather + norm", (p) => {
      add.encode(p, batch * H);
      gather.encode(p, batch, H);
      finalNorm.encode(p, batch);
    }],
    ["matmul lm_head", (p) => lmHead.encode(p, batch)],
    ["sample", (p) => sample.encode(p, batch, c.vocabSize)],
  ];
  const out: Group[] = [];
  try {
    for (const [name, enc] of groups) {
      const t = await timeGpu(ctx, enc, { arena, warmup: 1, repeats: 3 });
      out.push({ name, ms: t.medianMs });
    }
  } finally {
    for (const d of destroy.reverse()) d.destroy();
  }
  return out;
}

if (!args["no-breakdown"]) {
  const breakdowns: Record<string, Group[]> = {};
  for (const batch of args["breakdown-batches"].split(",").filter((b) => b !== "").map(Number)) {
    const groups = await breakdown(batch);
    breakdowns[`batch${batch}`] = groups;
    const total = groups.reduce((s, g) => s + g.ms, 0);
    log(`decode step breakdown, batch ${batch} (GPU timestamps, one pass per group):`);
    for (const g of [...groups].sort((a, b) => b.ms - a.ms)) {
      log(
        `  ${g.name.padEnd(40)} ${g.ms.toFixed(2).padStart(8)} ms ` +
          `${((100 * g.ms) / total).toFixed(1).padStart(5)}%`,
      );
    }
    log(`  ${"sum".padEnd(40)} ${total.toFixed(2).padStart(8)} ms`);
  }
  report.breakdown = breakdowns;
}

if (args.json) console.log(JSON.stringify(report, null, 2));

Deno.bench({
  name: "model decode step, batch 1 (host time incl. ~10 ms wait)",
  group: "model",
  async fn() {
    await decode(1, 1);
  },
});

globalThis.addEventListener("unload", () => {
  runner.destroy();
  if (generated) Deno.removeSync(modelDir, { recursive: true });
});
