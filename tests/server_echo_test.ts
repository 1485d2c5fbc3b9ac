/**
 * `echo`: a completion's choices start with their prompt, a chat answer with the last message
 * when that is the assistant's (vLLM's extra), streamed or not (with `logprobs`:
 * tests/server_prompt_logprobs_test.ts). Against the deterministic fake engine, whose greedy
 * answer is its prompt repeated.
 */

import assert from "node:assert/strict";
// deno-lint-ignore no-import-prefix
import OpenAI from "npm:openai@7.57.0";
import { FakeEngine, tinyTokenizer, withServer } from "./support/fake_engine.ts";

function client(url: string): OpenAI {
  return new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
}

/** Every choice's text of a streamed completion, by index. */
async function streamedTexts(
  stream: AsyncIterable<{ choices: { index: number; text: string }[] }>,
): Promise<string[]> {
  const texts: string[] = [];
  for await (const chunk of stream) {
    for (const c of chunk.choices) texts[c.index] = (texts[c.index] ?? "") + c.text;
  }
  return texts;
}

Deno.test("completions with echo start each choice with its prompt, streamed or not", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const decode = (ids: number[]) =>
      tok.decode(ids, { skipSpecialTokens: true, cleanUpTokenizationSpaces: false });
    // A string prompt is echoed as sent; the answer follows it.
    const prompt = "Hello world";
    const ids = tok.encode(prompt);
    const plain = await oa.completions.create({
      model: "fake-model",
      prompt,
      max_tokens: 3,
      temperature: 0,
    });
    const answer = plain.choices[0]!.text;
    assert.equal(answer, decode([...ids, ...ids].slice(0, 3)));
    for (const stream of [false, true]) {
      const body = { model: "fake-model", prompt, max_tokens: 3, temperature: 0, echo: true };
      const texts = stream
        ? await streamedTexts(await oa.completions.create({ ...body, stream: true }))
        : (await oa.completions.create(body)).choices.map((c) => c.text);
      assert.deepEqual(texts, [prompt + answer], `stream ${stream}`);
    }
    // Token ids, two prompts, n = 2: each choice echoes its own prompt, decoded with its special
    // tokens.
    const eos = tok.eosTokenId!;
    const prompts = [[11, 12, 13], [21, 22, eos]];
    for (const stream of [false, true]) {
      const body = {
        model: "fake-model",
        prompt: prompts,
        max_tokens: 2,
        n: 2,
        echo: true,
        temperature: 0,
      };
      const texts = stream
        ? await streamedTexts(await oa.completions.create({ ...body, stream: true }))
        : (await oa.completions.create(body)).choices.sort((a, b) => a.index - b.index).map((
          c,
        ) => c.text);
      assert.equal(texts.length, 4);
      texts.forEach((text, i) => {
        const p = prompts[Math.floor(i / 2)]!;
        const echoed = tok.decode(p, { skipSpecialTokens: false });
        assert.ok(text.startsWith(echoed), `choice ${i}: ${JSON.stringify(text)}`);
        assert.equal(
          text.slice(echoed.length),
          decode(p.slice(0, 2)),
          `choice ${i}, stream ${stream}`,
        );
      });
    }
    // A truncated string prompt echoes what the model saw.
    const cut = await oa.completions.create({
      model: "fake-model",
      prompt: "one two three four five",
      max_tokens: 1,
      echo: true,
      ...{ truncate_prompt_tokens: 2 },
    });
    const seen = engine.requests.at(-1)!.promptTokenIds;
    assert.equal(seen.length, 2);
    assert.ok(cut.choices[0]!.text.startsWith(tok.decode(seen, { skipSpecialTokens: false })));
    // Usage counts the prompt once, as without echo.
    assert.equal(plain.usage?.prompt_tokens, ids.length);
  });
});

Deno.test("completions with echo false change nothing", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const post = (body: unknown) =>
      fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
    const off = await post({ prompt: [5, 6], max_tokens: 2, echo: false, temperature: 0 });
    assert.equal(
      (await off.json()).choices[0].text,
      tok.decode([5, 6], { skipSpecialTokens: true }),
    );
  });
});

Deno.test("chat with echo starts the answer with the last message when it is the assistant's", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const partial = "The answer is";
    const messages = [
      { role: "user" as const, content: "hi" },
      { role: "assistant" as const, content: partial },
    ];
    const base = { model: "fake-model", messages, max_tokens: 3, temperature: 0 };
    // vLLM's extra field, unknown to the openai SDK's types.
    const echo = { echo: true };
    const plain = await oa.chat.completions.create(base);
    const answer = plain.choices[0]!.message.content ?? "";
    for (const stream of [false, true]) {
      let content: string;
      if (stream) {
        content = "";
        for await (
          const chunk of await oa.chat.completions.create({ ...base, ...echo, stream: true })
        ) {
          content += chunk.choices[0]?.delta.content ?? "";
        }
      } else {
        const res = await oa.chat.completions.create({ ...base, ...echo });
        content = res.choices[0]!.message.content ?? "";
      }
      assert.equal(content, partial + answer, `stream ${stream}`);
    }
    // The last message is the user's: nothing is echoed.
    const user = [{ role: "user" as const, content: "hi" }];
    const a = await oa.chat.completions.create({ ...base, messages: user });
    const b = await oa.chat.completions.create({ ...base, messages: user, ...echo });
    assert.equal(b.choices[0]!.message.content, a.choices[0]!.message.content);
  });
});

Deno.test(
  "completions with echo and max_tokens 0 return each prompt alone, streamed or not",
  async () => {
    const tok = await tinyTokenizer();
    const engine = new FakeEngine(tok, { maxModelLen: 64 });
    await withServer(engine, {}, async (url) => {
      const prompts = [[11, 12, 13], [21, 22]];
      for (const stream of [false, true]) {
        const body = {
          model: "fake-model",
          prompt: prompts,
          max_tokens: 0,
          echo: true,
          logprobs: 1,
          temperature: 0,
          stream,
          ...(stream ? { stream_options: { include_usage: true } } : {}),
        };
        const res = await fetch(`${url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(body),
        });
        assert.equal(res.status, 200, await (stream ? "" : res.clone().text()));
        type Choice = {
          index: number;
          text: string;
          finish_reason: string | null;
          logprobs: { tokens: string[]; token_logprobs: (number | null)[] } | null;
        };
        type Chunk = { choices: Choice[]; usage?: { completion_tokens: number } | null };
        const chunks: Chunk[] = stream
          ? (await res.text()).split("\n\n").filter((l) => l.startsWith("data: {")).map((l) =>
            JSON.parse(l.slice(6))
          )
          : [await res.json()];
        const texts: string[] = [];
        const tokens: string[][] = [[], []];
        const reasons: (string | null)[] = [];
        for (const chunk of chunks) {
          for (const c of chunk.choices) {
            texts[c.index] = (texts[c.index] ?? "") + c.text;
            tokens[c.index]!.push(...(c.logprobs?.tokens ?? []));
            if (c.finish_reason !== null) reasons[c.index] = c.finish_reason;
          }
        }
        prompts.forEach((p, i) => {
          // The prompt, its tokens' logprobs, nothing generated.
          assert.equal(texts[i], tok.decode(p, { skipSpecialTokens: false }), `stream ${stream}`);
          assert.deepEqual(tokens[i], p.map((id) => tok.decode([id])), `stream ${stream}`);
          assert.equal(reasons[i], "length");
        });
        // The engine generated one token per prompt, counted as vLLM counts it.
        const usage = chunks.at(-1)!.usage;
        assert.equal(usage?.completion_tokens, 2, `stream ${stream}`);
      }
      // Without echo, max_tokens 0 is still a 400 naming it.
      const res = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "fake-model", prompt: "Hi", max_tokens: 0 }),
      });
      assert.equal(res.status, 400);
      assert.equal((await res.json()).error.param, "max_tokens");
    });
  },
);
