import assert from "node:assert/strict";
import { EngineDeadError } from "../engine/engine_api.ts";
import { WebGpuExecutor } from "../engine/executors/webgpu_executor.ts";
import type { ModelRunner } from "../engine/model_runner.ts";
import { LLMEngine } from "../engine/llm_engine.ts";
import type { EngineOptions } from "../engine/engine_config.ts";
import type { TokenLogprob } from "../engine/engine_api.ts";
import {
  MOCK_FIRST_TOKEN,
  MOCK_TOKEN_COUNT,
  mockTokenAt,
} from "../engine/executors/mock_executor.ts";
import { kernelSeed, type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import { InvalidParameterError } from "../engine/input_processor.ts";
import { makeModel } from "../tools/make_model.ts";
import { ReferenceModel } from "./reference/model.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { type Rng, testSeed } from "./support/random.ts";
import { referenceRun } from "./support/solo_run.ts";

const delay = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Runs all requests concurrently; returns each one's token ids and finish reason. */
async function runAll(
  engine: LLMEngine,
  prompts: readonly (readonly number[])[],
  maxTokens: number,
): Promise<{ tokens: number[]; finish: string | null }[]> {
  return await Promise.all(prompts.map(async (prompt, i) => {
    const tokens: number[] = [];
    let finish: string | null = null;
    const stream = engine.generate({
      requestId: `r${i}`,
      promptTokenIds: prompt,
      params: samplingParams({ temperature: 0, maxTokens, ignoreEos: true }),
    });
    for await (const o of stream) {
      tokens.push(...o.tokenIds);
      finish = o.finishReason;
    }
    return { tokens, finish };
  }));
}

Deno.test("LLMEngine with the mock executor returns each request's deterministic tokens and frees every block", async () => {
  const { seed, rng } = testSeed("engine mock");
  const engine = await LLMEngine.create({
    executor: "mock",
    mockBaseMs: 0,
    mockPerTokenMs: 0,
    numKvBlocks: 24,
    maxNumSeqs: 6,
    maxNumBatchedTokens: 32,
  });
  try {
    const prompts = Array.from(
      { length: 20 },
      () => Array.from({ length: rng.int(41, 60) }, () => rng.int(0, 99)),
    );
    const results = await runAll(engine, prompts, 24);
    results.forEach((r, i) => {
      const expected = Array.from(
        { length: 24 },
        (_, k) => mockTokenAt(`r${i}`, prompts[i]!.length + k, MOCK_FIRST_TOKEN, MOCK_TOKEN_COUNT),
      );
      assert.deepEqual(r.tokens, expected, `seed ${seed} request ${i}`);
      assert.equal(r.finish, "length");
    });
    const s = engine.stats();
    assert.equal(s.kvBlocksUsed, 0);
    assert.equal(s.numRunning + s.numWaiting, 0);
    assert.ok(s.numPreemptions > 0, "a 24-block pool for 20 requests must preempt");
    assert.equal(s.generationTokensTotal, 20 * 24);
  } finally {
    await engine.shutdown();
  }
});

Deno.test("LLMEngine frees a request's blocks as soon as its consumer stops reading", async () => {
  const engine = await LLMEngine.create({ executor: "mock", mockBaseMs: 1, numKvBlocks: 32 });
  try {
    const stream = engine.generate({
      requestId: "gone",
      promptTokenIds: Array.from({ length: 40 }, (_, i) => i),
      params: samplingParams({ maxTokens: 200, ignoreEos: true }),
    });
    let n = 0;
    for await (const o of stream) {
      n += o.tokenIds.length;
      if (n >= 3) break; // the client disconnects
    }
    assert.equal(engine.stats().kvBlocksUsed, 0);
    assert.equal(engine.stats().numRunning, 0);
    const controller = new AbortController();
    const second = engine.generate({
      requestId: "signal",
      promptTokenIds: [1, 2, 3],
      params: samplingParams({ maxTokens: 200, ignoreEos: true }),
    }, controller.signal);
    const reasons: (string | null)[] = [];
    for await (const o of second) {
      reasons.push(o.finishReason);
      if (reasons.length === 2) controller.abort();
    }
    assert.equal(reasons.at(-1), "abort");
    assert.equal(engine.stats().kvBlocksUsed, 0);
  } finally {
    await engine.shutdown();
  }
});

Deno.test("LLMEngine rejects impossible requests at once", async () => {
  const engine = await LLMEngine.create({ executor: "mock", numKvBlocks: 4, maxModelLen: 100 });
  try {
    const gen = (prompt: number[], maxTokens: number) =>
      engine.generate({
        requestId: "x",
        promptTokenIds: prompt,
        params: samplingParams({ maxTokens }),
      });
    assert.throws(() => gen([], 4), /prompt is empty/);
    assert.throws(() => gen(new Array(99).fill(1), 4), /exceeds max_model_len 100/);
    assert.throws(() => gen(new Array(60).fill(1), 30), /the cache holds 64/);
  } finally {
    await engine.shutdown();
  }
});

/** What the WebGPU executors saw of the engine's scheduler outputs (see `watchExecutors`). */
interface ExecutorWatch {
  /** The executors' runners (to check their penalty histories). */
  readonly runners: Set<ModelRunner>;
  /** Penalised requests preempted by recompute after they had sampled. */
  readonly penalisedRecomputed: Set<string>;
  /** Penalised requests swapped out after they had sampled. */
  readonly penalisedSwapped: Set<string>;
  /** Penalised requests prefilled in more than one chunk. */
  readonly penalisedChunked: Set<string>;
  /**
   * Decode-only steps seen (no new, swapped-in or preempted request), and those whose runner
   * staged more block-table entries than a header and one new block per sequence: the scheduler
   * hands over its growing arrays, so the runner's rows take only what they gained.
   */
  readonly blockTables: { decodeSteps: number; overflows: string[] };
  restore(): void;
}

/** Watches every `WebGpuExecutor.execute` call until `restore()`. */
function watchExecutors(): ExecutorWatch {
  const execute = WebGpuExecutor.prototype.execute;
  const sampled = new Set<string>();
  const watch: ExecutorWatch = {
    runners: new Set(),
    penalisedRecomputed: new Set(),
    penalisedSwapped: new Set(),
    penalisedChunked: new Set(),
    blockTables: { decodeSteps: 0, overflows: [] },
    restore: () => (WebGpuExecutor.prototype.execute = execute),
  };
  WebGpuExecutor.prototype.execute = function (this: WebGpuExecutor, output, masks) {
    watch.runners.add(this.runner);
    const p = (r: { params: SamplingParams }) =>
      r.params.repetitionPenalty !== 1 || r.params.presencePenalty !== 0 ||
      r.params.frequencyPenalty !== 0;
    const penalised = new Set(output.scheduled.filter(p).map((r) => r.requestId));
    for (const id of output.preempted) if (sampled.has(id)) watch.penalisedRecomputed.add(id);
    for (const { requestId: id } of output.swappedOut) {
      if (sampled.has(id)) watch.penalisedSwapped.add(id);
    }
    for (const r of output.scheduled) {
      if (r.samplesToken && penalised.has(r.requestId)) sampled.add(r.requestId);
      if (!r.samplesToken && penalised.has(r.requestId)) watch.penalisedChunked.add(r.requestId);
    }
    const step = execute.call(this, output, masks);
    const n = output.scheduled.length;
    if (
      n > 0 && output.scheduled.every((r) => r.numTokens === 1 && !r.isNew) &&
      output.swappedIn.length === 0 && output.preempted.length === 0
    ) {
      watch.blockTables.decodeSteps++;
      const staged = this.runner.stagedBlockTableEntries;
      if (staged > 2 * n) watch.blockTables.overflows.push(`${staged} entries for ${n} sequences`);
    }
    return step;
  };
  return watch;
}

/**
 * Runs `body` on an engine (with `options`) over a fresh tiny-qwen3 f32 model, with its float64
 * reference and a watch on its executor; then checks that no KV block is used and that the
 * executor and its runner hold nothing for the ended requests (seeds, penalty histories).
 */
async function withWatchedEngine(
  name: string,
  options: EngineOptions,
  body: (
    engine: LLMEngine,
    ref: ReferenceModel,
    watch: ExecutorWatch,
    seed: number,
    rng: Rng,
  ) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir();
  try {
    const { seed, rng } = testSeed(name);
    await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed: seed % 997 });
    const ref = await ReferenceModel.load(dir);
    const engine = await LLMEngine.create({
      model: dir,
      forceF32: true,
      numKvBlocks: 64,
      showProgress: false,
      ...options,
    });
    const watch = watchExecutors();
    try {
      await body(engine, ref, watch, seed, rng);
      assert.equal(engine.stats().kvBlocksUsed, 0);
      // The executor drops each request's seed and penalty history once an output lists
      // it as ended (the engine runs one more, empty, step after the last finish).
      for (let i = 0; i < 200 && engine.executorRequests > 0; i++) await delay(10);
      assert.equal(engine.executorRequests, 0, `seed ${seed}: executor state left behind`);
      const runners = [...watch.runners];
      assert.equal(runners.length, 1);
      assert.ok(watch.blockTables.decodeSteps > 0, `seed ${seed}: no decode-only step`);
      assert.deepEqual(watch.blockTables.overflows, [], `seed ${seed}: block tables re-sent`);
      assert.equal(runners[0]!.penaltyHistories.inUse, 0, `seed ${seed}: histories left behind`);
    } finally {
      watch.restore();
      await engine.shutdown();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** Generates greedily for every prompt at once (request `${prefix}${i}`, `params[i]`). */
function generateAll(
  engine: LLMEngine,
  prompts: readonly (readonly number[])[],
  params: readonly SamplingParams[],
  prefix: string,
): Promise<{ tokens: number[]; logprobs: TokenLogprob[] }[]> {
  return Promise.all(prompts.map(async (prompt, i) => {
    const tokens: number[] = [];
    const logprobs: TokenLogprob[] = [];
    const request = { requestId: `${prefix}${i}`, promptTokenIds: prompt, params: params[i]! };
    for await (const o of engine.generate(request)) {
      tokens.push(...o.tokenIds);
      logprobs.push(...(o.logprobs ?? []));
    }
    return { tokens, logprobs };
  }));
}

/** Reference steps whose top-2 logits are closer than this are near-ties. */
const NEAR_TIE = 1e-4;

/**
 * With `maxTokens` 40 the tiny-pool cases must preempt whatever the timing: the first four
 * prompts (1, 7, 33 and 20 tokens) take 7 of the 9 blocks, are admitted in the first step, and
 * grow together to 3 + 3 + 5 + 4 = 15 blocks before any of them finishes. (With 10 tokens
 * they end at 8 blocks, so preemption came only from the slots of steps in flight: with the
 * mock executor and one step in flight there was none, with 2 or 7 one; once, on an NVIDIA
 * H100, there was none. With 40 tokens: 3 or 4 at 1, 2 and 7 steps in flight.)
 */
const ENGINE_CASES: {
  name: string;
  options: EngineOptions;
  maxTokens?: number;
  check?: (e: LLMEngine) => void;
}[] = [
  { name: "continuous batching", options: {} },
  {
    name: "preemption by recompute (tiny KV pool)",
    options: { numKvBlocks: 9, maxNumSeqs: 6 },
    maxTokens: 40,
    check: (e) => assert.ok(e.stats().numPreemptions > 0, "expected preemptions"),
  },
  {
    name: "preemption by swap (tiny KV pool)",
    options: { numKvBlocks: 9, maxNumSeqs: 6, preemptionMode: "swap", swapSpace: 1 },
    maxTokens: 40,
    check: (e) => assert.ok(e.stats().numPreemptions > 0, "expected preemptions"),
  },
  {
    name: "chunked prefill (8-token budget)",
    options: { maxNumBatchedTokens: 8, maxNumSeqs: 6 },
  },
];

for (const c of ENGINE_CASES) {
  Deno.test(
    `LLMEngine greedy outputs equal the float64 reference under ${c.name}`,
    GPU_TEST,
    () =>
      withWatchedEngine(`engine ${c.name}`, c.options, async (engine, ref, _w, seed, rng) => {
        // A shared 32-token prefix makes later requests hit the prefix cache.
        const shared = Array.from({ length: 32 }, () => rng.int(0, 500));
        const prompts = [1, 7, 33, 20, 40, 5].map((len, i) =>
          i >= 4
            ? [...shared, ...Array.from({ length: len - 32 + 8 }, () => rng.int(0, 500))]
            : Array.from({ length: len }, () => rng.int(0, 500))
        );
        const maxTokens = c.maxTokens ?? 10;
        const results = await runAll(engine, prompts, maxTokens);
        results.forEach((r, i) => {
          const steps = ref.greedy(prompts[i]!, maxTokens);
          // Compared up to the first near-tie, where f32 may pick the other token (rare).
          const tie = steps.findIndex((s) => s.gap < NEAR_TIE);
          const n = tie < 0 ? steps.length : tie;
          assert.equal(r.tokens.length, maxTokens);
          assert.deepEqual(
            r.tokens.slice(0, n),
            steps.slice(0, n).map((s) => s.token),
            `seed ${seed} request ${i} (prompt ${prompts[i]!.length} tokens)`,
          );
        });
        c.check?.(engine);
      }),
  );
}

Deno.test(
  "LLMEngine reuses cached prefix blocks and still matches the reference",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      const { seed, rng } = testSeed("engine prefix");
      await makeModel({ out: dir, preset: "tiny-qwen2", dtype: "f32", seed: seed % 997 });
      const ref = await ReferenceModel.load(dir);
      const engine = await LLMEngine.create({
        model: dir,
        forceF32: true,
        numKvBlocks: 64,
        showProgress: false,
      });
      try {
        const shared = Array.from({ length: 40 }, () => rng.int(0, 500));
        for (let i = 0; i < 3; i++) {
          const prompt = [...shared, ...Array.from({ length: 3 + i }, () => rng.int(0, 500))];
          const [r] = await runAll(engine, [prompt], 6);
          assert.deepEqual(
            r!.tokens,
            ref.greedy(prompt, 6).map((s) => s.token),
            `seed ${seed} request ${i}`,
          );
        }
        assert.ok(engine.stats().prefixCacheHits >= 64, `hits: ${engine.stats().prefixCacheHits}`);
      } finally {
        await engine.shutdown();
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

/** Penalties, bias and logprobs of the mixed batch below (request i gets MIXED[i % 5]). */
const MIXED: Partial<SamplingParams>[] = [
  {},
  { repetitionPenalty: 1.6, presencePenalty: 0.8 },
  { frequencyPenalty: 1.0, logitBias: new Map([[3, 1.5], [200, -2]]) },
  { logprobs: 5 },
  { repetitionPenalty: 1.3, frequencyPenalty: 0.3, logprobs: 3 },
];

const MIXED_CASES: { name: string; options: EngineOptions; check?: (e: LLMEngine) => void }[] = [
  { name: "continuous batching, 7 steps in flight", options: {} },
  {
    name: "preemption by recompute and chunked prefill",
    options: { numKvBlocks: 9, maxNumSeqs: 6, maxNumBatchedTokens: 16 },
    check: (e) => assert.ok(e.stats().numPreemptions > 0, "expected preemptions"),
  },
  {
    name: "preemption by swap",
    options: { numKvBlocks: 9, maxNumSeqs: 6, preemptionMode: "swap", swapSpace: 1 },
    check: (e) => assert.ok(e.stats().numPreemptions > 0, "expected preemptions"),
  },
];

for (const c of MIXED_CASES) {
  Deno.test(
    `LLMEngine applies each request's penalties, logit_bias and top logprobs in a mixed batch as the float64 reference (${c.name})`,
    GPU_TEST,
    () =>
      withWatchedEngine(`engine mixed ${c.name}`, c.options, async (engine, ref, _w, seed, rng) => {
        const maxTokens = 12;
        const prompts = [3, 17, 9, 30, 6, 21, 12].map((len) =>
          Array.from({ length: len }, () => rng.int(0, 500))
        );
        const params = prompts.map((_, i) =>
          samplingParams({ temperature: 0, maxTokens, ignoreEos: true, ...MIXED[i % MIXED.length] })
        );
        const results = await generateAll(engine, prompts, params, "m");
        results.forEach((r, i) => {
          const p = params[i]!;
          const context = `seed ${seed} request ${i} (${JSON.stringify(MIXED[i % 5])})`;
          const expected = referenceRun(ref, prompts[i]!, maxTokens, p, p.logprobs ?? 0);
          assert.deepEqual(r.tokens, expected.map((s) => s.token), context);
          if (p.logprobs === null) {
            assert.equal(r.logprobs.length, 0, context);
            return;
          }
          assert.equal(r.logprobs.length, maxTokens, context);
          r.logprobs.forEach((lp, k) => {
            const e = expected[k]!;
            const top = e.top.ids.map((tokenId, j) => ({ tokenId, logprob: e.top.logprobs[j]! }));
            assert.equal(lp.tokenId, e.token, context);
            // The sampled token's raw logprob (exact for plain requests; for penalised ones
            // when the token is among the raw top tokens).
            if (p.repetitionPenalty === 1 || e.top.ids.includes(e.token)) {
              assert.ok(Math.abs(lp.logprob - e.rawLogprob) < 1e-4, `${context} step ${k}`);
            }
            assert.ok(lp.top !== undefined, `${context} step ${k}: no top logprobs`);
            assert.equal(lp.top.length, top.length, `${context} step ${k}`);
            lp.top.forEach((t, j) => {
              assert.ok(
                Math.abs(t.logprob - top[j]!.logprob) < 1e-4 &&
                  (t.tokenId === top[j]!.tokenId ||
                    Math.abs(top[j]!.logprob - (top[j + 1]?.logprob ?? -Infinity)) < 1e-4 ||
                    Math.abs(top[j]!.logprob - (top[j - 1]?.logprob ?? -Infinity)) < 1e-4),
                `${context} step ${k} rank ${j}: ${JSON.stringify(t)} vs ${JSON.stringify(top[j])}`,
              );
            });
          });
        });
        c.check?.(engine);
      }),
  );
}

/** Penalties of every request of the test below (request i gets PENALISED[i % 4]). */
const PENALISED: Partial<SamplingParams>[] = [
  { repetitionPenalty: 1.6, presencePenalty: 0.8 },
  { frequencyPenalty: 1.0, logitBias: new Map([[3, 1.5], [200, -2]]) },
  { repetitionPenalty: 1.3, frequencyPenalty: 0.3 },
  { repetitionPenalty: 0.8, presencePenalty: -0.5 },
];

const PENALISED_CASES: {
  name: string;
  options: EngineOptions;
  watched: (w: ExecutorWatch) => boolean;
}[] = [
  {
    name: "preemption by recompute",
    options: { numKvBlocks: 7, maxNumSeqs: 6 },
    watched: (w) => w.penalisedRecomputed.size > 0,
  },
  {
    name: "preemption by swap",
    options: { numKvBlocks: 7, maxNumSeqs: 6, preemptionMode: "swap", swapSpace: 1 },
    watched: (w) => w.penalisedSwapped.size > 0,
  },
  {
    name: "chunked prefill (8-token budget)",
    options: { maxNumBatchedTokens: 8, maxNumSeqs: 6 },
    watched: (w) => w.penalisedChunked.size > 0,
  },
];

for (const c of PENALISED_CASES) {
  Deno.test(
    `LLMEngine penalised greedy outputs equal the float64 reference under ${c.name}, and every penalty history is freed`,
    GPU_TEST,
    () =>
      withWatchedEngine(
        `engine penalised ${c.name}`,
        c.options,
        async (engine, ref, watch, seed, rng) => {
          const maxTokens = 12;
          // 15-token prompts fill a block once their first output is fed: the next decode step
          // needs a second block for every request, more than the tiny pools have.
          const prompts = [15, 15, 15, 15, 14].map((len) =>
            Array.from({ length: len }, () => rng.int(0, 500))
          );
          const penalties = prompts.map((_, i) => PENALISED[i % PENALISED.length]!);
          const params = penalties.map((p) =>
            samplingParams({ temperature: 0, maxTokens, ignoreEos: true, ...p })
          );
          const results = await generateAll(engine, prompts, params, "p");
          results.forEach((r, i) => {
            assert.deepEqual(
              r.tokens,
              referenceRun(ref, prompts[i]!, maxTokens, params[i]!).map((s) => s.token),
              `seed ${seed} request ${i} (${JSON.stringify(penalties[i])})`,
            );
          });
          assert.ok(
            c.watched(watch),
            `seed ${seed}: ${c.name} did not happen to a penalised request`,
          );
        },
      ),
  );
}

Deno.test(
  "LLMEngine.generate() rejects parameters outside the rules and samples with any integer seed",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed: 1 });
      const engine = await LLMEngine.create({ model: dir, forceF32: true, showProgress: false });
      try {
        const vocab = engine.model.vocabSize;
        const gen = (params: Partial<SamplingParams>, prompt = [1, 2, 3], id = "bad") =>
          engine.generate({
            requestId: id,
            promptTokenIds: prompt,
            params: samplingParams({ maxTokens: 2, ...params }),
          });
        const bad: [Partial<SamplingParams>, RegExp][] = [
          [{ repetitionPenalty: 0 }, /'repetition_penalty'/],
          [{ logprobs: 21 }, /'logprobs'/],
          [{ presencePenalty: NaN }, /'presence_penalty'/],
          [{ logitBias: new Map([[-1, 1]]) }, /'logit_bias': key -1/],
          [{ logitBias: new Map([[vocab, 1]]) }, /'logit_bias': key/],
          [{ seed: 1.5 }, /'seed'/],
          [{ topK: 2.5 }, /'top_k'/],
          [{ minTokens: 3 }, /min_tokens \(3\) exceeds max_tokens \(2\)/],
          [{ stop: [""] }, /'stop.0'/],
          [{ stopTokenIds: [vocab] }, /out of the vocabulary/],
        ];
        for (const [params, message] of bad) {
          assert.throws(
            () => gen(params),
            InvalidParameterError,
            JSON.stringify([...Object.keys(params)]),
          );
          assert.throws(() => gen(params), message);
        }
        assert.throws(() => gen({}, [1, vocab]), /Token id \d+ is out of the vocabulary/);
        // Any integer seed samples (the kernel gets 32 bits of it), and top_k beyond the
        // vocabulary means off. Seeds that map to the same kernel seed give the same tokens.
        const tokens = async (params: Partial<SamplingParams>, id: string) => {
          const out: number[] = [];
          for await (const o of gen({ temperature: 1, maxTokens: 4, ...params }, [1, 2, 3], id)) {
            out.push(...o.tokenIds);
          }
          return out;
        };
        for (const seed of [-1, 2 ** 32, 2 ** 53 + 2, -(2 ** 60), 4294967295]) {
          assert.equal((await tokens({ seed, topK: 2 ** 40 }, `s${seed}`)).length, 4);
        }
        assert.deepEqual(await tokens({ seed: 7 }, "a"), await tokens({ seed: 7 }, "b"));
        assert.deepEqual(
          await tokens({ seed: -5 }, "c"),
          await tokens({ seed: kernelSeed(-5) }, "d"),
        );
        assert.equal(engine.error, null);
        assert.equal(engine.stats().kvBlocksUsed, 0);
      } finally {
        await engine.shutdown();
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

Deno.test("LLMEngine never starves the event loop once every step is scheduled", async () => {
  // Regression: with several steps in flight and nothing left to schedule, the loop used to
  // cycle empty steps through already-resolved promises forever, so timers and sockets never
  // ran. A starved event loop cannot run a watchdog, so the check runs in a child process.
  const script = `
    import { LLMEngine } from "${new URL("../engine/llm_engine.ts", import.meta.url).href}";
    import { samplingParams } from "${
    new URL("../scheduler/sampling_params.ts", import.meta.url).href
  }";
    const engine = LLMEngine.createMock({ mockBaseMs: 1, maxInFlight: 6 });
    const stream = engine.generate({ requestId: "a", promptTokenIds: [1, 2, 3],
      params: samplingParams({ maxTokens: 3, ignoreEos: true }) });
    const reader = (async () => { for await (const _ of stream) { /* drain */ } })();
    // A timer must fire while the engine works and after it is done.
    await new Promise((r) => setTimeout(r, 30));
    await reader;
    await new Promise((r) => setTimeout(r, 30));
    await engine.shutdown();
    console.log("ok");
  `;
  const child = new Deno.Command(Deno.execPath(), {
    args: ["eval", script],
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(20_000),
  }).spawn();
  const out = await child.output();
  assert.equal(
    new TextDecoder().decode(out.stdout).trim(),
    "ok",
    new TextDecoder().decode(out.stderr),
  );
});

Deno.test("LLMEngine fails every live request with EngineDeadError when a step fails (device lost)", async () => {
  const engine = LLMEngine.createMock({ mockBaseMs: 1, mockFailAtStep: 3 });
  try {
    const run = async (id: string) => {
      const stream = engine.generate({
        requestId: id,
        promptTokenIds: [1, 2, 3],
        params: samplingParams({ maxTokens: 50, ignoreEos: true }),
      });
      for await (const _ of stream) { /* drain */ }
    };
    const results = await Promise.allSettled([run("a"), run("b")]);
    for (const r of results) {
      assert.equal(r.status, "rejected");
      assert.ok(r.status === "rejected" && r.reason instanceof EngineDeadError, String(r));
      assert.match(String((r as PromiseRejectedResult).reason.message), /GPU device lost/);
    }
    assert.match(engine.error?.message ?? "", /GPU device lost/);
    assert.throws(
      () => engine.generate({ requestId: "c", promptTokenIds: [1], params: samplingParams() }),
      EngineDeadError,
    );
  } finally {
    await engine.shutdown();
  }
});

Deno.test("LLMEngine streams one token per step when the device works inside submit (lavapipe)", async () => {
  // With 6 steps kept in flight and a synchronous submit, every token used to wait for 6 steps
  // of work, and the event loop was blocked meanwhile: tokens arrived in bursts.
  const engine = LLMEngine.createMock({
    mockBaseMs: 60,
    mockPerTokenMs: 0,
    mockBlockingSubmit: true,
    maxInFlight: 6,
  });
  try {
    const t0 = performance.now();
    const arrivals: number[] = [];
    const stream = engine.generate({
      requestId: "s",
      promptTokenIds: [1, 2, 3],
      params: samplingParams({ maxTokens: 10, ignoreEos: true }),
    });
    for await (const o of stream) {
      for (const _ of o.tokenIds) arrivals.push(performance.now() - t0);
    }
    assert.equal(arrivals.length, 10);
    // The first steps may still be pipelined while the engine measures submit times; after
    // that, consecutive tokens arrive about one 60 ms step apart, never all at once. (With two
    // steps in flight the last token follows the one before it at once: no step runs after it.)
    const gaps = arrivals.slice(4, -1).map((t, i) => t - arrivals[3 + i]!);
    for (const g of gaps) assert.ok(g >= 40, `gaps ${gaps.map((x) => x.toFixed(0))}`);
  } finally {
    await engine.shutdown();
  }
});

Deno.test("LLMEngine reports each request's queue time: one waiting behind a full batch waits as long as the batch runs", async () => {
  // One sequence at a time (max_num_seqs 1): "b" is scheduled once "a" has finished.
  const engine = LLMEngine.createMock({ mockBaseMs: 5, mockPerTokenMs: 0, maxNumSeqs: 1 });
  try {
    const run = async (id: string) => {
      const t0 = performance.now();
      const queue = new Set<number | undefined>();
      let first: number | undefined;
      for await (
        const o of engine.generate({
          requestId: id,
          promptTokenIds: [1, 2, 3],
          params: samplingParams({ maxTokens: 8, ignoreEos: true }),
        })
      ) {
        queue.add(o.queueTime);
        first ??= (performance.now() - t0) / 1000;
      }
      return { queue: [...queue], first: first!, total: (performance.now() - t0) / 1000 };
    };
    const [a, b] = await Promise.all([run("a"), run("b")]);
    // The same figure on every increment, in seconds, at most the time to the first output.
    for (const r of [a, b]) {
      assert.equal(r.queue.length, 1, `${r.queue}`);
      assert.ok(r.queue[0]! >= 0 && r.queue[0]! <= r.first, `${r.queue[0]} vs ${r.first}`);
    }
    // "a" is scheduled at once; "b" waits while "a" runs its eight steps of at least 5 ms each
    // (it may be scheduled while the last of them is still in flight).
    assert.ok(a.queue[0]! < b.queue[0]!, `a waited ${a.queue[0]} s, b ${b.queue[0]} s`);
    assert.ok(
      b.queue[0]! >= 0.03 && b.queue[0]! >= 0.75 * a.total,
      `b ${b.queue[0]}, a ${a.total}`,
    );
  } finally {
    await engine.shutdown();
  }
});

Deno.test("LLMEngine shares cached prefixes only among requests with the same cache salt", async () => {
  const engine = await LLMEngine.create({ executor: "mock", blockSize: 4, showProgress: false });
  try {
    const prompt = Array.from({ length: 13 }, (_, i) => 10 + i);
    const cached = async (id: string, cacheSalt?: string) => {
      let n = -1;
      for await (
        const out of engine.generate({
          requestId: id,
          promptTokenIds: prompt,
          params: samplingParams({ maxTokens: 1 }),
          ...(cacheSalt === undefined ? {} : { cacheSalt }),
        })
      ) n = out.numCachedTokens;
      return n;
    };
    assert.equal(await cached("a"), 0);
    assert.equal(await cached("b", "tenant-1"), 0);
    assert.equal(await cached("c", "tenant-2"), 0);
    assert.equal(await cached("d", "tenant-1"), 12);
    assert.equal(await cached("e"), 12);
    assert.throws(
      () =>
        engine.generate({
          requestId: "f",
          promptTokenIds: prompt,
          params: samplingParams(),
          cacheSalt: "",
        }),
      TypeError,
    );
  } finally {
    await engine.shutdown();
  }
});

Deno.test("LLMEngine gives a reused request id none of the ended request's tokens", async () => {
  const options = { executor: "mock", showProgress: false, mockBaseMs: 2 } as const;
  const prompt = [5, 6, 7, 8, 9, 10, 11];
  const short = samplingParams({ maxTokens: 6, ignoreEos: true });
  const tokensOf = async (stream: AsyncIterable<{ tokenIds: readonly number[] }>) => {
    const tokens: number[] = [];
    for await (const out of stream) tokens.push(...out.tokenIds);
    return tokens;
  };
  // What the second "x" generates alone (the mock's tokens depend on id and position).
  const alone = await LLMEngine.create(options);
  let want: number[];
  try {
    want = await tokensOf(
      alone.generate({ requestId: "x", promptTokenIds: prompt, params: short }),
    );
  } finally {
    await alone.shutdown();
  }
  const engine = await LLMEngine.create(options);
  try {
    const params = samplingParams({ maxTokens: 40, ignoreEos: true });
    for (let round = 0; round < 5; round++) {
      // The first "x" is aborted after its first increment, with steps still in flight; a new
      // "x" with another prompt starts at once.
      const first = engine.generate({ requestId: "x", promptTokenIds: [1, 2, 3], params });
      for await (const _ of first) break;
      const got = await tokensOf(
        engine.generate({ requestId: "x", promptTokenIds: prompt, params: short }),
      );
      assert.deepEqual(got, want, `round ${round}`);
    }
    assert.equal(engine.stats().kvBlocksUsed, 0);
  } finally {
    await engine.shutdown();
  }
});
