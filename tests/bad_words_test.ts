/**
 * vLLM's `bad_words` (engine/bad_words.ts): the token sequences of the words, the mask after the
 * output so far, the parameter checks, and the real engine on a random-weight tiny model.
 */

import assert from "node:assert/strict";
import { BadWords, badWordTokenIds } from "../engine/bad_words.ts";
import { InvalidParameterError, validateSamplingParams } from "../engine/input_processor.ts";
import type { LLMEngine } from "../engine/llm_engine.ts";
import type { RequestOutput } from "../engine/engine_api.ts";
import { Tokenizer } from "../engine/tokenizer.ts";
import { type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import { makeModel } from "../tools/make_model.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { withTinyEngine } from "./support/tiny_engine.ts";

/** The ids a mask allows, of the first `n`. */
function allowed(mask: Uint32Array, n: number): number[] {
  return Array.from({ length: n }, (_, id) => id).filter((id) =>
    ((mask[id >>> 5]! >>> (id & 31)) & 1) === 1
  );
}

Deno.test("BadWords.mask() bans a sequence's last token once the output ends with the rest", () => {
  const words = new BadWords([[5], [7, 8], [9, 10, 11]]);
  const all = Array.from({ length: 40 }, (_, i) => i);
  const without = (...ids: number[]) => all.filter((id) => !ids.includes(id));
  assert.deepEqual(allowed(words.mask(null, 40), 40), without(5));
  words.push([7]);
  assert.deepEqual(allowed(words.mask(null, 40), 40), without(5, 8));
  words.push([9, 10]);
  assert.deepEqual(allowed(words.mask(null, 40), 40), without(5, 11));
  words.push([3]);
  assert.deepEqual(allowed(words.mask(null, 40), 40), without(5));
  // A fixed mask is narrowed on a copy, never changed.
  const base = new Uint32Array(2);
  base[0] = (1 << 5) | (1 << 6);
  assert.deepEqual(allowed(words.mask(base, 40), 40), [6]);
  assert.equal(base[0], (1 << 5) | (1 << 6));
});

Deno.test("badWordTokenIds() encodes each word bare and after a space, as vLLM does", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "bf16" });
    const tok = await Tokenizer.fromDir(dir);
    const enc = (s: string) => tok.encode(s, { addSpecialTokens: false });
    for (const word of ["hello", " hello", "world peace", "x"]) {
      const bare = enc(word.trimStart());
      const spaced = enc(" " + word.trimStart());
      const expected = spaced.length === bare.length && spaced[0] !== bare[0]
        ? [bare, spaced]
        : [bare];
      assert.deepEqual(badWordTokenIds(tok, [word]), expected, word);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("validateSamplingParams() checks bad_words", () => {
  const model = { vocabSize: 100 };
  assert.deepEqual(
    validateSamplingParams(samplingParams({ badWords: ["a", "b c"] }), model).badWords,
    ["a", "b c"],
  );
  assert.equal(validateSamplingParams(samplingParams({ badWords: [] }), model).badWords, null);
  const cases: [Partial<SamplingParams>, string][] = [
    [{ badWords: ["ok", "  "] }, "bad_words.1"],
    [{ badWords: ["x".repeat(1001)] }, "bad_words.0"],
    [{ badWords: Array.from({ length: 65 }, () => "w") }, "bad_words"],
    [{ badWords: ["w"], structuredOutput: { kind: "json_object" } }, "bad_words"],
  ];
  for (const [overrides, param] of cases) {
    assert.throws(
      () => validateSamplingParams(samplingParams(overrides), model),
      (e: unknown) => e instanceof InvalidParameterError && e.param === param,
      param,
    );
  }
});

async function generate(
  engine: LLMEngine,
  id: string,
  params: Partial<SamplingParams>,
): Promise<number[]> {
  const ids: number[] = [];
  const stream: AsyncIterable<RequestOutput> = engine.generate({
    requestId: id,
    promptTokenIds: [1, 2, 3, 4, 5],
    params: samplingParams({ temperature: 0, maxTokens: 24, ignoreEos: true, ...params }),
  });
  for await (const out of stream) ids.push(...out.tokenIds);
  return ids;
}

/** Whether `ids` holds `seq` at consecutive positions. */
function contains(ids: readonly number[], seq: readonly number[]): boolean {
  return ids.some((_, i) => seq.every((t, j) => ids[i + j] === t));
}

Deno.test(
  "LLMEngine never outputs a bad word's token sequences, one token or several",
  GPU_TEST,
  () =>
    withTinyEngine(async (engine) => {
      const tok = engine.tokenizer!;
      const free = await generate(engine, "free", {});
      const text = (ids: number[]) => tok.decode(ids, { skipSpecialTokens: true });
      // Words the free output holds whose token sequences include what it generated.
      const word = (len: number) => {
        for (let i = 0; i + len <= free.length; i++) {
          const w = text(free.slice(i, i + len));
          if (w.trim() === "" || w !== w.trimStart()) continue;
          const seqs = badWordTokenIds(tok, [w]);
          if (seqs.some((s) => s.length === len && s.every((t, j) => t === free[i + j]))) {
            return { w, seqs };
          }
        }
        return null;
      };
      const one = word(1);
      const two = word(2);
      assert.ok(one !== null && two !== null, `no usable words in ${free}`);
      for (const { w, seqs } of [one, two]) {
        const out = await generate(engine, `bad-${w}`, { badWords: [w] });
        assert.equal(out.length, 24);
        for (const s of seqs) assert.ok(!contains(out, s), `${JSON.stringify(w)}: ${out}`);
        assert.notDeepEqual(out, free, "the ban changed the greedy output");
      }
      // A free request beside banned ones is unchanged.
      const [again] = await Promise.all([
        generate(engine, "free-again", {}),
        generate(engine, "banned", { badWords: [one.w, two.w] }),
      ]);
      assert.deepEqual(again, free);
    }),
);
