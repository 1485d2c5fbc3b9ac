import assert from "node:assert/strict";
import {
  generationDefaultsLine,
  generationDefaultsOf,
  resolveGenerationConfig,
} from "../engine/generation_defaults.ts";
import { CheckpointError } from "../engine/model/errors.ts";
import { parseGenerationConfig } from "../engine/model/generation_config.ts";
import { FakeEngine, tinyTokenizer, withServer } from "./support/fake_engine.ts";
import { post } from "./support/http.ts";

const OWN = parseGenerationConfig({ eos_token_id: [5, 6], temperature: 0.6, top_k: 20 });

Deno.test("resolveGenerationConfig() takes the model's, none, or a directory's file", async () => {
  const auto = await resolveGenerationConfig("auto", OWN);
  assert.equal(auto.config, OWN);
  assert.equal(auto.from, "the model's generation_config.json");
  assert.deepEqual(auto.eosTokenIds, [5, 6]);
  const none = await resolveGenerationConfig("vllm", OWN);
  assert.equal(none.config, null);
  assert.deepEqual(none.eosTokenIds, [5, 6], "vllm drops the defaults, not the EOS ids");
  assert.deepEqual(generationDefaultsOf(none.config), {});
  const dir = await Deno.makeTempDir({ prefix: "gen_cfg_" });
  try {
    await Deno.writeTextFile(`${dir}/generation_config.json`, '{"top_p": 0.5, "min_p": 0.1}');
    const other = await resolveGenerationConfig(dir, OWN);
    assert.deepEqual(generationDefaultsOf(other.config), { topP: 0.5, minP: 0.1 });
    assert.equal(other.from, `${dir}/generation_config.json`);
    assert.deepEqual(other.eosTokenIds, [], "the named file's EOS ids (none)");
    await assert.rejects(
      () => resolveGenerationConfig(`${dir}/none`, OWN),
      (e) =>
        e instanceof CheckpointError &&
        e.message === `${dir}/none/generation_config.json: not found`,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("resolveGenerationConfig() sets the override's fields over the config, EOS ids kept", async () => {
  const r = await resolveGenerationConfig("auto", OWN, {
    temperature: 0.2,
    repetition_penalty: 1.1,
  });
  assert.deepEqual(generationDefaultsOf(r.config), {
    temperature: 0.2,
    topK: 20,
    repetitionPenalty: 1.1,
  });
  assert.deepEqual(r.config?.eosTokenIds, [5, 6]);
  assert.equal(
    generationDefaultsLine(r),
    "Sampling defaults: temperature 0.2, top_k 20, repetition_penalty 1.1 " +
      "(the model's generation_config.json, with temperature, repetition_penalty from " +
      "--override-generation-config)",
  );
  const onNone = await resolveGenerationConfig("vllm", OWN, { top_p: 0.9 });
  assert.deepEqual(generationDefaultsOf(onNone.config), { topP: 0.9 });
  assert.equal(onNone.config?.eosTokenIds, undefined);
  assert.deepEqual(onNone.eosTokenIds, [5, 6]);
  assert.equal(
    generationDefaultsLine(await resolveGenerationConfig("vllm", OWN)),
    "Sampling defaults: none (--generation-config vllm: none from the model)",
  );
});

Deno.test("max_new_tokens of the generation config limits every request's output, as vLLM's does", async () => {
  const r = await resolveGenerationConfig("auto", OWN, { max_new_tokens: 4, temperature: 0 });
  const defaults = generationDefaultsOf(r.config);
  assert.deepEqual(defaults, { maxTokens: 4, temperature: 0, topK: 20 });
  assert.match(generationDefaultsLine(r), /max_new_tokens 4 \(a limit on every request\)/);
  const engine = new FakeEngine(await tinyTokenizer(), { stepMs: 1, generationDefaults: defaults });
  await withServer(engine, {}, async (url) => {
    for (
      const [body, tokens] of [[{ max_tokens: 10 }, 4], [{}, 4], [{ max_tokens: 2 }, 2]] as const
    ) {
      const res = await post(url, "/v1/completions", { prompt: "hello", ...body });
      assert.equal(res.status, 200);
      const json = await res.json();
      assert.equal(json.usage.completion_tokens, tokens, JSON.stringify(body));
      assert.equal(json.choices[0].finish_reason, "length");
    }
    // The engine received the limited budget, and the generation config's temperature.
    assert.equal(engine.requests[0]!.params.maxTokens, 4);
    assert.equal(engine.requests[0]!.params.temperature, 0);
  });
});
