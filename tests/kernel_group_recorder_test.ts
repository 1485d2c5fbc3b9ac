/**
 * The per-kernel-group timing mode: `ModelRunner.execute(batch, { groups: recorder })` records
 * every dispatch of the step under the kernel group the runner or model names, without changing
 * what the step computes; the model bench's breakdown replays and times each group.
 */

import assert from "node:assert/strict";
import type { GpuContext } from "../gpu/context.ts";
import { ModelRunner } from "../engine/model_runner.ts";
import { KernelGroupRecorder } from "../engine/models/kernel_group_recorder.ts";
import { makeModel } from "../tools/make_model.ts";
import { StepCostProbe } from "../bench/lib/step_cost.ts";
import { breakdown, prefillBreakdown } from "../bench/model_bench/breakdown.ts";
import { BLOCK, PROMPT } from "../bench/model_bench/options.ts";
import { BenchWorkload } from "../bench/model_bench/workload.ts";
import { ReferenceModel } from "./reference/model.ts";
import { GPU_TEST, testContext } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { SOLO_RUNNER_OPTIONS } from "./support/solo_run.ts";

/**
 * The groups of a Llama-family step with q/k norms (Qwen3), in step order: under the gpu kernel
 * profile (`fused`) the projections read the norms themselves (no rms_norm group); under the cpu
 * profile, in steps of at most SPLIT_NORM_MAX_TOKENS tokens (the decode steps here), o and down
 * (all layers' but the last) write the next norm's input, so the only rms_norm is layer 0's input
 * norm; under either profile an all-decode step's attention does the q/k norms, RoPE and the K/V
 * write (no rope_and_cache group; the tiny model's shape fits the cpu profile's fused unrolled
 * kernel).
 */
const QWEN3_GROUPS = (fused: boolean, decode = false) => {
  const split = !fused && decode;
  return [
    "embedding + token feed",
    ...(fused ? ["matmul qkv (+ residual add, rms_norm)"] : [
      split ? "rms_norm (layer 0's input)" : "rms_norm (2 per layer, fused residual)",
      "matmul qkv",
    ]),
    ...(decode
      ? ["attention (+ q/k norm, rope, kv write)"]
      : ["q/k norm + rope + kv write", "attention"]),
    split ? "matmul o (+ residual add, norm input)" : "matmul o",
    fused ? "matmul gate_up (+ residual add, rms_norm)" : "matmul gate_up",
    ...(split
      ? ["matmul down (+ silu_mul, residual add, norm input)", "matmul down (+ silu_mul)"]
      : ["matmul down (+ silu_mul)"]),
    "final add + gather + norm",
    "matmul lm_head",
    "sample",
  ];
};

const GPT2_GROUPS = [
  "embedding + token feed",
  "layer_norm (2 per layer)",
  "matmul qkv",
  "reshape_and_cache + attention",
  "matmul o",
  "add residual (2 per layer)",
  "matmul fc",
  "gelu_new",
  "matmul mlp proj",
  "final gather + norm",
  "matmul lm_head",
  "sample",
];

/** A pass that logs the calls the recorder forwards or replays into it. */
function loggingPass(log: string[]): GPUComputePassEncoder {
  return {
    setPipeline: (p: { label: string }) => log.push(`pipeline ${p.label}`),
    setBindGroup: (i: number, g: { label: string }) => log.push(`bind ${i} ${g.label}`),
    dispatchWorkgroups: (x: number, y?: number, z?: number) =>
      log.push(`dispatch ${x} ${y ?? 1} ${z ?? 1}`),
  } as unknown as GPUComputePassEncoder;
}

Deno.test("KernelGroupRecorder.replay() re-encodes one group's commands in step order, and only dispatching groups are listed", () => {
  const target: string[] = [];
  const recorder = new KernelGroupRecorder();
  assert.throws(() => recorder.at("a"), /before use/);
  recorder.use(loggingPass(target));
  const pipeline = (label: string) => ({ label }) as unknown as GPUComputePipeline;
  const group = (label: string) => ({ label }) as unknown as GPUBindGroup;
  recorder.at("a").setPipeline(pipeline("p1"));
  recorder.at("a").setBindGroup(0, group("g1"));
  recorder.at("a").dispatchWorkgroups(3);
  recorder.at("b").setPipeline(pipeline("p2"));
  recorder.at("b").setBindGroup(0, group("g2"));
  recorder.at("b").dispatchWorkgroups(4, 2);
  recorder.at("a").dispatchWorkgroups(5, 1, 7);
  recorder.at("empty");
  assert.deepEqual(target, [
    "pipeline p1",
    "bind 0 g1",
    "dispatch 3 1 1",
    "pipeline p2",
    "bind 0 g2",
    "dispatch 4 2 1",
    "dispatch 5 1 7",
  ]);
  assert.deepEqual(recorder.groups, ["a", "b"]);
  assert.equal(recorder.dispatches(), 3);
  assert.equal(recorder.dispatches("a"), 2);
  const replayed: string[] = [];
  recorder.replay("a", loggingPass(replayed));
  assert.deepEqual(replayed, ["pipeline p1", "bind 0 g1", "dispatch 3 1 1", "dispatch 5 1 7"]);
  assert.throws(() => recorder.replay("empty", loggingPass([])), /no dispatch/);
  recorder.use(loggingPass([]));
  assert.deepEqual(recorder.groups, [], "use() starts a new recording");
});

for (
  const [preset, groupsOf] of [
    ["tiny-qwen3", QWEN3_GROUPS],
    ["tiny-gpt2", (_fused: boolean, _decode: boolean) => GPT2_GROUPS],
  ] as const
) {
  Deno.test(
    `ModelRunner.execute() with timing.groups records every dispatch under its kernel group and still samples the reference's greedy tokens (${preset})`,
    GPU_TEST,
    async () => {
      const dir = await Deno.makeTempDir();
      try {
        const { seed, rng } = testSeed(`kernel groups ${preset}`);
        await makeModel({ out: dir, preset, dtype: "f32", seed: seed % 1000, shards: 1 });
        const ref = await ReferenceModel.load(dir);
        const ctx = await testContext({ forceF32: true });
        const runner = await ModelRunner.load(ctx, dir, SOLO_RUNNER_OPTIONS);
        try {
          const prompt = Array.from({ length: 9 }, () => rng.int(0, 500));
          const expected = ref.greedy(prompt, 6).map((s) => s.token);
          const recorder = new KernelGroupRecorder();
          const tokens: number[] = [];
          let ids = prompt;
          let pos = 0;
          while (tokens.length < expected.length) {
            const positions = Uint32Array.from(ids, (_, i) => pos + i);
            const probe = new StepCostProbe();
            const step = probe.measure(() =>
              runner.execute({
                inputIds: Uint32Array.from(ids),
                positions,
                slotMapping: positions,
                seqs: [{
                  queryLen: ids.length,
                  contextLen: pos + ids.length,
                  blockTable: Array.from(
                    { length: Math.ceil((pos + ids.length) / 16) },
                    (_, j) => j,
                  ),
                  sample: { temperature: 0 },
                }],
              }, { groups: recorder })
            );
            const token = (await step.result).tokens[0]!;
            const context = `seed ${seed}, position ${pos}`;
            assert.deepEqual(recorder.groups, groupsOf(!ctx.isCpuProfile, pos > 0), context);
            assert.equal(recorder.dispatches(), probe.result().dispatchesPerCall, context);
            tokens.push(token);
            pos += ids.length;
            ids = [token];
          }
          assert.deepEqual(tokens, expected, `seed ${seed}, prompt ${prompt}`);
        } finally {
          runner.destroy();
        }
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    },
  );
}

/** `ctx` as an adapter without `timestamp-query` would present it. */
function withoutTimestamps(ctx: GpuContext): GpuContext {
  return new Proxy(ctx, {
    get(target, key) {
      if (key === "hasTimestamps") return false;
      const value = Reflect.get(target, key, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

for (const timestamps of [true, false]) {
  Deno.test(
    `breakdown() and prefillBreakdown() through the runner time every kernel group of the model, each above zero (${
      timestamps ? "GPU timestamps" : "host clock: no timestamp-query"
    })`,
    GPU_TEST,
    async () => {
      const dir = await Deno.makeTempDir();
      try {
        await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed: 7, shards: 1 });
        const ctx = await testContext({ forceF32: true });
        const blocksPerSeq = Math.ceil((PROMPT + 32) / BLOCK);
        const runner = await ModelRunner.load(ctx, dir, {
          maxTokens: PROMPT,
          maxSeqs: 2,
          maxModelLen: PROMPT + 32,
          blockSize: BLOCK,
          numKvBlocks: blocksPerSeq * 3,
          showProgress: false,
        });
        try {
          const work = new BenchWorkload(runner, blocksPerSeq);
          await work.prefill(PROMPT, 0);
          const groups = await breakdown(timestamps ? ctx : withoutTimestamps(ctx), work, 2);
          assert.deepEqual(groups.map((g) => g.name), QWEN3_GROUPS(!ctx.isCpuProfile, true));
          for (const g of groups) {
            assert.ok(Number.isFinite(g.ms) && g.ms > 0, `${g.name}: ${g.ms} ms`);
          }
          // The matmul groups report their arithmetic: 2 M N K per layer (M = 2 sequences; the
          // LM head over the 2 sampled rows), and weight bytes; the other groups none.
          const c = runner.config;
          const qkvN = (c.numHeads + 2 * c.numKvHeads) * c.headDim;
          const perLayer: Record<string, number> = {
            qkv: qkvN * c.hiddenSize,
            o: c.hiddenSize * c.numHeads * c.headDim,
            gate_up: 2 * c.intermediateSize * c.hiddenSize,
            down: c.hiddenSize * c.intermediateSize,
          };
          // A kind's layers may span two groups (the cpu profile's down: all layers' but the
          // last write the next norm's input): FLOPs and bytes are checked per kind.
          const perKind = new Map<string, { flops: number; bytes: number }>();
          for (const g of groups) {
            const kind = /^matmul (\w+)/.exec(g.name)?.[1];
            if (g.name.startsWith("attention")) {
              // 2 sequences at context PROMPT + 1: q.K and p.V per query head, f32 K and V rows.
              const tokens = c.numLayers * 2 * (PROMPT + 1);
              assert.deepEqual(g.work, {
                flops: 4 * tokens * c.numHeads * c.headDim,
                bytes: 2 * tokens * c.numKvHeads * c.headDim * 4,
              });
              continue;
            }
            if (kind === undefined) {
              assert.equal(g.work, undefined, g.name);
              continue;
            }
            assert.ok(g.work !== undefined, `${g.name} reports its work`);
            const sum = perKind.get(kind) ?? { flops: 0, bytes: 0 };
            perKind.set(kind, { flops: sum.flops + g.work.flops, bytes: sum.bytes + g.work.bytes });
          }
          assert.deepEqual([...perKind.keys()].sort(), ["down", "gate_up", "lm_head", "o", "qkv"]);
          for (const [kind, work] of perKind) {
            const weights = kind === "lm_head"
              ? c.vocabSize * c.hiddenSize
              : c.numLayers * perLayer[kind]!;
            assert.equal(work.flops, 2 * 2 * weights, `matmul ${kind} FLOPs`);
            assert.ok(work.bytes >= 4 * weights, `matmul ${kind}: ${work.bytes} bytes of f32`);
          }
          // The prefill of one 40-token sequence: the same groups (prefill attention).
          const prefill = await prefillBreakdown(
            timestamps ? ctx : withoutTimestamps(ctx),
            work,
            40,
          );
          assert.deepEqual(prefill.map((g) => g.name), QWEN3_GROUPS(!ctx.isCpuProfile));
          for (const g of prefill) {
            assert.ok(Number.isFinite(g.ms) && g.ms > 0, `prefill ${g.name}: ${g.ms} ms`);
          }
        } finally {
          runner.destroy();
        }
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    },
  );
}
