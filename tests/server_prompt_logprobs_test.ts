/**
 * `prompt_logprobs` (vLLM's: each prompt token's log-probability, rank and most likely tokens)
 * on `/v1/completions` (per choice) and `/v1/chat/completions` (top level), streamed or not, and
 * `echo` with `logprobs` (lm-eval-harness's loglikelihood requests: the choice's `logprobs` start
 * with the prompt's tokens). Against the deterministic fake engine, whose prompt logprobs are
 * {@linkcode fakePromptLogprobs}, and once against the real engine on a tiny model.
 */

import assert from "node:assert/strict";
// deno-lint-ignore no-import-prefix
import OpenAI from "npm:openai@7.57.0";
import type { PromptLogprob } from "../engine/engine_api.ts";
import { LLMEngine } from "../engine/llm_engine.ts";
import type { Tokenizer } from "../engine/tokenizer.ts";
import {
  FakeEngine,
  fakePromptLogprobs,
  tinyTokenizer,
  withServer,
} from "./support/fake_engine.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { withTinyEngine } from "./support/tiny_engine.ts";
import {
  byIndex,
  chunks,
  type CompletionChoice,
  ok,
  post,
  type PromptLogprobDict,
} from "./support/http.ts";

/**
 * vLLM's `prompt_logprobs` of `lps` with `count` top entries, written independently of the
 * server: top ranks 1..count, the prompt token added with its own rank when not among them.
 */
function vllmShape(
  tok: Tokenizer,
  lps: readonly (PromptLogprob | null)[],
  count: number,
): (PromptLogprobDict | null)[] {
  const text = (id: number) => tok.decode([id]);
  return lps.map((lp) => {
    if (lp === null) return null;
    const dict: PromptLogprobDict = {};
    for (let i = 0; i < count; i++) {
      const alt = lp.top[i]!;
      dict[`${alt.tokenId}`] = {
        logprob: alt.logprob,
        rank: i + 1,
        decoded_token: text(alt.tokenId),
      };
    }
    if (!lp.top.slice(0, count).some((t) => t.tokenId === lp.tokenId)) {
      dict[`${lp.tokenId}`] = {
        logprob: lp.logprob,
        rank: lp.rank,
        decoded_token: text(lp.tokenId),
      };
    }
    return dict;
  });
}

const PROMPT = [11, 12, 13, 14, 15, 16, 17];

Deno.test("completions carry vLLM's prompt_logprobs in every choice when prompt_logprobs is set", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const body = { prompt: PROMPT, max_tokens: 3, n: 2, temperature: 0, prompt_logprobs: 2 };
    const res = await ok<{ choices: CompletionChoice[] }>(await post(url, "/v1/completions", body));
    const want = vllmShape(tok, fakePromptLogprobs(PROMPT, 2, engine.model.vocabSize), 2);
    assert.equal(res.choices.length, 2);
    for (const c of res.choices) {
      assert.deepEqual(c.prompt_logprobs, want, `choice ${c.index}`);
      assert.equal(c.logprobs, null);
    }
    // Position 2 (token 13): rank 3, so the two top entries and the token itself; position 1
    // (token 12): rank 2, the token is the second top entry.
    const at2 = res.choices[0]!.prompt_logprobs![2]!;
    assert.deepEqual(Object.keys(at2).sort(), ["13", "14", "15"]);
    assert.equal(at2["13"]!.logprob, -0.3);
    assert.equal(at2["13"]!.rank, 3);
    assert.equal(at2["14"]!.rank, 1);
    assert.equal(at2["15"]!.rank, 2);
    assert.equal(at2["14"]!.decoded_token, tok.decode([14]));
    assert.ok(at2["14"]!.logprob > at2["15"]!.logprob && at2["15"]!.logprob > -0.3);
    const at1 = res.choices[0]!.prompt_logprobs![1]!;
    assert.deepEqual(Object.keys(at1).sort(), ["12", "13"]);
    assert.deepEqual(at1["12"], { logprob: -0.2, rank: 2, decoded_token: tok.decode([12]) });
    assert.equal(res.choices[0]!.prompt_logprobs![0], null);
    // Only the prompt's first choice asks the engine to score it; the second shares the result.
    const asked = engine.requests.slice(-2).map((r) => r.params.promptLogprobs);
    assert.deepEqual(asked, [2, null]);
    // Without the field: nothing asked, nothing added.
    const plain = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", { ...body, prompt_logprobs: undefined }),
    );
    assert.equal(engine.requests.at(-1)!.params.promptLogprobs, null);
    assert.ok(plain.choices.every((c) => !("prompt_logprobs" in c)));
    // prompt_logprobs 0: each dict holds the prompt token alone, with its rank.
    const zero = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", { ...body, n: 1, prompt_logprobs: 0 }),
    );
    assert.deepEqual(zero.choices[0]!.prompt_logprobs![3], {
      "14": { logprob: -0.4, rank: 4, decoded_token: tok.decode([14]) },
    });
  });
});

Deno.test("streamed completions send prompt_logprobs with each choice's first chunk only", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const prompts = [PROMPT, [21, 22, 23]];
    const body = { prompt: prompts, max_tokens: 3, temperature: 0, prompt_logprobs: 1 };
    const all = await chunks(await post(url, "/v1/completions", { ...body, stream: true }));
    const seen = new Set<number>();
    for (const chunk of all) {
      for (const c of chunk.choices as CompletionChoice[]) {
        if (seen.has(c.index)) {
          assert.ok(!("prompt_logprobs" in c), `a later chunk of choice ${c.index}`);
          continue;
        }
        seen.add(c.index);
        const want = vllmShape(
          tok,
          fakePromptLogprobs(prompts[c.index]!, 1, engine.model.vocabSize),
          1,
        );
        assert.deepEqual(c.prompt_logprobs, want, `choice ${c.index}`);
      }
    }
    assert.deepEqual([...seen].sort(), [0, 1]);
    // The same as the non-streamed answer.
    const whole = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", body),
    );
    const first = (i: number) =>
      all.flatMap((k) => k.choices as CompletionChoice[]).find((c) => c.index === i)!;
    for (const c of whole.choices) {
      assert.deepEqual(first(c.index).prompt_logprobs, c.prompt_logprobs);
    }
  });
});

Deno.test("chat completions carry prompt_logprobs at the top level, streamed in the first chunk", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 128 });
  await withServer(engine, {}, async (url) => {
    const body = {
      messages: [{ role: "user", content: "hi there" }],
      max_tokens: 2,
      n: 2,
      prompt_logprobs: 3,
    };
    const res = await ok<{ choices: Record<string, unknown>[]; prompt_logprobs: unknown }>(
      await post(url, "/v1/chat/completions", body),
    );
    const ids = engine.requests.at(-2)!.promptTokenIds;
    const want = vllmShape(tok, fakePromptLogprobs(ids, 3, engine.model.vocabSize), 3);
    assert.equal(want.length, ids.length);
    assert.deepEqual(res.prompt_logprobs, want);
    assert.ok(res.choices.every((c) => !("prompt_logprobs" in c)));
    const all = await chunks(await post(url, "/v1/chat/completions", { ...body, stream: true }));
    assert.deepEqual(all[0]!.prompt_logprobs, want);
    assert.deepEqual((all[0]!.choices as { delta: unknown }[])[0]!.delta, {
      role: "assistant",
      content: "",
    });
    assert.ok(all.slice(1).every((c) => !("prompt_logprobs" in c)));
    // Without the field, none.
    const plain = await ok(
      await post(url, "/v1/chat/completions", { ...body, prompt_logprobs: null }),
    );
    assert.ok(!("prompt_logprobs" in plain));
  });
});

Deno.test("completions with echo and logprobs start each choice's logprobs with its prompt, as lm-eval reads them", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const oa = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
    // lm-eval-harness's loglikelihood request: context + continuation, one generated token.
    const prompts = [[31, 32, 33, 34, 35, 36, 37], [41, 42, 43, 44]];
    const ctxlens = [4, 2];
    const res = await oa.completions.create({
      model: "fake-model",
      prompt: prompts,
      max_tokens: 1,
      logprobs: 1,
      echo: true,
      temperature: 0,
    });
    assert.deepEqual(engine.requests.slice(-2).map((r) => r.params.promptLogprobs), [1, 1]);
    const choices = byIndex(res.choices);
    assert.equal(choices.length, 2);
    choices.forEach((choice, i) => {
      const ids = prompts[i]!;
      const lps = fakePromptLogprobs(ids, 1, engine.model.vocabSize);
      const lp = choice.logprobs!;
      const n = ids.length + 1;
      assert.equal(lp.tokens!.length, n);
      assert.equal(lp.token_logprobs!.length, n);
      assert.equal(lp.top_logprobs!.length, n);
      assert.equal(lp.text_offset!.length, n);
      assert.equal(lp.token_logprobs![0], null);
      assert.equal(lp.top_logprobs![0], null);
      assert.deepEqual(lp.tokens!.slice(0, ids.length), ids.map((id) => tok.decode([id])));
      for (let k = 1; k < ids.length; k++) {
        assert.equal(lp.token_logprobs![k], -(k + 1) / 10, `choice ${i}, token ${k}`);
        // The top entry and the token itself (one entry when the token is the top one).
        const want = { [tok.decode([lps[k]!.top[0]!.tokenId])]: lps[k]!.top[0]!.logprob };
        want[tok.decode([ids[k]!])] = -(k + 1) / 10;
        assert.deepEqual(lp.top_logprobs![k], want, `choice ${i}, token ${k}`);
      }
      // The generated token follows, with its own logprobs (the fake repeats its prompt).
      assert.equal(lp.tokens![ids.length], tok.decode([ids[0]!]));
      assert.ok((lp.token_logprobs![ids.length] as number) < 0);
      // What lm-eval sums: the continuation's tokens.
      const ctxlen = ctxlens[i]!;
      const cont = lp.token_logprobs!.slice(ctxlen, -1) as number[];
      let expected = 0;
      for (let k = ctxlen; k < ids.length; k++) expected += -(k + 1) / 10;
      assert.equal(cont.length, ids.length - ctxlen);
      assert.ok(Math.abs(cont.reduce((a, b) => a + b, 0) - expected) < 1e-12);
      // is_greedy: only a rank-1 position (k % 5 === 0) has its token as the top one.
      const tops = lp.top_logprobs!.slice(ctxlen, -1) as Record<string, number>[];
      const greedy = cont.map((t, j) => t === Math.max(...Object.values(tops[j]!)));
      assert.deepEqual(greedy, cont.map((_, j) => (ctxlen + j) % 5 === 0), `choice ${i}`);
      // Offsets count the tokens' texts from 0; the text is the echoed prompt and the answer.
      const echoed = tok.decode(ids, { skipSpecialTokens: false });
      assert.ok(choice.text.startsWith(echoed));
      lp.tokens!.forEach((t, k) => {
        assert.equal(choice.text.slice(lp.text_offset![k], lp.text_offset![k]! + t.length), t);
      });
      assert.equal(lp.text_offset![ids.length], echoed.length);
      assert.ok(!("prompt_logprobs" in choice), "not asked for");
    });
  });
});

Deno.test("completions with echo and logprobs stream the prompt's logprobs first and match the whole answer", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const body = {
      prompt: "Hello world, again",
      max_tokens: 3,
      logprobs: 2,
      prompt_logprobs: 1,
      echo: true,
      temperature: 0,
    };
    const whole = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", body),
    );
    // The engine scores max(logprobs, prompt_logprobs) entries; prompt_logprobs shows its own.
    assert.equal(engine.requests.at(-1)!.params.promptLogprobs, 2);
    const ids = engine.requests.at(-1)!.promptTokenIds;
    const choice = whole.choices[0]!;
    assert.deepEqual(
      choice.prompt_logprobs,
      vllmShape(tok, fakePromptLogprobs(ids, 2, engine.model.vocabSize), 1),
    );
    const lp = choice.logprobs!;
    assert.equal(lp.tokens.length, ids.length + 3);
    assert.equal(choice.text, body.prompt + tok.decode([...ids, ...ids].slice(0, 3)));
    lp.tokens.forEach((t, k) => {
      assert.equal(choice.text.slice(lp.text_offset[k], lp.text_offset[k]! + t.length), t);
    });
    // Two top entries plus the token: three texts, or two when the token is among them.
    assert.equal(Object.keys(lp.top_logprobs[1]!).length, 2, "rank 2: among the top two");
    assert.equal(Object.keys(lp.top_logprobs[2]!).length, 3, "rank 3: added");
    const all = await chunks(await post(url, "/v1/completions", { ...body, stream: true }));
    const streamed = all.flatMap((c) => c.choices as CompletionChoice[]);
    assert.equal(streamed[0]!.logprobs!.tokens.length, ids.length + 1, "prompt and first token");
    const joined = {
      tokens: streamed.flatMap((c) => c.logprobs!.tokens),
      token_logprobs: streamed.flatMap((c) => c.logprobs!.token_logprobs),
      top_logprobs: streamed.flatMap((c) => c.logprobs!.top_logprobs),
      text_offset: streamed.flatMap((c) => c.logprobs!.text_offset),
    };
    assert.deepEqual(joined, lp);
    assert.equal(streamed.map((c) => c.text).join(""), choice.text);
    assert.deepEqual(streamed[0]!.prompt_logprobs, choice.prompt_logprobs);
    // prompt_logprobs above logprobs: the engine scores 3, the echoed tokens show their 1.
    const wide = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", { ...body, logprobs: 1, prompt_logprobs: 3 }),
    );
    assert.equal(engine.requests.at(-1)!.params.promptLogprobs, 3);
    const tops = wide.choices[0]!.logprobs!.top_logprobs;
    assert.deepEqual(tops.slice(1, 4).map((t) => Object.keys(t!).length), [2, 2, 2]);
    assert.equal(Object.keys(wide.choices[0]!.prompt_logprobs![3]!).length, 4, "rank 4: added");
  });
});

Deno.test("prompt_logprobs out of range is a 400 naming it, on both endpoints", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const cases: [string, Record<string, unknown>][] = [
      ["/v1/completions", { prompt: "hi", prompt_logprobs: 21 }],
      ["/v1/completions", { prompt: "hi", prompt_logprobs: -1 }],
      ["/v1/completions", { prompt: "hi", echo: true, logprobs: 3, prompt_logprobs: -1 }],
      ["/v1/completions", { prompt: "hi", prompt_logprobs: 2.5 }],
      ["/v1/chat/completions", {
        messages: [{ role: "user", content: "hi" }],
        prompt_logprobs: 99,
      }],
      ["/v1/chat/completions", {
        messages: [{ role: "user", content: "hi" }],
        prompt_logprobs: "1",
      }],
    ];
    for (const [path, body] of cases) {
      const res = await post(url, path, { max_tokens: 1, ...body });
      const text = await res.text();
      assert.equal(res.status, 400, `${path} ${JSON.stringify(body)}: ${text}`);
      assert.equal(JSON.parse(text).error.param, "prompt_logprobs", text);
    }
    assert.equal(engine.requests.length, 0, "nothing reached the engine");
  });
});

Deno.test("a mock-executor engine answers prompt_logprobs with a 400 naming it", async () => {
  const engine = LLMEngine.createMock({ mockBaseMs: 0, mockPerTokenMs: 0, numKvBlocks: 64 });
  try {
    await withServer(engine, {}, async (url) => {
      for (const stream of [false, true]) {
        const res = await post(url, "/v1/completions", {
          prompt: [1, 2, 3],
          max_tokens: 1,
          prompt_logprobs: 1,
          stream,
        });
        const text = await res.text();
        assert.equal(res.status, 400, text);
        assert.equal(JSON.parse(text).error.param, "prompt_logprobs", text);
      }
      // Without them the mock answers.
      await ok(await post(url, "/v1/completions", { prompt: [1, 2, 3], max_tokens: 1 }));
    });
  } finally {
    await engine.shutdown();
  }
});

Deno.test(
  "completions with echo, logprobs and prompt_logprobs on the real engine score every prompt token after the first",
  GPU_TEST,
  () =>
    withTinyEngine(async (engine) => {
      await withServer(engine, {}, async (url) => {
        const prompt = [5, 17, 230, 41, 8, 99, 150, 3];
        const body = {
          prompt: [prompt],
          max_tokens: 1,
          logprobs: 1,
          prompt_logprobs: 1,
          echo: true,
          temperature: 0,
        };
        const res = await ok<{ choices: CompletionChoice[] }>(
          await post(url, "/v1/completions", body),
        );
        const choice = res.choices[0]!;
        const lp = choice.logprobs!;
        const pl = choice.prompt_logprobs!;
        assert.equal(pl.length, prompt.length);
        assert.equal(pl[0], null);
        assert.equal(lp.token_logprobs.length, prompt.length + 1);
        assert.equal(lp.token_logprobs[0], null);
        for (let k = 1; k < prompt.length; k++) {
          const v = lp.token_logprobs[k];
          assert.ok(typeof v === "number" && Number.isFinite(v) && v <= 0, `token ${k}: ${v}`);
          const entry = pl[k]![`${prompt[k]}`];
          assert.ok(entry !== undefined, `token ${k}: ${JSON.stringify(pl[k])}`);
          assert.equal(v, entry.logprob, `token ${k}`);
          assert.ok(Number.isInteger(entry.rank) && entry.rank >= 1, `token ${k}`);
          // The top entry (rank 1) is at least as likely as the prompt token.
          const best = Object.values(pl[k]!).find((e) => e.rank === 1)!;
          assert.ok(best.logprob >= v, `token ${k}`);
        }
        const last = lp.token_logprobs[prompt.length];
        assert.ok(typeof last === "number" && Number.isFinite(last) && last <= 0);
        // The most likely token at the last prompt position is what greedy decoding of the prompt
        // before it picks, with the same log-probability.
        const best = Object.entries(pl.at(-1)!).find(([, e]) => e.rank === 1)!;
        const shorter = await ok<{ choices: CompletionChoice[] }>(
          await post(url, "/v1/completions", {
            prompt: prompt.slice(0, -1),
            max_tokens: 1,
            logprobs: 0,
            temperature: 0,
          }),
        );
        const greedy = shorter.choices[0]!.logprobs!;
        assert.equal(greedy.tokens[0], best[1].decoded_token);
        const diff = Math.abs((greedy.token_logprobs[0] as number) - best[1].logprob);
        assert.ok(diff < 1e-3, `greedy ${greedy.token_logprobs[0]} vs prompt ${best[1].logprob}`);
      });
    }),
);
