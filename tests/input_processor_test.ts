/**
 * The engine's parameter rules (engine/input_processor.ts) and the seed mapping
 * (scheduler/sampling_params.ts): every rule rejects with the parameter named, normalisation is
 * idempotent, and every integer seed maps deterministically into 32 bits.
 */

import assert from "node:assert/strict";
import {
  checkTokenIds,
  InvalidParameterError,
  SAMPLING_LIMITS,
  validateSamplingParams,
} from "../engine/input_processor.ts";
import { kernelSeed, type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import { testSeed } from "./support/random.ts";

const MODEL = { vocabSize: 100 };

Deno.test("kernelSeed() is the identity on 32-bit seeds and exact for seed + choice", () => {
  for (const s of [0, 1, 42, 2 ** 31, 4294967295]) assert.equal(kernelSeed(s), s);
  assert.equal(kernelSeed(4294967294, 1), 4294967295);
  // The sum is exact before mapping: -1 + 1 = 0 and 2^32 - 1 + 1 = 2^32.
  assert.equal(kernelSeed(-1, 1), 0);
  assert.equal(kernelSeed(4294967295, 1), kernelSeed(2 ** 32));
  // Beyond 2^53 the double is taken as it is (no overflow, no error).
  assert.equal(kernelSeed(2 ** 60, 3), kernelSeed(2 ** 60 + 0, 3));
  assert.throws(() => kernelSeed(1.5), RangeError);
  assert.throws(() => kernelSeed(NaN), RangeError);
});

Deno.test("kernelSeed() maps any integer into [0, 2^32) deterministically and idempotently", () => {
  const { seed, rng } = testSeed("kernelSeed() maps any integer");
  const rand = () => rng.next();
  const seen = new Set<number>();
  for (let i = 0; i < 2000; i++) {
    const magnitude = 2 ** Math.floor(rand() * 70);
    const s = Math.round((rand() - 0.5) * magnitude);
    const k = kernelSeed(s);
    assert.ok(
      Number.isInteger(k) && k >= 0 && k < 2 ** 32,
      `seed ${s} -> ${k} (test seed ${seed})`,
    );
    assert.equal(kernelSeed(s), k);
    assert.equal(kernelSeed(k), k, `idempotent for ${s}`);
    if (Number.isSafeInteger(s) && Number.isSafeInteger(s + 7)) {
      assert.equal(kernelSeed(s, 7), kernelSeed(s + 7), `choice 7 of ${s}`);
    }
    if (s < 0 || s >= 2 ** 32) seen.add(k);
  }
  // Mixed, not folded: out-of-range seeds spread (no mass collision at a few values).
  assert.ok(seen.size > 100, `${seen.size} distinct kernel seeds`);
});

Deno.test("validateSamplingParams() names the parameter of every broken rule", () => {
  const L = SAMPLING_LIMITS;
  const cases: [Partial<SamplingParams>, string][] = [
    [{ n: 0 }, "n"],
    [{ n: L.maxN + 1 }, "n"],
    [{ temperature: -0.1 }, "temperature"],
    [{ temperature: NaN }, "temperature"],
    [{ temperature: L.maxTemperature + 1 }, "temperature"],
    [{ topP: 0 }, "top_p"],
    [{ topP: 1.01 }, "top_p"],
    [{ topK: -2 }, "top_k"],
    [{ topK: 0.5 }, "top_k"],
    [{ minP: 1.5 }, "min_p"],
    [{ seed: 0.5 }, "seed"],
    [{ seed: Infinity }, "seed"],
    [{ maxTokens: 0 }, "max_tokens"],
    [{ minTokens: -1 }, "min_tokens"],
    [{ maxTokens: 3, minTokens: 4 }, "min_tokens"],
    [{ stop: [""] }, "stop.0"],
    [{ stop: ["a", "x".repeat(L.maxStopStringChars + 1)] }, "stop.1"],
    [{ stop: Array(L.maxStopStrings + 1).fill("s") }, "stop"],
    [{ stopTokenIds: [5, 100] }, "stop_token_ids.1"],
    [{ stopTokenIds: [-1] }, "stop_token_ids.0"],
    [{ stopTokenIds: Array(L.maxStopTokenIds + 1).fill(1) }, "stop_token_ids"],
    [{ presencePenalty: 2.5 }, "presence_penalty"],
    [{ frequencyPenalty: -3 }, "frequency_penalty"],
    [{ repetitionPenalty: 0 }, "repetition_penalty"],
    [{ logprobs: 21 }, "logprobs"],
    [{ logprobs: -1 }, "logprobs"],
    [{ logitBias: new Map([[100, 1]]) }, "logit_bias"],
    [{ logitBias: new Map([[3, 101]]) }, "logit_bias.3"],
    [{ logitBias: new Map([[3, NaN]]) }, "logit_bias.3"],
  ];
  for (const [over, param] of cases) {
    const label = JSON.stringify(over, (_, v) => (v instanceof Map ? [...v] : v)).slice(0, 80);
    assert.throws(
      () => validateSamplingParams(samplingParams(over), MODEL),
      (e: unknown) => e instanceof InvalidParameterError && e.param === param,
      label,
    );
  }
  const big = new Map(Array.from({ length: L.maxLogitBias + 1 }, (_, i) => [i, 1] as const));
  assert.throws(
    () => validateSamplingParams(samplingParams({ logitBias: big }), { vocabSize: 1 << 20 }),
    (e: unknown) => e instanceof InvalidParameterError && e.param === "logit_bias",
  );
  assert.throws(
    () => checkTokenIds([0, 99, 100], MODEL, "prompt"),
    (e: unknown) => e instanceof InvalidParameterError && e.param === "prompt.2",
  );
});

Deno.test("validateSamplingParams() normalises top_k and accepts the boundaries, idempotently", () => {
  const ok = validateSamplingParams(
    samplingParams({
      n: SAMPLING_LIMITS.maxN,
      temperature: 0,
      topP: 1,
      topK: -1,
      minP: 1,
      seed: -(2 ** 63),
      maxTokens: 1,
      minTokens: 1,
      stop: Array(SAMPLING_LIMITS.maxStopStrings).fill("x"),
      stopTokenIds: [0, 99],
      presencePenalty: -2,
      frequencyPenalty: 2,
      repetitionPenalty: SAMPLING_LIMITS.maxRepetitionPenalty,
      logprobs: 20,
      logitBias: new Map([[0, -100], [99, 100]]),
    }),
    MODEL,
  );
  assert.equal(ok.topK, 0);
  assert.ok(Object.isFrozen(ok));
  assert.deepEqual(validateSamplingParams(ok, MODEL), ok);
  assert.equal(validateSamplingParams(samplingParams({ topK: 100 }), MODEL).topK, 0);
  assert.equal(validateSamplingParams(samplingParams({ topK: 99 }), MODEL).topK, 99);
  // Vocabulary unknown (0): ids are not checked against it.
  validateSamplingParams(samplingParams({ stopTokenIds: [10 ** 6] }), { vocabSize: 0 });
});
