import assert from "node:assert/strict";
import { InvalidParameterError } from "../engine/input_processor.ts";
import type { PromptLogprob, RequestOutput } from "../engine/engine_api.ts";
import { LLMEngine } from "../engine/llm_engine.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import { makeModel } from "../tools/make_model.ts";
import { ReferenceModel } from "./reference/model.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";

/**
 * Logprob tolerance against the float64 reference (f32 weights and KV cache on a tiny model:
 * the logits agree to ~1e-5; the kernels' own tests bound each step).
 */
const TOL = 2e-3;

/** The float64 log-softmax of every row of `logits` (`[T, vocab]`). */
function logSoftmaxRows(
  logits: { rows: number; cols: number; data: Float64Array },
): Float64Array[] {
  const out: Float64Array[] = [];
  for (let t = 0; t < logits.rows; t++) {
    const row = logits.data.subarray(t * logits.cols, (t + 1) * logits.cols);
    let m = -Infinity;
    for (const v of row) m = Math.max(m, v);
    let sum = 0;
    for (const v of row) sum += Math.exp(v - m);
    const lse = m + Math.log(sum);
    out.push(row.map((v) => v - lse));
  }
  return out;
}

/**
 * Checks one request's prompt logprobs against the reference's log-softmax rows: entry p scores
 * prompt[p] from row p - 1 (its logprob, its rank up to near-ties, and `k` top entries that are
 * the reference's top k up to near-ties, best first).
 */
function checkPromptLogprobs(
  got: readonly (PromptLogprob | null)[] | undefined,
  prompt: readonly number[],
  ref: Float64Array[],
  k: number,
  what: string,
): void {
  assert.ok(got !== undefined, `${what}: no prompt logprobs`);
  assert.equal(got.length, prompt.length, what);
  assert.equal(got[0], null, what);
  for (let p = 1; p < prompt.length; p++) {
    const row = ref[p - 1]!;
    const at = `${what} position ${p}`;
    const e: PromptLogprob | null = got[p] ?? null;
    if (e === null) assert.fail(`${at}: missing`);
    assert.equal(e.tokenId, prompt[p], at);
    const want = row[prompt[p]!]!;
    assert.ok(Math.abs(e.logprob - want) <= TOL, `${at}: logprob ${e.logprob}, want ${want}`);
    let surelyAbove = 0;
    let maybeAbove = 0;
    for (const v of row) {
      if (v > want + TOL) surelyAbove++;
      if (v > want - TOL) maybeAbove++;
    }
    assert.ok(
      e.rank >= surelyAbove + 1 && e.rank <= maybeAbove,
      `${at}: rank ${e.rank}, want ${surelyAbove + 1}..${maybeAbove}`,
    );
    assert.equal(e.top.length, k, at);
    const sorted = [...row].sort((a, b) => b - a);
    e.top.forEach((t, j) => {
      const v = row[t.tokenId]!;
      assert.ok(Math.abs(t.logprob - v) <= TOL, `${at} top ${j}: ${t.logprob}, want ${v}`);
      assert.ok(Math.abs(v - sorted[j]!) <= TOL, `${at} top ${j}: not the ${j + 1}-th best`);
      if (j > 0) assert.ok(t.logprob <= e.top[j - 1]!.logprob, `${at}: top not best first`);
    });
  }
}

/** Every increment of a request. */
async function collect(stream: AsyncIterable<RequestOutput>): Promise<RequestOutput[]> {
  const out: RequestOutput[] = [];
  for await (const o of stream) out.push(o);
  return out;
}

/**
 * Two step shapes, 4 logits rows each (max_num_seqs 4): the default budget (32 sampler rows per
 * step, 8 sub-batches of 4: the 23-token prompt is scored in one step) and 8 tokens per step
 * (8 sampler rows: the prompt is scored over several steps, 2 sub-batches each).
 */
const SHAPES = [
  { name: "one step", maxNumBatchedTokens: undefined, stepsAlone: 4 },
  { name: "8-token steps", maxNumBatchedTokens: 8, stepsAlone: undefined },
] as const;

for (const preset of ["tiny-qwen3", "tiny-gpt2"] as const) {
  for (const shape of SHAPES) {
    Deno.test(
      `LLMEngine returns prompt logprobs equal to the float64 reference for ${preset} (${shape.name})`,
      GPU_TEST,
      async () => {
        const dir = await Deno.makeTempDir({ prefix: "prompt_logprobs_" });
        try {
          const { seed, rng } = testSeed(`prompt logprobs ${preset}`);
          await makeModel({ out: dir, preset, dtype: "f32", seed: seed % 1000 });
          const ref = await ReferenceModel.load(dir);
          // 4 logits rows: a 23-token prompt is scored in sub-batches of 4, beside others.
          const engine = await LLMEngine.create({
            model: dir,
            showProgress: false,
            forceF32: true,
            maxNumSeqs: 4,
            blockSize: 4,
            ...(shape.maxNumBatchedTokens === undefined
              ? {}
              : { maxNumBatchedTokens: shape.maxNumBatchedTokens }),
          });
          try {
            const long = Array.from({ length: 23 }, () => rng.int(0, 500));
            const short = Array.from({ length: 6 }, () => rng.int(0, 500));
            const greedy = (promptLogprobs: number | null, maxTokens = 4) =>
              samplingParams({ temperature: 0, maxTokens, ignoreEos: true, promptLogprobs });
            // Warm the prefix cache with the long prompt; the scored request must not read it.
            await collect(engine.generate({
              requestId: "warm",
              promptTokenIds: long,
              params: greedy(null, 1),
            }));
            const [scored, plain, tiny, bare] = await Promise.all([
              collect(engine.generate({ requestId: "a", promptTokenIds: long, params: greedy(3) })),
              collect(
                engine.generate({ requestId: "b", promptTokenIds: short, params: greedy(null) }),
              ),
              collect(
                engine.generate({ requestId: "c", promptTokenIds: short, params: greedy(1) }),
              ),
              collect(
                engine.generate({ requestId: "d", promptTokenIds: [long[0]!], params: greedy(0) }),
              ),
            ]);
            checkPromptLogprobs(
              scored[0]!.promptLogprobs,
              long,
              logSoftmaxRows(ref.forward(long)),
              3,
              `seed ${seed} long`,
            );
            assert.equal(scored[0]!.numCachedTokens, 0, "a scored prompt reads no cached prefix");
            checkPromptLogprobs(
              tiny[0]!.promptLogprobs,
              short,
              logSoftmaxRows(ref.forward(short)),
              1,
              `seed ${seed} short`,
            );
            assert.deepEqual(bare[0]!.promptLogprobs, [null]);
            // Only the first increment carries them; requests without them get none.
            for (const outs of [scored, tiny, bare]) {
              assert.ok(outs.slice(1).every((o) => o.promptLogprobs === undefined));
            }
            assert.ok(plain.every((o) => o.promptLogprobs === undefined));
            // Scoring the prompt changes nothing in what is generated.
            const tokens = (outs: RequestOutput[]) => outs.flatMap((o) => o.tokenIds);
            const expected = ref.greedy(long, 4).map((s) => s.token);
            const gaps = ref.greedy(long, 4).map((s) => s.gap);
            const cut = gaps.findIndex((g) => g < 0.02);
            const n = cut < 0 ? 4 : cut + 1;
            assert.deepEqual(tokens(scored).slice(0, n), expected.slice(0, n), `seed ${seed}`);
            assert.deepEqual(tokens(tiny), tokens(plain));
            if (shape.stepsAlone !== undefined) {
              // Alone, the whole prompt is scored in the step that samples the first token (its
              // 22 positions and the sampled row in 6 sub-batches), then 3 decode steps.
              const steps0 = engine.stats().steps;
              const alone = await collect(
                engine.generate({ requestId: "e", promptTokenIds: long, params: greedy(2) }),
              );
              assert.equal(engine.stats().steps - steps0, shape.stepsAlone, "steps alone");
              checkPromptLogprobs(
                alone[0]!.promptLogprobs,
                long,
                logSoftmaxRows(ref.forward(long)),
                2,
                `seed ${seed} long, alone`,
              );
            }
            assert.equal(engine.stats().kvBlocksUsed, 0);
          } finally {
            await engine.shutdown();
          }
        } finally {
          await Deno.remove(dir, { recursive: true });
        }
      },
    );
  }
}

Deno.test("LLMEngine refuses prompt_logprobs on the mock executor", async () => {
  const engine = await LLMEngine.create({ executor: "mock", showProgress: false });
  try {
    assert.throws(
      () =>
        engine.generate({
          requestId: "a",
          promptTokenIds: [1, 2, 3],
          params: samplingParams({ promptLogprobs: 1 }),
        }),
      (e: unknown) => e instanceof InvalidParameterError && e.param === "prompt_logprobs",
    );
    assert.throws(
      () =>
        engine.generate({
          requestId: "b",
          promptTokenIds: [1, 2, 3],
          params: samplingParams({ promptLogprobs: 21 }),
        }),
      (e: unknown) => e instanceof InvalidParameterError && e.param === "prompt_logprobs",
    );
  } finally {
    await engine.shutdown();
  }
});
