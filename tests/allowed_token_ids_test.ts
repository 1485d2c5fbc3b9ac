/**
 * vLLM's `allowed_token_ids` on the real WebGPU executor with a random-weight tiny model: a
 * fixed token mask per request, so every sampled token is one of the listed ids (EOS too only
 * when listed), beside unconstrained requests in the same batch; and its validation.
 */

import assert from "node:assert/strict";
import { LLMEngine } from "../engine/llm_engine.ts";
import { InvalidParameterError, validateSamplingParams } from "../engine/input_processor.ts";
import { allowedTokenMask } from "../engine/live_request.ts";
import type { RequestOutput } from "../engine/engine_api.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { withTinyEngine } from "./support/tiny_engine.ts";

async function collect(stream: AsyncIterable<RequestOutput>): Promise<number[]> {
  const ids: number[] = [];
  for await (const out of stream) ids.push(...out.tokenIds);
  return ids;
}

Deno.test("allowedTokenMask() sets exactly the listed ids' bits over the logits width", () => {
  const mask = allowedTokenMask([0, 31, 32, 70, 70], 71);
  assert.equal(mask.length, 3);
  assert.deepEqual([...mask], [(1 | (1 << 31)) >>> 0, 1, 1 << 6]);
});

Deno.test("validateSamplingParams() checks allowed_token_ids and keeps each id once", () => {
  const model = { vocabSize: 100, maxModelLen: 64 };
  const ok = validateSamplingParams(samplingParams({ allowedTokenIds: [5, 7, 5] }), model);
  assert.deepEqual(ok.allowedTokenIds, [5, 7]);
  const cases: [Parameters<typeof samplingParams>[0], string][] = [
    [{ allowedTokenIds: [] }, "allowed_token_ids"],
    [{ allowedTokenIds: [1, 100] }, "allowed_token_ids.1"],
    [{ allowedTokenIds: [-1] }, "allowed_token_ids.0"],
    [
      { allowedTokenIds: [1], structuredOutput: { kind: "json_object" } },
      "allowed_token_ids",
    ],
  ];
  for (const [overrides, param] of cases) {
    assert.throws(
      () => validateSamplingParams(samplingParams(overrides), model),
      (e: unknown) => e instanceof InvalidParameterError && e.param === param,
      JSON.stringify(overrides),
    );
  }
});

Deno.test(
  "LLMEngine samples only allowed_token_ids, greedy and random, beside free requests",
  GPU_TEST,
  () =>
    withTinyEngine(async (engine) => {
      const prompt = [1, 2, 3, 4, 5];
      const free = await collect(engine.generate({
        requestId: "free",
        promptTokenIds: prompt,
        params: samplingParams({ temperature: 0, maxTokens: 12, ignoreEos: true }),
      }));
      // Ids the free greedy run did not pick first, so the mask has to change the answer.
      const allowed = [7, 300, 301, 450].filter((id) => id !== free[0]);
      const runs = await Promise.all([
        collect(engine.generate({
          requestId: "greedy",
          promptTokenIds: prompt,
          params: samplingParams({ temperature: 0, maxTokens: 12, allowedTokenIds: allowed }),
        })),
        collect(engine.generate({
          requestId: "random",
          promptTokenIds: prompt,
          params: samplingParams({
            temperature: 1.5,
            seed: 3,
            maxTokens: 40,
            allowedTokenIds: allowed,
          }),
        })),
        collect(engine.generate({
          requestId: "free-again",
          promptTokenIds: prompt,
          params: samplingParams({ temperature: 0, maxTokens: 12, ignoreEos: true }),
        })),
      ]);
      const [greedy, random, freeAgain] = runs;
      // EOS is not listed: both run to max_tokens.
      assert.equal(greedy!.length, 12);
      assert.equal(random!.length, 40);
      for (const id of [...greedy!, ...random!]) assert.ok(allowed.includes(id), `token ${id}`);
      assert.ok(new Set(random).size > 1, `random sampling used one id only: ${random}`);
      // The free request in the same batches is untouched by the others' masks.
      assert.deepEqual(freeAgain, free);
    }),
);

Deno.test("LLMEngine refuses allowed_token_ids on the mock executor, which samples no logits", async () => {
  const engine = LLMEngine.createMock();
  try {
    assert.throws(
      () =>
        engine.generate({
          requestId: "r",
          promptTokenIds: [1, 2, 3],
          params: samplingParams({ allowedTokenIds: [4] }),
        }),
      (e: unknown) => e instanceof InvalidParameterError && e.param === "allowed_token_ids",
    );
    assert.equal(engine.stats().numWaiting, 0);
  } finally {
    await engine.shutdown();
  }
});
