/**
 * Where the host's time of one decode step goes, call by call: the real {@linkcode ModelRunner}
 * runs `--steps` decode steps of `--batch` sequences with the device's work stubbed out
 * (`queue.submit` does nothing; an empty submission after each step, untimed, lets the queue's
 * writes run), so no GPU or lavapipe thread competes with the host and every millisecond printed
 * is the host's own. Every WebGPU method of the command encoder, the compute
 * pass, the queue and the device is wrapped for the measured steps; the report gives, per step,
 * the calls of each method and the mean time inside them, and what `execute` spends outside them
 * (the engine's JavaScript: the median step timed first with nothing wrapped, less the median
 * step's time inside the calls in the wrapped run). The outputs of a stubbed step are garbage: nothing is checked, only timed.
 * The stub costs `finish` something of its own: wgpu cannot recycle the encoders of command
 * buffers never submitted, and `finish` takes ~1.6x longer then (bench/encode_floor.ts `--drop`);
 * read its time as an upper bound.
 *
 * Run: `deno run -A bench/host_calls.ts [--model DIR] [--batch 1] [--steps 300]
 * [--context 144] [--max-model-len 4096] [--kernel-profile auto|cpu|gpu]`: the sequences hold
 * `--context`-token contexts (their block tables point into a pool of 64 KV blocks: the stubbed
 * steps compute nothing, so the cache need not be that large); `--max-model-len` sizes the block
 * tables' rows, as the engine's option does (at least `--context`). Without `--model` the
 * qwen3-0.6b preset is generated (as bench:model does).
 *
 * @module
 */

import { ModelRunner } from "../engine/model_runner.ts";
import { benchContext, describeMachine } from "./support.ts";
import { modelDirectory } from "./model_bench/setup.ts";
import { BenchWorkload } from "./model_bench/workload.ts";
import { BLOCK, PROMPT } from "./model_bench/options.ts";
import { median, wrap } from "./lib/step_cost.ts";
import { isPositiveInteger, kernelProfileOption, scriptFlags } from "./bench_io.ts";

const values = scriptFlags("bench/host_calls.ts", Deno.args, {
  model: { type: "string" },
  batch: { type: "string", default: "1" },
  steps: { type: "string", default: "300" },
  "max-model-len": { type: "string", default: "4096" },
  context: { type: "string", default: String(PROMPT + 16) },
  "kernel-profile": { type: "string" },
}, (v) => {
  if (![v.batch, v.steps, v.context, v["max-model-len"]].every(isPositiveInteger)) {
    throw new Error("--batch, --steps, --context and --max-model-len take positive integers");
  }
  kernelProfileOption(v["kernel-profile"]);
});
const batch = Number(values.batch);
const steps = Number(values.steps);
const context = Number(values.context);
const maxModelLen = Math.max(Number(values["max-model-len"]), context);
/** KV blocks the tables point into (ids reused across sequences and positions). */
const POOL_BLOCKS = 64;
const ctx = await benchContext({
  kernelProfile: kernelProfileOption(values["kernel-profile"]),
});
const model = await modelDirectory(values.model);
const blocksPerSeq = Math.ceil(context / BLOCK);
const runner = await ModelRunner.load(ctx, model.dir, {
  maxTokens: 512,
  maxSeqs: batch,
  maxModelLen: Math.max(maxModelLen, blocksPerSeq * BLOCK),
  blockSize: BLOCK,
  numKvBlocks: POOL_BLOCKS,
  showProgress: false,
});
const work = new BenchWorkload(runner, blocksPerSeq);
const tables = Array.from(
  { length: batch },
  (_, s) => Array.from({ length: blocksPerSeq }, (_, j) => (s * 7 + j) % POOL_BLOCKS),
);
const input = work.decodeStep(tables, context - 1, (s) => (s * 7 + 1) % work.vocabTokens);

const submit = GPUQueue.prototype.submit;
/** ms inside the wrapped calls during the current step. */
let insideStep = 0;

/**
 * Median ms of `execute`, and of the time inside the wrapped calls, over `n` awaited steps after
 * 20 of warm-up (`timed` turns the wrappers' accounting on for the counted steps).
 */
async function executeMs(n: number, timed: (on: boolean) => void = () => {}) {
  const exec: number[] = [];
  const inside: number[] = [];
  for (let i = 0; i < n + 20; i++) {
    timed(i >= 20);
    insideStep = 0;
    const t = performance.now();
    const h = runner.execute(input, {});
    if (i >= 20) {
      exec.push(performance.now() - t);
      inside.push(insideStep);
    }
    timed(false);
    // An empty submission, untimed: wgpu runs the step's queue writes (the staging copies), so
    // their memory is reused as in a real step rather than piling up.
    submit.call(ctx.device.queue, []);
    await h.result;
  }
  return { execute: median(exec), inside: median(inside) };
}

// First with only queue.submit stubbed: the step's host time, nothing wrapped.
const unstub = wrap(GPUQueue.prototype, "submit", () => undefined);
const plain = await executeMs(steps);
unstub();

const calls = new Map<string, { n: number; ms: number }>();
let measuring = false;
const restore: (() => void)[] = [];
for (const cls of [GPUComputePassEncoder, GPUCommandEncoder, GPUQueue, GPUDevice]) {
  const proto = cls.prototype;
  for (const name of Object.getOwnPropertyNames(proto)) {
    const d = Object.getOwnPropertyDescriptor(proto, name);
    if (name === "constructor" || typeof d?.value !== "function") continue;
    const key = `${cls.name}.${name}`;
    const stub = key === "GPUQueue.submit";
    restore.push(wrap(proto, name, (original, self, args) => {
      if (!measuring) return stub ? undefined : original.apply(self, args);
      const t = performance.now();
      try {
        return stub ? undefined : original.apply(self, args);
      } finally {
        const ms = performance.now() - t;
        const c = calls.get(key) ?? { n: 0, ms: 0 };
        c.n++;
        c.ms += ms;
        calls.set(key, c);
        insideStep += ms;
      }
    }));
  }
}

// Then every call wrapped and timed (each step awaited: its readback finds nothing to wait for).
const wrapped = await executeMs(steps, (on) => (measuring = on));
for (const r of restore) r();

console.log(`host_calls: ${describeMachine(ctx)}`);
console.log(
  `command: deno run -A bench/host_calls.ts ${Deno.args.join(" ")}`.trim() +
    `; kernel profile ${ctx.profile}; model ${model.generated ? "qwen3-0.6b preset" : model.dir}` +
    `; batch ${batch}, context ${context}, max_model_len ${maxModelLen}, ${steps} decode ` +
    `steps with queue.submit ` +
    "stubbed out",
);
for (const [key, c] of [...calls].sort((a, b) => b[1].ms - a[1].ms)) {
  console.log(
    `  ${key.padEnd(42)} ${(c.n / steps).toFixed(1).padStart(6)} calls ` +
      `${(1000 * c.ms / steps).toFixed(1).padStart(7)} us per step`,
  );
}
console.log(
  `block tables: ${runner.stagedBlockTableEntries} entries staged per step (a header of one ` +
    `per sequence and the entries its table gained; ${batch * blocksPerSeq} in the tables)`,
);
console.log(
  `execute, median step: ${plain.execute.toFixed(3)} ms (${wrapped.execute.toFixed(3)} with the ` +
    `calls wrapped), ${wrapped.inside.toFixed(3)} ms inside WebGPU calls, ` +
    `${(plain.execute - wrapped.inside).toFixed(3)} ms outside them (the engine's JavaScript: ` +
    `the unwrapped step less the time inside the calls)`,
);
runner.destroy();
if (model.generated) await Deno.remove(model.dir, { recursive: true });
ctx.destroy();
