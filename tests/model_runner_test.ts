import assert from "node:assert/strict";
import type { LogitsProcessing } from "../engine/forward_batch.ts";
import {
  ModelRunner,
  type ModelRunnerOptions,
  type StepHandle,
  type StepOptions,
} from "../engine/model_runner.ts";
import { makeModel } from "../tools/make_model.ts";
import { ReferenceModel } from "./reference/model.ts";
import { GPU_TEST, HAS_F16, testContext } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import {
  assertGreedyMatchesReference,
  referenceRun,
  SOLO_RUNNER_OPTIONS,
  soloGreedy,
  type SoloPenalties,
  soloRun,
} from "./support/solo_run.ts";

const PRESETS = ["tiny-qwen3", "tiny-qwen2", "tiny-llama", "tiny-gpt2"] as const;
const MAX_TOKENS = 32;

for (const preset of PRESETS) {
  Deno.test(
    `ModelRunner greedy generation equals the float64 reference for ${preset} (f32 weights)`,
    GPU_TEST,
    async () => {
      const dir = await Deno.makeTempDir();
      try {
        const { seed, rng } = testSeed(`runner ${preset}`);
        await makeModel({ out: dir, preset, dtype: "f32", seed: seed % 1000, shards: 1 });
        const ref = await ReferenceModel.load(dir);
        const ctx = await testContext({ forceF32: true });
        const runner = await ModelRunner.load(ctx, dir, SOLO_RUNNER_OPTIONS);
        try {
          const blocks = rng.permutation(SOLO_RUNNER_OPTIONS.numKvBlocks);
          for (const len of [1, 7, 33]) {
            const prompt = Array.from({ length: len }, () => rng.int(0, 500));
            const expected = ref.greedy(prompt, MAX_TOKENS).map((s) => s.token);
            // Steps overlapped with the next step's encoding (the gpu profile's engine, which
            // starts their readbacks 3 at a time), one at a time, or not overlapped.
            const overlap = len !== 7;
            const readbackBatch = len === 33 ? 3 : 1;
            const got = await soloGreedy(runner, prompt, MAX_TOKENS, {
              blocks,
              overlap,
              readbackBatch,
            });
            assert.deepEqual(
              got,
              expected,
              `seed ${seed} prompt length ${len}, overlap ${overlap} batch ${readbackBatch}: ${prompt}`,
            );
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

/**
 * With f16 weights and KV cache (bf16 or f16 checkpoints), greedy tokens must equal the float64
 * reference up to the first step whose top-2 logit gap in the reference is below GAP_TOLERANCE:
 * there, rounding may legitimately flip the argmax and the rest of the sequence is not compared.
 * Each kernel's f16 error is bounded by its own test (3e-3 normwise); if the accumulated logit
 * error of the whole model exceeded 0.02, the comparison below would fail, as it would for a
 * wrong kernel (errors of order 0.1-1 on these models' O(1) logits).
 */
const GAP_TOLERANCE = 0.02;

for (
  const [preset, dtype] of [["tiny-qwen3", "bf16"], ["tiny-gpt2", "f16"], ["tiny-qwen2", "bf16"], [
    "tiny-llama",
    "f16",
  ]] as const
) {
  Deno.test(
    `ModelRunner greedy generation with f16 weights follows the reference for ${preset} (${dtype} checkpoint)`,
    { ...GPU_TEST, ignore: !HAS_F16 },
    async () => {
      const dir = await Deno.makeTempDir();
      try {
        const { seed, rng } = testSeed(`runner f16 ${preset}`);
        await makeModel({ out: dir, preset, dtype, seed: seed % 1000 });
        const ref = await ReferenceModel.load(dir);
        const ctx = await testContext();
        assert.equal(ctx.weightDtype, "f16");
        const runner = await ModelRunner.load(ctx, dir, SOLO_RUNNER_OPTIONS);
        try {
          // Three prompts always; more (up to six) while fewer than 8 steps were comparable: a
          // random tiny model sometimes has near-ties early (seed 3266031341 had 2 in three).
          await assertGreedyMatchesReference(runner, ref, rng, seed, {
            lengths: [1, 7, 33, 12, 20, 5],
            maxTokens: MAX_TOKENS,
            minCompared: 8,
            gapTolerance: GAP_TOLERANCE,
          });
        } finally {
          runner.destroy();
        }
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    },
  );
}

/** A tiny-qwen3 f32 model, its float64 reference and a runner (forceF32), for `body`. */
async function withRunner(
  name: string,
  body: (
    runner: ModelRunner,
    ref: ReferenceModel,
    seed: number,
    rng: ReturnType<typeof testSeed>["rng"],
  ) => Promise<void>,
  options: ModelRunnerOptions = SOLO_RUNNER_OPTIONS,
): Promise<void> {
  const dir = await Deno.makeTempDir();
  try {
    const { seed, rng } = testSeed(name);
    await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed: seed % 1000 });
    const ref = await ReferenceModel.load(dir);
    const ctx = await testContext({ forceF32: true });
    const runner = await ModelRunner.load(ctx, dir, options);
    try {
      await body(runner, ref, seed, rng);
    } finally {
      runner.destroy();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const PENALTY_CASES: { name: string; penalties: SoloPenalties }[] = [
  { name: "repetition 1.8", penalties: { repetitionPenalty: 1.8 } },
  {
    name: "presence 1.5, frequency 0.7",
    penalties: { presencePenalty: 1.5, frequencyPenalty: 0.7 },
  },
  {
    name: "repetition 0.8 (rewards), frequency -0.2, logit bias",
    penalties: {
      repetitionPenalty: 0.8,
      frequencyPenalty: -0.2,
      logitBias: new Map([[7, 2.5], [100, -3], [511, 1]]),
    },
  },
];
const PENALTY_TOKENS = 24;

Deno.test(
  "ModelRunner penalised greedy decoding equals the float64 reference with 6 steps in flight (f32 weights)",
  GPU_TEST,
  () =>
    withRunner("runner penalties", async (runner, ref, seed, rng) => {
      for (const c of PENALTY_CASES) {
        let differs = 0;
        for (const [len, chunk] of [[5, 5], [19, 8]] as const) {
          const prompt = Array.from({ length: len }, () => rng.int(0, 500));
          const expected = referenceRun(ref, prompt, PENALTY_TOKENS, c.penalties);
          const got = await soloRun(runner, prompt, PENALTY_TOKENS, {
            chunk,
            blocks: rng.permutation(SOLO_RUNNER_OPTIONS.numKvBlocks),
            penalties: c.penalties,
            depth: 6,
            overlap: len === 19,
          });
          assert.deepEqual(
            got.tokens,
            expected.map((s) => s.token),
            `seed ${seed}, ${c.name}, prompt ${prompt}`,
          );
          const plain = ref.greedy(prompt, PENALTY_TOKENS).map((s) => s.token);
          if (plain.some((t, i) => t !== got.tokens[i])) differs++;
        }
        assert.ok(differs > 0, `seed ${seed}, ${c.name}: the penalties changed no output`);
      }
      assert.equal(runner.penaltyHistories.inUse, 0, `seed ${seed}: history left behind`);
    }),
);

/**
 * Runs `body` with every `writeBuffer` into a logits-processing buffer (labels `process*`)
 * counted per `runner.execute` call: bytes by buffer label, one map per step.
 */
async function countProcessUploads<T>(
  runner: ModelRunner,
  body: () => Promise<T>,
): Promise<{ result: T; steps: Map<string, number>[] }> {
  // Direct writes (`queue.writeBuffer`) and staged ones (copied in place by the step's command
  // buffer, gpu/staged_writes.ts) both count.
  const queue = GPUQueue.prototype;
  const write = queue.writeBuffer;
  const encoderProto = GPUCommandEncoder.prototype;
  const copy = encoderProto.copyBufferToBuffer;
  const steps: Map<string, number>[] = [];
  let current: Map<string, number> | null = null;
  const count = (buffer: GPUBuffer, bytes: number) => {
    if (current !== null && buffer.label.startsWith("process")) {
      current.set(buffer.label, (current.get(buffer.label) ?? 0) + bytes);
    }
  };
  queue.writeBuffer = function (this: GPUQueue, ...args: Parameters<GPUQueue["writeBuffer"]>) {
    const [buffer, , data, dataOffset = 0, size] = args;
    const el = ArrayBuffer.isView(data) && "BYTES_PER_ELEMENT" in data
      ? data.BYTES_PER_ELEMENT as number
      : 1;
    count(buffer, (size ?? data.byteLength / el - dataOffset) * el);
    return write.apply(this, args);
  };
  encoderProto.copyBufferToBuffer = function (this: GPUCommandEncoder, ...args: unknown[]) {
    const [, , target, , size] = args as [GPUBuffer, number, GPUBuffer, number, number];
    count(target, size);
    return (copy as (...a: unknown[]) => void).apply(this, args);
  } as GPUCommandEncoder["copyBufferToBuffer"];
  const execute = runner.execute;
  runner.execute = function (this: ModelRunner, ...args: Parameters<ModelRunner["execute"]>) {
    current = new Map();
    try {
      return execute.apply(this, args);
    } finally {
      steps.push(current);
      current = null;
    }
  };
  try {
    return { result: await body(), steps };
  } finally {
    queue.writeBuffer = write;
    encoderProto.copyBufferToBuffer = copy;
    delete (runner as { execute?: unknown }).execute;
  }
}

Deno.test(
  "ModelRunner uploads the same logits-processing bytes per step at output token 3 and 40, and a penalised prompt once",
  GPU_TEST,
  () =>
    withRunner("runner penalty uploads", async (runner, ref, seed, rng) => {
      const prompt = Array.from({ length: 9 }, () => rng.int(0, 500));
      const penalties = PENALTY_CASES[2]!.penalties; // every list: prompt, output, bias
      const { result, steps } = await countProcessUploads(
        runner,
        () => soloRun(runner, prompt, 42, { penalties, depth: 6, overlap: true }),
      );
      const context = `seed ${seed}`;
      assert.deepEqual(
        result.tokens,
        referenceRun(ref, prompt, 42, penalties).map((s) => s.token),
        context,
      );
      // Step i samples output token i (one prefill step).
      assert.equal(steps.length, 42, context);
      assert.deepEqual(steps[40], steps[3], context);
      assert.ok((steps[3]!.get("processParams") ?? 0) > 0, `${context}: ${[...steps[3]!]}`);
      assert.equal(steps[0]!.get("process.history"), 4 * prompt.length, context);
      assert.ok(steps.slice(1).every((s) => !s.has("process.history")), context);
      assert.equal(runner.penaltyHistories.inUse, 0, `${context}: history left behind`);
    }),
);

Deno.test(
  "ModelRunner.execute() refuses a penalised row without a history, or whose history would miss tokens, and creates nothing",
  GPU_TEST,
  () =>
    withRunner("runner penalty checks", (runner) => {
      const at = Uint32Array.of(0, 1, 2);
      const step = (process: LogitsProcessing) => () =>
        runner.execute({
          inputIds: Uint32Array.of(5, 6, 7),
          positions: at,
          slotMapping: at,
          seqs: [{
            queryLen: 3,
            contextLen: 3,
            blockTable: [0],
            sample: { temperature: 0 },
            process,
          }],
        });
      assert.throws(step({ repetitionPenalty: 1.2 }), /no history/);
      const history = (promptTokens: number[]) => ({ key: "x", promptTokens });
      // A new history at 3 tokens for a 2-token prompt would miss output token 0.
      assert.throws(step({ presencePenalty: 1, history: history([5, 6]) }), /past its prompt/);
      assert.throws(step({ frequencyPenalty: 1, history: history([5, 6, 7, 8]) }), /prompt of 4/);
      assert.equal(runner.penaltyHistories.inUse, 0);
      return Promise.resolve();
    }),
);

Deno.test(
  "ModelRunner logit_bias +100 forces a token and -100 bans the plain greedy tokens",
  GPU_TEST,
  () =>
    withRunner("runner logit bias", async (runner, ref, seed, rng) => {
      const prompt = Array.from({ length: 9 }, () => rng.int(0, 500));
      const forced = rng.int(0, 511);
      const got = await soloRun(runner, prompt, 12, {
        penalties: { logitBias: new Map([[forced, 100]]) },
      });
      assert.deepEqual(got.tokens, new Array(12).fill(forced), `seed ${seed}, token ${forced}`);
      const plain = [...new Set(ref.greedy(prompt, 12).map((s) => s.token))];
      const ban = { logitBias: new Map(plain.map((t) => [t, -100] as const)) };
      const banned = await soloRun(runner, prompt, 12, { penalties: ban });
      assert.deepEqual(
        banned.tokens,
        referenceRun(ref, prompt, 12, ban).map((s) => s.token),
        `seed ${seed}, banned ${plain}`,
      );
      assert.ok(banned.tokens.every((t) => !plain.includes(t)), `seed ${seed}: ${banned.tokens}`);
    }),
);

/** Top logprobs must match in ids (up to near-ties) and values (absolute 1e-4). */
function assertTop(
  got: readonly { tokenId: number; logprob: number }[],
  expected: { ids: number[]; logprobs: number[] },
  context: string,
): void {
  assert.equal(got.length, expected.ids.length, context);
  got.forEach((g, j) => {
    assert.ok(
      Math.abs(g.logprob - expected.logprobs[j]!) < 1e-4,
      `${context}, rank ${j}: logprob ${g.logprob}, expected ${expected.logprobs[j]}`,
    );
    // Equal ids unless the reference's neighbour is within the tolerance (a near-tie).
    const tied = expected.logprobs.some((l, k) =>
      k !== j && Math.abs(l - expected.logprobs[j]!) < 1e-4 && expected.ids[k] === g.tokenId
    );
    assert.ok(g.tokenId === expected.ids[j] || tied, `${context}, rank ${j}: id ${g.tokenId}`);
  });
}

Deno.test(
  "ModelRunner top logprobs equal the reference's top-k of the raw log_softmax, with and without penalties",
  GPU_TEST,
  () =>
    withRunner("runner top logprobs", async (runner, ref, seed, rng) => {
      for (const [k, penalties] of [[5, {}], [20, PENALTY_CASES[2]!.penalties], [1, {}]] as const) {
        const prompt = Array.from({ length: 11 }, () => rng.int(0, 500));
        const expected = referenceRun(ref, prompt, 10, penalties, k);
        const got = await soloRun(runner, prompt, 10, { penalties, topLogprobs: k });
        assert.deepEqual(got.tokens, expected.map((s) => s.token), `seed ${seed}, k ${k}`);
        expected.forEach((e, i) => {
          const context = `seed ${seed}, k ${k}, step ${i}`;
          assertTop(got.top[i]!, e.top, context);
          if (Object.keys(penalties).length === 0) {
            assert.ok(Math.abs(got.logprobs[i]! - e.rawLogprob) < 1e-4, context);
          }
        });
      }
      // Rows that ask for none get none.
      const plain = await soloRun(runner, [1, 2, 3], 3);
      assert.deepEqual(plain.top, [[], [], []], `seed ${seed}`);
    }),
);

/** Whether `p` settles within `ms` milliseconds. */
function settledWithin(p: Promise<unknown>, ms: number): Promise<boolean> {
  return Promise.race([
    p.then(() => true),
    new Promise<boolean>((r) => setTimeout(() => r(false), ms)),
  ]);
}

/** One greedy step of a single sequence kept in KV block 0: `ids` at positions `at`. */
function blockZeroStep(
  runner: ModelRunner,
  ids: Uint32Array,
  at: Uint32Array,
  options: StepOptions,
): StepHandle {
  return runner.execute({
    inputIds: ids,
    positions: at,
    slotMapping: at,
    seqs: [{
      queryLen: ids.length,
      contextLen: at.at(-1)! + 1,
      blockTable: [0],
      sample: { temperature: 0 },
    }],
  }, options);
}

Deno.test(
  "ModelRunner with maxInFlight 11 keeps 11 steps in flight, its ring wrapping, equal to the float64 reference",
  GPU_TEST,
  () =>
    withRunner("runner max in flight", async (runner, ref, seed, rng) => {
      assert.equal(runner.maxInFlight, 11);
      const prompt = Array.from({ length: 7 }, () => rng.int(0, 500));
      // 40 tokens through a ring of 12 slots: each slot is reused three times while 11 steps
      // that feed on earlier slots are in flight; readbacks start 6 at a time.
      for (const penalties of [{}, { repetitionPenalty: 1.7, frequencyPenalty: 0.4 }]) {
        const got = await soloRun(runner, prompt, 40, {
          depth: 11,
          overlap: true,
          readbackBatch: 6,
          penalties,
        });
        assert.deepEqual(
          got.tokens,
          referenceRun(ref, prompt, 40, penalties).map((s) => s.token),
          `seed ${seed}, penalties ${JSON.stringify(penalties)}`,
        );
      }
      assert.throws(
        () =>
          blockZeroStep(runner, Uint32Array.of(1), Uint32Array.of(0), {
            overlap: true,
            readbackBatch: 12,
          }),
        /^RangeError: Cannot batch 12 readbacks: between 1 and 11 steps may be in flight/,
      );
      runner.flush();
    }, { ...SOLO_RUNNER_OPTIONS, maxInFlight: 11 }),
);

Deno.test(
  "ModelRunner.execute() with readbackBatch 3 starts three deferred readbacks together at the next execute",
  GPU_TEST,
  () =>
    withRunner("runner readback batch", async (runner, _ref, seed, rng) => {
      const prompt = Array.from({ length: 5 }, () => rng.int(0, 500));
      const handles: StepHandle[] = [];
      const step = (readbackBatch = 3) => {
        const n = handles.length;
        const ids = n === 0
          ? Uint32Array.from(prompt)
          : Uint32Array.of(runner.sampledRef(handles[n - 1]!.step, 0));
        const at = n === 0
          ? Uint32Array.from(prompt, (_, i) => i)
          : Uint32Array.of(prompt.length + n - 1);
        handles.push(blockZeroStep(runner, ids, at, { overlap: true, readbackBatch }));
      };
      for (let i = 0; i < 3; i++) step();
      const started = () => handles.map((h) => h.readbackStarted());
      assert.deepEqual(started(), [false, false, false], `seed ${seed}: two waiting`);
      assert.equal(
        await settledWithin(handles[0]!.result, 300),
        false,
        `seed ${seed}: resolved early`,
      );
      step();
      assert.deepEqual(started(), [true, true, true, false], `seed ${seed}: the fourth execute`);
      for (const h of handles.slice(0, 3)) {
        assert.equal(await settledWithin(h.result, 5000), true, `seed ${seed}: started together`);
      }
      assert.equal(
        await settledWithin(handles[3]!.result, 300),
        false,
        `seed ${seed}: fourth early`,
      );
      runner.flush();
      // A step that allows 1 (a prefill's first token, in the engine) starts the deferred ones at
      // the next execute.
      step(3);
      step(1);
      assert.deepEqual(started().slice(4), [false, false], `seed ${seed}: 5 and 6 deferred`);
      step(3);
      assert.deepEqual(started().slice(4), [true, true, false], `seed ${seed}: batch of 1`);
      runner.flush();
      const got = [];
      for (const h of handles) got.push((await h.result).tokens[0]);
      const expected = await soloGreedy(runner, prompt, 7, { blocks: [1] });
      assert.deepEqual(got, expected, `seed ${seed}`);
      for (const bad of [0, 1.5, runner.maxInFlight + 1]) {
        assert.throws(
          () =>
            blockZeroStep(runner, Uint32Array.of(1), Uint32Array.of(0), {
              overlap: true,
              readbackBatch: bad,
            }),
          new RegExp(
            `^RangeError: Cannot batch ${bad} readbacks: between 1 and ${runner.maxInFlight}`,
          ),
        );
      }
    }),
);

Deno.test(
  "ModelRunner.execute() with overlap starts a step's readback only at the next execute or flush()",
  GPU_TEST,
  () =>
    withRunner("runner overlap", async (runner, _ref, seed, rng) => {
      const prompt = Array.from({ length: 6 }, () => rng.int(0, 500));
      const positions = Uint32Array.from(prompt, (_, i) => i);
      const step = (ids: Uint32Array, at: Uint32Array) =>
        blockZeroStep(runner, ids, at, { overlap: true });
      const first = step(Uint32Array.from(prompt), positions);
      // A readback started at once resolves ~10 ms after the step (Deno's poll); this one waits.
      assert.equal(await settledWithin(first.result, 300), false, `seed ${seed}: resolved early`);
      const second = step(
        Uint32Array.of(runner.sampledRef(first.step, 0)),
        Uint32Array.of(prompt.length),
      );
      assert.equal(await settledWithin(first.result, 5000), true, `seed ${seed}: next execute`);
      assert.equal(await settledWithin(second.result, 300), false, `seed ${seed}: second early`);
      runner.flush();
      const [a, b] = [await first.result, await second.result];
      const expected = await soloGreedy(runner, prompt, 2, { blocks: [1] });
      assert.deepEqual([a.tokens[0], b.tokens[0]], expected, `seed ${seed}`);
    }),
);

for (const preset of ["tiny-qwen3", "tiny-gpt2"] as const) {
  Deno.test(
    `ModelRunner.load() asks a numKvBlocks function once, with the weights on the device, for ${preset}`,
    GPU_TEST,
    async () => {
      const dir = await Deno.makeTempDir();
      const ctx = await testContext({ forceF32: true });
      try {
        await makeModel({ out: dir, preset, dtype: "f32", seed: 11, shards: 1 });
        // Every buffer the load creates, in order; the count when the function is asked.
        const made: { label: string; size: number }[] = [];
        const create = ctx.createBuffer.bind(ctx);
        ctx.createBuffer = (label, size, usage) => {
          made.push({ label, size });
          return create(label, size, usage);
        };
        let askedAt = -1;
        const runner = await ModelRunner.load(ctx, dir, {
          ...SOLO_RUNNER_OPTIONS,
          numKvBlocks: () => {
            assert.equal(askedAt, -1, "asked twice");
            askedAt = made.length;
            return Promise.resolve(9);
          },
        });
        try {
          assert.equal(runner.kv.numBlocks, 9);
          assert.equal(runner.options.numKvBlocks, 9);
          const before = made.slice(0, askedAt);
          // The weights (at least their bytes) were created before it was asked, the cache after.
          const bytes = before.reduce((s, b) => s + b.size, 0);
          assert.ok(bytes >= runner.weights.device, `${bytes} < ${runner.weights.device}`);
          assert.ok(!before.some((b) => b.label.startsWith("kv.")), "a KV buffer came first");
          const kv = made.slice(askedAt).filter((b) => b.label.startsWith("kv."));
          assert.equal(kv.length, 2 * runner.config.numLayers);
        } finally {
          runner.destroy();
        }
        // A count that is not a positive integer is refused, naming the option.
        for (const bad of [0, 2.5]) {
          await assert.rejects(
            () =>
              ModelRunner.load(ctx, dir, {
                ...SOLO_RUNNER_OPTIONS,
                numKvBlocks: () => Promise.resolve(bad),
              }),
            (e) =>
              e instanceof RangeError &&
              e.message ===
                `Model runner option numKvBlocks must be a positive integer: got ${bad}`,
          );
        }
      } finally {
        ctx.destroy();
        await Deno.remove(dir, { recursive: true });
      }
    },
  );
}
