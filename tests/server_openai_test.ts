/**
 * The HTTP server through the official `openai` npm client, against the deterministic fake
 * engine (tests/support/fake_engine.ts) with a real tokenizer: chat and completions, streaming
 * and not, usage, stop strings, n > 1, seeds, logprobs, and 64 concurrent streams.
 */

import assert from "node:assert/strict";
// The client is pinned here rather than in deno.json: only the server tests use it.
// deno-lint-ignore no-import-prefix
import OpenAI from "npm:openai@7.57.0";
import type { Tokenizer } from "../engine/tokenizer.ts";
import { FakeEngine, tinyTokenizer, withServer } from "./support/fake_engine.ts";
import { testSeed } from "./support/random.ts";

function client(url: string): OpenAI {
  return new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
}

/**
 * What the fake engine answers at temperature 0 (the prompt echoed cyclically): the text of the
 * first `maxTokens` tokens, cut at EOS, a stop token or the first stop string.
 */
function echoReference(
  tok: Tokenizer,
  prompt: readonly number[],
  maxTokens: number,
  stop: readonly string[] = [],
): { text: string; tokens: number; finish: "stop" | "length" } {
  const out: number[] = [];
  for (let k = 0; k < maxTokens; k++) {
    const id = prompt[k % prompt.length]!;
    out.push(id);
    const text = tok.decode(out, { skipSpecialTokens: true, cleanUpTokenizationSpaces: false });
    if (id === tok.eosTokenId) return { text, tokens: out.length, finish: "stop" };
    const cuts = stop.map((s) => text.indexOf(s)).filter((i) => i >= 0);
    if (cuts.length > 0) {
      return { text: text.slice(0, Math.min(...cuts)), tokens: out.length, finish: "stop" };
    }
  }
  const text = tok.decode(out, { skipSpecialTokens: true, cleanUpTokenizationSpaces: false });
  return { text, tokens: out.length, finish: "length" };
}

Deno.test("chat completions through the openai client match the echo reference, streamed or not", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok);
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const messages = [{ role: "user" as const, content: "Hello world, how are you?" }];
    const prompt = tok.encode(
      tok.applyChatTemplate(messages, { addGenerationPrompt: true }),
      { addSpecialTokens: false },
    );
    const ref = echoReference(tok, prompt, 64);
    assert.equal(ref.finish, "stop", "the echoed chat prompt reaches <|im_end|>");

    const res = await oa.chat.completions.create({
      model: "fake-model",
      messages,
      temperature: 0,
      max_completion_tokens: 64,
    });
    assert.match(res.id, /^chatcmpl-/);
    assert.equal(res.object, "chat.completion");
    assert.equal(res.model, "fake-model");
    assert.ok(Math.abs(res.created - Date.now() / 1000) < 60);
    assert.equal(res.choices.length, 1);
    const choice = res.choices[0]!;
    assert.equal(choice.index, 0);
    assert.equal(choice.message.role, "assistant");
    assert.equal(choice.message.content, ref.text);
    assert.equal(choice.finish_reason, "stop");
    assert.deepEqual(res.usage, {
      prompt_tokens: prompt.length,
      completion_tokens: ref.tokens,
      total_tokens: prompt.length + ref.tokens,
    });

    const stream = await oa.chat.completions.create({
      model: "fake-model",
      messages,
      temperature: 0,
      max_completion_tokens: 64,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let role = "";
    let finish: string | null = null;
    let usage: unknown = undefined;
    let chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      assert.equal(chunk.object, "chat.completion.chunk");
      assert.match(chunk.id, /^chatcmpl-/);
      if (chunk.choices.length === 0) {
        usage = chunk.usage;
        continue;
      }
      assert.equal(chunk.usage, null, "chunks before the last carry usage: null");
      const c = chunk.choices[0]!;
      if (c.delta.role !== undefined) role = c.delta.role;
      text += c.delta.content ?? "";
      if (c.finish_reason !== null) finish = c.finish_reason;
    }
    assert.ok(chunks > 3, `several chunks (${chunks})`);
    assert.equal(role, "assistant");
    assert.equal(text, ref.text);
    assert.equal(finish, "stop");
    assert.deepEqual(usage, res.usage);
  });
  assert.equal(engine.active, 0);
});

Deno.test("completions accept a string, token ids and a list of prompts, and honour max_tokens", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok);
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const text = "The quick brown fox jumps over the lazy dog";
    const ids = tok.encode(text);
    const ref = echoReference(tok, ids, 5);
    assert.equal(ref.finish, "length");

    const a = await oa.completions.create({
      model: "fake-model",
      prompt: text,
      max_tokens: 5,
      temperature: 0,
    });
    assert.match(a.id, /^cmpl-/);
    assert.equal(a.object, "text_completion");
    assert.equal(a.choices[0]!.text, ref.text);
    assert.equal(a.choices[0]!.finish_reason, "length");
    assert.deepEqual(a.usage, {
      prompt_tokens: ids.length,
      completion_tokens: 5,
      total_tokens: ids.length + 5,
    });

    const b = await oa.completions.create({
      model: "fake-model",
      prompt: ids,
      max_tokens: 5,
      temperature: 0,
    });
    assert.equal(b.choices[0]!.text, ref.text, "token-id prompt");
    const c = await oa.completions.create({
      model: "fake-model",
      prompt: [text],
      max_tokens: 5,
      temperature: 0,
    });
    assert.equal(c.choices[0]!.text, ref.text, "list of one string");

    // Two prompts, n = 2: choice p * n + i.
    const other = "Lorem ipsum dolor sit amet";
    const d = await oa.completions.create({
      model: "fake-model",
      prompt: [text, other],
      n: 2,
      max_tokens: 4,
      temperature: 0,
    });
    assert.deepEqual(d.choices.map((x) => x.index), [0, 1, 2, 3]);
    const refOther = echoReference(tok, tok.encode(other), 4);
    assert.deepEqual(
      d.choices.map((x) => x.text),
      [
        echoReference(tok, ids, 4).text,
        echoReference(tok, ids, 4).text,
        refOther.text,
        refOther.text,
      ],
    );
    assert.equal(d.usage!.completion_tokens, 16);

    // Default max_tokens is 16 for completions (OpenAI / vLLM).
    const e = await oa.completions.create({ model: "fake-model", prompt: ids, temperature: 0 });
    assert.equal(e.usage!.completion_tokens, 16);
    assert.equal(e.choices[0]!.finish_reason, "length");
  });
  assert.equal(engine.active, 0);
});

Deno.test("stop strings end the output and are never streamed, even when split over tokens", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok);
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const prompt = "alpha beta gamma delta alpha beta gamma delta";
    const ids = tok.encode(prompt);
    for (const stop of [["gamma"], ["ta gam"], ["delta", "beta"], ["zzz"]]) {
      const ref = echoReference(tok, ids, 30, stop);
      const res = await oa.completions.create({
        model: "fake-model",
        prompt,
        max_tokens: 30,
        temperature: 0,
        stop,
      });
      const choice = res.choices[0]!;
      assert.equal(choice.text, ref.text, `stop ${JSON.stringify(stop)}`);
      assert.equal(choice.finish_reason, ref.finish);
      const stream = await oa.completions.create({
        model: "fake-model",
        prompt,
        max_tokens: 30,
        temperature: 0,
        stop,
        stream: true,
      });
      let text = "";
      let finish: string | null = null;
      for await (const chunk of stream) {
        const t = chunk.choices[0]!.text;
        for (const s of stop) {
          assert.ok(
            !(text + t).includes(s),
            `stop string ${s} streamed: ${JSON.stringify(text + t)}`,
          );
        }
        text += t;
        finish = chunk.choices[0]!.finish_reason ?? finish;
      }
      assert.equal(text, ref.text, `streamed, stop ${JSON.stringify(stop)}`);
      assert.equal(finish, ref.finish);
    }
    // Chat uses stop strings as well.
    const chat = await oa.chat.completions.create({
      model: "fake-model",
      messages: [{ role: "user", content: "one two three" }],
      temperature: 0,
      stop: "two",
    });
    assert.equal(chat.choices[0]!.message.content, "user\none ");
    assert.equal(chat.choices[0]!.finish_reason, "stop");
  });
  assert.equal(engine.active, 0);
});

Deno.test("n > 1 gives indexed, distinct samples; a seed reproduces them", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok);
  const { seed } = testSeed("server n and seed");
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const ask = (s: number | undefined) =>
      oa.completions.create({
        model: "fake-model",
        prompt: "Once upon a time",
        n: 3,
        max_tokens: 8,
        temperature: 1,
        seed: s,
      });
    const a = await ask(seed);
    const b = await ask(seed);
    assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
    const texts = a.choices.map((c) => c.text);
    assert.deepEqual(b.choices.map((c) => c.text), texts, `seed ${seed} reproduces`);
    assert.equal(new Set(texts).size, 3, `choices differ (seed ${seed}): ${JSON.stringify(texts)}`);
    assert.equal(a.usage!.completion_tokens, 24);
    const c = await ask(undefined);
    const d = await ask(undefined);
    assert.notDeepEqual(c.choices.map((x) => x.text), d.choices.map((x) => x.text));
    // Choice i was asked with seed + i.
    const seeds = engine.requests.slice(0, 3).map((r) => r.params.seed);
    assert.deepEqual(seeds, [seed, seed + 1, seed + 2]);

    // Chat, streaming, n = 2: each index gets its own role chunk, text and finish reason.
    const stream = await oa.chat.completions.create({
      model: "fake-model",
      messages: [{ role: "user", content: "hi" }],
      n: 2,
      seed,
      max_completion_tokens: 6,
      stream: true,
    });
    const parts = ["", ""];
    const finishes: (string | null)[] = [null, null];
    for await (const chunk of stream) {
      for (const ch of chunk.choices) {
        parts[ch.index] += ch.delta.content ?? "";
        if (ch.finish_reason !== null) finishes[ch.index] = ch.finish_reason;
      }
    }
    const plain = await oa.chat.completions.create({
      model: "fake-model",
      messages: [{ role: "user", content: "hi" }],
      n: 2,
      seed,
      max_completion_tokens: 6,
    });
    assert.deepEqual(parts, plain.choices.map((c) => c.message.content));
    assert.deepEqual(finishes, plain.choices.map((c) => c.finish_reason));
  });
  assert.equal(engine.active, 0);
});

Deno.test("logprobs have OpenAI's shapes for completions and chat", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok);
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const res = await oa.completions.create({
      model: "fake-model",
      prompt: "Counting: one two three four",
      max_tokens: 6,
      temperature: 0,
      logprobs: 2,
    });
    const lp = res.choices[0]!.logprobs!;
    assert.equal(lp.tokens!.length, 6);
    assert.equal(lp.token_logprobs!.length, 6);
    assert.equal(lp.top_logprobs!.length, 6);
    assert.equal(lp.text_offset!.length, 6);
    assert.equal(lp.tokens!.join(""), res.choices[0]!.text);
    for (let i = 0; i < 6; i++) {
      assert.ok(lp.token_logprobs![i]! <= 0);
      const top = lp.top_logprobs![i]!;
      assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 3);
      assert.equal(top[lp.tokens![i]!], lp.token_logprobs![i]);
      if (i > 0) {
        assert.equal(lp.text_offset![i], lp.text_offset![i - 1]! + lp.tokens![i - 1]!.length);
      }
    }
    assert.equal(engine.requests.at(-1)!.params.logprobs, 2);

    const chat = await oa.chat.completions.create({
      model: "fake-model",
      messages: [{ role: "user", content: "one two" }],
      max_completion_tokens: 4,
      logprobs: true,
      top_logprobs: 3,
    });
    const content = chat.choices[0]!.logprobs!.content!;
    assert.equal(content.length, chat.usage!.completion_tokens);
    for (const item of content) {
      assert.equal(typeof item.token, "string");
      assert.ok(item.logprob <= 0);
      assert.deepEqual(item.bytes, [...new TextEncoder().encode(item.token)]);
      assert.equal(item.top_logprobs.length, 3);
      assert.equal(item.top_logprobs[0]!.token, item.token);
    }
    const none = await oa.chat.completions.create({
      model: "fake-model",
      messages: [{ role: "user", content: "one two" }],
      max_completion_tokens: 2,
    });
    assert.equal(none.choices[0]!.logprobs, null);
    assert.equal(engine.requests.at(-1)!.params.logprobs, null);
  });
});

Deno.test("sampling fields reach the engine with vLLM's meanings", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok);
  await withServer(engine, {}, async (url) => {
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt: [5, 6, 7],
        max_tokens: 3,
        temperature: 0.5,
        top_p: 0.9,
        top_k: 40,
        min_p: 0.05,
        seed: 7,
        stop: "x",
        stop_token_ids: [9],
        min_tokens: 2,
        ignore_eos: true,
        presence_penalty: 0.5,
        frequency_penalty: -0.5,
        repetition_penalty: 1.2,
        logit_bias: { "11": 5, "12": -100 },
        priority: -3,
        user: "ignored",
      }),
    });
    assert.equal(res.status, 200);
    await res.body?.cancel();
    const r = engine.requests.at(-1)!;
    assert.deepEqual(r.promptTokenIds, [5, 6, 7]);
    assert.equal(r.priority, -3);
    const p = r.params;
    assert.deepEqual(
      [p.temperature, p.topP, p.topK, p.minP, p.seed, p.maxTokens, p.minTokens],
      [0.5, 0.9, 40, 0.05, 7, 3, 2],
    );
    assert.deepEqual([...p.stop], ["x"]);
    assert.deepEqual([...p.stopTokenIds], [9]);
    assert.deepEqual(
      [p.ignoreEos, p.presencePenalty, p.frequencyPenalty, p.repetitionPenalty, p.n],
      [true, 0.5, -0.5, 1.2, 1],
    );
    assert.deepEqual([...p.logitBias!], [[11, 5], [12, -100]]);
    // top_k -1 means off; chat without a limit may use the whole context.
    await (await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        messages: [{
          role: "user",
          content: [{ type: "text", text: "a" }, { type: "text", text: "b" }],
        }],
        top_k: -1,
        max_tokens: 1,
      }),
    })).body?.cancel();
    const chat = engine.requests.at(-1)!;
    assert.equal(chat.params.topK, 0);
    assert.equal(chat.params.maxTokens, 1);
    assert.equal(
      tok.decode(chat.promptTokenIds as number[]),
      "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n",
    );
  });
});

Deno.test("64 concurrent streaming requests each equal the same request alone", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { stepMs: 1 });
  const { seed, rng } = testSeed("server 64 concurrent");
  const words = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree", "river", "stone"];
  const requests = Array.from({ length: 64 }, (_, i) => ({
    prompt: Array.from({ length: rng.int(2, 8) }, () => words[rng.int(0, words.length - 1)]).join(
      " ",
    ),
    seed: rng.int(0, 1 << 30),
    max_tokens: rng.int(1, 12),
    temperature: i % 2 === 0 ? 0 : 1,
  }));
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const streamed = async (r: (typeof requests)[number]) => {
      const stream = await oa.completions.create({ model: "fake-model", ...r, stream: true });
      let text = "";
      for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
      return text;
    };
    const together = await Promise.all(requests.map(streamed));
    for (let i = 0; i < requests.length; i++) {
      const alone = await streamed(requests[i]!);
      assert.equal(together[i], alone, `request ${i} (seed ${seed})`);
    }
  });
  assert.equal(engine.active, 0);
});
