/**
 * The output-text options of a request on the real engine (tiny random-weight model, greedy):
 * the text of a stop token id is left out unless `includeStopStrInOutput`, as vLLM v1 does; a
 * stop string is kept with it; special tokens' text stays with `skipSpecialTokens` false.
 */

import assert from "node:assert/strict";
import type { LLMEngine } from "../engine/llm_engine.ts";
import type { RequestOutput } from "../engine/engine_api.ts";
import { type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { withTinyEngine } from "./support/tiny_engine.ts";

interface Result {
  readonly ids: number[];
  readonly text: string;
  readonly last: RequestOutput;
}

async function run(
  engine: LLMEngine,
  id: string,
  prompt: number[],
  params: Partial<SamplingParams>,
): Promise<Result> {
  const ids: number[] = [];
  let text = "";
  let last: RequestOutput | undefined;
  const stream = engine.generate({
    requestId: id,
    promptTokenIds: prompt,
    params: samplingParams({ temperature: 0, maxTokens: 16, ignoreEos: true, ...params }),
  });
  for await (const out of stream) {
    ids.push(...out.tokenIds);
    text += out.text;
    last = out;
  }
  return { ids, text, last: last! };
}

Deno.test(
  "LLMEngine leaves a stop token's text out unless include_stop_str_in_output, and keeps special tokens' text on request",
  GPU_TEST,
  () =>
    withTinyEngine(async (engine) => {
      const tok = engine.tokenizer!;
      const prompt = [1, 2, 3, 4, 5];
      const free = await run(engine, "free", prompt, {});
      assert.equal(free.ids.length, 16);
      // A generated token that is not special and has text of its own stops the request.
      const at = free.ids.findIndex((t, i) =>
        i >= 2 && tok.decode([t], { skipSpecialTokens: true }) !== "" && t < 500
      );
      assert.ok(at >= 2, `no usable stop token in ${free.ids}`);
      const stopId = free.ids[at]!;
      const upTo = free.ids.slice(0, free.ids.indexOf(stopId) + 1);
      const decode = (ids: number[]) =>
        tok.decode(ids, { skipSpecialTokens: true, cleanUpTokenizationSpaces: false });
      for (const keep of [false, true]) {
        const r = await run(engine, `stop-${keep}`, prompt, {
          stopTokenIds: [stopId],
          includeStopStrInOutput: keep,
        });
        assert.deepEqual(r.ids, upTo, "the stop token is an output token");
        assert.equal(r.last.finishReason, "stop");
        assert.equal(r.last.stopReason, stopId);
        assert.equal(r.text, decode(keep ? upTo : upTo.slice(0, -1)), `keep ${keep}`);
      }
      // A stop string: cut before it, or after it with include_stop_str_in_output.
      const full = decode(free.ids);
      const stop = full.slice(4, 6);
      const start = full.indexOf(stop);
      for (const keep of [false, true]) {
        const r = await run(engine, `stopstr-${keep}`, prompt, {
          stop: [stop],
          includeStopStrInOutput: keep,
        });
        assert.equal(r.text, full.slice(0, keep ? start + stop.length : start), `keep ${keep}`);
        assert.equal(r.last.stopReason, stop);
      }
      // Special tokens: allowed_token_ids makes the output hold some (510 is special here).
      const forced = { allowedTokenIds: [510, stopId], temperature: 1, seed: 1 };
      const skipped = await run(engine, "skipped", prompt, forced);
      const kept = await run(engine, "kept", prompt, { ...forced, skipSpecialTokens: false });
      assert.deepEqual(kept.ids, skipped.ids, "same seed, same tokens");
      assert.ok(kept.ids.includes(510), `no special token sampled: ${kept.ids}`);
      assert.equal(skipped.text, decode(skipped.ids));
      assert.equal(
        kept.text,
        tok.decode(kept.ids, { skipSpecialTokens: false, cleanUpTokenizationSpaces: false }),
      );
      assert.ok(kept.text.includes(tok.decode([510], { skipSpecialTokens: false })));
    }),
);
