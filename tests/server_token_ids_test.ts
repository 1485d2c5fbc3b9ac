/**
 * vLLM's token-id request fields on `/v1/completions` and `/v1/chat/completions`:
 * `return_token_ids` (the prompt's ids and each choice's generated ids, streamed per chunk),
 * `return_tokens_as_token_ids` (logprobs tokens written `token_id:<id>`) and `cache_salt`
 * (passed to the engine; its prefix cache is shared only within a salt). Against the
 * deterministic fake engine, whose greedy answer is its prompt (or its `reply`) repeated, and the
 * real engine with the mock executor for the prefix cache.
 */

import assert from "node:assert/strict";
// deno-lint-ignore no-import-prefix
import OpenAI from "npm:openai@7.57.0";
import { serveSettingsFromFlags } from "../cli/serve_flags.ts";
import type { EngineClient } from "../engine/engine_api.ts";
import { LLMEngine } from "../engine/llm_engine.ts";
import type { Tokenizer } from "../engine/tokenizer.ts";
import { chatLogprobs, completionLogprobs } from "../server/logprobs.ts";
import { FakeEngine, tinyTokenizer, withServer } from "./support/fake_engine.ts";
import { byIndex, chunks, type CompletionChoice, ok, post } from "./support/http.ts";

interface ChatTokenLogprob {
  token: string;
  logprob: number;
  bytes: number[];
}

interface ChatChoice {
  index: number;
  message: { role: string; content: string | null };
  logprobs: { content: (ChatTokenLogprob & { top_logprobs: ChatTokenLogprob[] })[] } | null;
  token_ids?: number[];
  prompt_token_ids?: number[];
}

interface ChatChunkChoice {
  index: number;
  delta: { role?: string; content?: string };
  logprobs: ChatChoice["logprobs"];
  token_ids?: number[];
}

/** The fake's greedy answer of `count` tokens to `source`: its tokens repeated. */
function cyclic(source: readonly number[], count: number): number[] {
  return Array.from({ length: count }, (_, k) => source[k % source.length]!);
}

function decode(tok: Tokenizer, ids: number[]): string {
  return tok.decode(ids, { skipSpecialTokens: true, cleanUpTokenizationSpaces: false });
}

const PROMPTS = [[11, 12, 13], [21, 22, 23, 24]];
const REPLY = "Hello there, friend";

Deno.test("completions carry each choice's token_ids and prompt_token_ids when return_token_ids is set", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const body = { prompt: PROMPTS, max_tokens: 5, n: 2, temperature: 0, return_token_ids: true };
    const res = await ok<{ choices: CompletionChoice[] }>(await post(url, "/v1/completions", body));
    const choices = byIndex(res.choices);
    assert.equal(choices.length, 4);
    choices.forEach((c, i) => {
      const prompt = PROMPTS[Math.floor(i / 2)]!;
      assert.deepEqual(c.prompt_token_ids, prompt, `choice ${i}`);
      assert.deepEqual(c.token_ids, cyclic(prompt, 5), `choice ${i}`);
      assert.equal(c.text, decode(tok, c.token_ids!), `choice ${i}`);
    });
    // Sampled (seed + i per choice): each choice's own ids, which its text decodes from.
    const sampled = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", { ...body, temperature: 1, seed: 7 }),
    );
    const ids = byIndex(sampled.choices).map((c) => c.token_ids!);
    assert.ok(ids.every((t) => t.length === 5));
    assert.notDeepEqual(ids[0], ids[1], "two samples of one prompt");
    byIndex(sampled.choices).forEach((c) => assert.equal(c.text, decode(tok, c.token_ids!)));
    // A string prompt: the ids the engine got (with the tokenizer's special tokens).
    const text = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", { ...body, prompt: "Hello world", n: 1 }),
    );
    assert.deepEqual(text.choices[0]!.prompt_token_ids, [
      ...engine.requests.at(-1)!.promptTokenIds,
    ]);
    assert.deepEqual(text.choices[0]!.prompt_token_ids, tok.encode("Hello world"));
    // echo with max_tokens 0: the prompt alone, no generated ids (the token made is left out).
    const echoed = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", { ...body, n: 1, echo: true, max_tokens: 0 }),
    );
    byIndex(echoed.choices).forEach((c, i) => {
      assert.deepEqual(c.prompt_token_ids, PROMPTS[i]);
      assert.deepEqual(c.token_ids, []);
    });
    // Off (absent or false): no such fields.
    for (const flag of [undefined, false]) {
      const plain = await ok<{ choices: CompletionChoice[] }>(
        await post(url, "/v1/completions", { ...body, return_token_ids: flag }),
      );
      for (const c of plain.choices) {
        assert.ok(!("token_ids" in c) && !("prompt_token_ids" in c), JSON.stringify(c));
      }
    }
  });
});

Deno.test("streamed completions send each chunk's token_ids and prompt_token_ids in each choice's first chunk", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const body = {
      prompt: PROMPTS,
      max_tokens: 5,
      n: 2,
      temperature: 1,
      seed: 3,
      return_token_ids: true,
    };
    const whole = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", body),
    );
    const events = await chunks<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", { ...body, stream: true }),
    );
    const ids: number[][] = [[], [], [], []];
    const texts = ["", "", "", ""];
    const seen = new Set<number>();
    for (const c of events.flatMap((e) => e.choices)) {
      assert.ok(Array.isArray(c.token_ids), JSON.stringify(c));
      const first = !seen.has(c.index);
      seen.add(c.index);
      assert.equal("prompt_token_ids" in c, first, `choice ${c.index}: ${JSON.stringify(c)}`);
      if (first) assert.deepEqual(c.prompt_token_ids, PROMPTS[Math.floor(c.index / 2)]);
      ids[c.index]!.push(...c.token_ids!);
      texts[c.index] += c.text;
    }
    assert.equal(seen.size, 4);
    byIndex(whole.choices).forEach((c, i) => {
      assert.deepEqual(ids[i], c.token_ids, `choice ${i}`);
      assert.equal(texts[i], c.text, `choice ${i}`);
    });
    // Off: no chunk carries them.
    const plain = await chunks<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", { ...body, return_token_ids: false, stream: true }),
    );
    for (const c of plain.flatMap((e) => e.choices)) {
      assert.ok(!("token_ids" in c) && !("prompt_token_ids" in c), JSON.stringify(c));
    }
  });
});

Deno.test("chat completions carry token_ids per choice and prompt_token_ids at the top level, streamed in the role chunks", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 128, reply: REPLY });
  await withServer(engine, {}, async (url) => {
    const oa = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
    const messages = [{ role: "user" as const, content: "hi" }];
    const body = {
      model: "fake-model",
      messages,
      max_tokens: 6,
      n: 2,
      temperature: 0,
      return_token_ids: true,
    };
    const res = await oa.chat.completions.create(body) as unknown as {
      choices: ChatChoice[];
      prompt_token_ids?: number[];
    };
    const prompt = [...engine.requests.at(-1)!.promptTokenIds];
    const tokenized = await ok<{ tokens: number[] }>(
      await post(url, "/tokenize", { messages }),
    );
    assert.deepEqual(prompt, tokenized.tokens);
    assert.deepEqual(res.prompt_token_ids, prompt);
    const want = cyclic(tok.encode(REPLY, { addSpecialTokens: false }), 6);
    assert.equal(res.choices.length, 2);
    for (const c of res.choices) {
      assert.deepEqual(c.token_ids, want, `choice ${c.index}`);
      assert.ok(!("prompt_token_ids" in c));
      assert.equal(c.message.content, decode(tok, want));
    }
    // Streamed: each role chunk has the prompt's ids, each content chunk its own ids.
    const stream = await oa.chat.completions.create({ ...body, stream: true });
    const ids: number[][] = [[], []];
    let roles = 0;
    for await (const chunk of stream) {
      const raw = chunk as unknown as { choices: ChatChunkChoice[]; prompt_token_ids?: number[] };
      const c = raw.choices[0]!;
      if (c.delta.role !== undefined) {
        roles++;
        assert.deepEqual(raw.prompt_token_ids, prompt);
        assert.ok(!("token_ids" in c), JSON.stringify(c));
      } else {
        assert.ok(!("prompt_token_ids" in raw), JSON.stringify(raw));
        assert.ok(Array.isArray(c.token_ids), JSON.stringify(c));
        ids[c.index]!.push(...c.token_ids!);
      }
    }
    assert.equal(roles, 2);
    assert.deepEqual(ids, [want, want]);
    // Off: nothing added.
    const off = { ...body, n: 1, return_token_ids: false };
    const plain = await oa.chat.completions.create(off);
    assert.ok(!("prompt_token_ids" in plain) && !("token_ids" in plain.choices[0]!));
  });
});

Deno.test("completions write every logprobs token as token_id:<id> when return_tokens_as_token_ids is set", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const body = {
      prompt: PROMPTS,
      max_tokens: 4,
      n: 2,
      temperature: 1,
      seed: 11,
      logprobs: 3,
      return_token_ids: true,
      return_tokens_as_token_ids: true,
    };
    const res = await ok<{ choices: CompletionChoice[] }>(await post(url, "/v1/completions", body));
    const plain = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", { ...body, return_tokens_as_token_ids: false }),
    );
    const asText = byIndex(plain.choices);
    byIndex(res.choices).forEach((c, i) => {
      const lp = c.logprobs!;
      assert.deepEqual(lp.tokens, c.token_ids!.map((id) => `token_id:${id}`), `choice ${i}`);
      // The same logprobs as the text-keyed answer, keyed by id (3 alternatives, the token first).
      const was = asText[i]!.logprobs!;
      assert.deepEqual(lp.token_logprobs, was.token_logprobs);
      lp.top_logprobs.forEach((top, k) => {
        const keys = Object.keys(top!);
        assert.ok(keys.every((key) => /^token_id:\d+$/.test(key)), keys.join());
        assert.equal(top![lp.tokens[k]!], lp.token_logprobs[k]);
        const texts = keys.map((key) => tok.decode([Number(key.slice("token_id:".length))]));
        assert.deepEqual(new Set(texts), new Set(Object.keys(was.top_logprobs[k]!)));
      });
      // text_offset still counts the decoded texts: an offset into the choice's text.
      assert.deepEqual(lp.text_offset, was.text_offset, `choice ${i}`);
      assert.equal(c.text, asText[i]!.text);
    });
    // Streamed, with echo: the echoed prompt's tokens too; the offsets are the text-keyed
    // answer's and, on these one-character tokens (greedy: the prompt repeated), index the text.
    const echo = { ...body, n: 1, temperature: 0, echo: true, prompt_logprobs: 1, stream: true };
    const streamed = async (asIds: boolean) => {
      const events = await chunks<{ choices: CompletionChoice[] }>(
        await post(url, "/v1/completions", { ...echo, return_tokens_as_token_ids: asIds }),
      );
      const out = PROMPTS.map(() => ({
        tokens: [] as string[],
        offsets: [] as number[],
        text: "",
      }));
      for (const c of events.flatMap((e) => e.choices)) {
        out[c.index]!.tokens.push(...c.logprobs!.tokens);
        out[c.index]!.offsets.push(...c.logprobs!.text_offset);
        out[c.index]!.text += c.text;
        // As vLLM: prompt_logprobs keep their decoded_token text (their keys are the ids).
        for (const dict of c.prompt_logprobs ?? []) {
          for (const [id, e] of Object.entries(dict ?? {})) {
            assert.equal(e.decoded_token, tok.decode([Number(id)]));
          }
        }
      }
      return out;
    };
    const byId = await streamed(true);
    const byText = await streamed(false);
    PROMPTS.forEach((prompt, i) => {
      const { tokens, offsets, text } = byId[i]!;
      const ids = [...prompt, ...cyclic(prompt, 4)];
      assert.deepEqual(tokens, ids.map((id) => `token_id:${id}`));
      assert.deepEqual(offsets, byText[i]!.offsets);
      assert.equal(text, byText[i]!.text);
      ids.forEach((id, k) => {
        const piece = tok.decode([id]);
        assert.equal(text.slice(offsets[k], offsets[k]! + piece.length), piece, `token ${k}`);
      });
    });
  });
});

Deno.test("chat logprobs write tokens as token_id:<id> with vLLM's bytes when return_tokens_as_token_ids is set", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 128, reply: REPLY });
  await withServer(engine, {}, async (url) => {
    const body = {
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 4,
      temperature: 0,
      logprobs: true,
      top_logprobs: 2,
      return_tokens_as_token_ids: true,
      return_token_ids: true,
    };
    const utf8 = (s: string) => [...new TextEncoder().encode(s)];
    for (const stream of [false, true]) {
      let content: (ChatTokenLogprob & { top_logprobs: ChatTokenLogprob[] })[] = [];
      let ids: number[] = [];
      if (stream) {
        const events = await chunks<{ choices: ChatChunkChoice[] }>(
          await post(url, "/v1/chat/completions", { ...body, stream: true }),
        );
        for (const c of events.flatMap((e) => e.choices)) {
          content.push(...c.logprobs?.content ?? []);
          ids.push(...c.token_ids ?? []);
        }
      } else {
        const res = await ok<{ choices: ChatChoice[] }>(
          await post(url, "/v1/chat/completions", body),
        );
        content = res.choices[0]!.logprobs!.content;
        ids = res.choices[0]!.token_ids!;
      }
      assert.deepEqual(ids, cyclic(tok.encode(REPLY, { addSpecialTokens: false }), 4));
      assert.deepEqual(content.map((c) => c.token), ids.map((id) => `token_id:${id}`));
      content.forEach((c, k) => {
        // As vLLM: the sampled token's bytes are its text's, its alternatives' their strings'.
        assert.deepEqual(c.bytes, utf8(tok.decode([ids[k]!])), `stream ${stream}`);
        assert.equal(c.top_logprobs.length, 2);
        for (const alt of c.top_logprobs) {
          assert.match(alt.token, /^token_id:\d+$/);
          assert.deepEqual(alt.bytes, utf8(alt.token));
        }
        assert.equal(c.top_logprobs[0]!.token, c.token);
      });
    }
  });
});

Deno.test("completionLogprobs() keeps tokens that decode to the same text apart when asIds is set", () => {
  // Every id decodes to U+FFFD, as lone pieces of multi-byte characters do.
  const engine = { tokenizer: { decode: () => "\uFFFD" } } as unknown as EngineClient;
  const lps = [{
    tokenId: 300,
    logprob: -0.5,
    top: [{ tokenId: 300, logprob: -0.5 }, { tokenId: 301, logprob: -1 }, {
      tokenId: 302,
      logprob: -2,
    }],
  }, { tokenId: 302, logprob: -0.25, top: [] }];
  const byText = completionLogprobs(engine, lps, 5);
  assert.deepEqual(Object.keys(byText.top_logprobs[0]!), ["\uFFFD"]);
  const byId = completionLogprobs(engine, lps, 5, true);
  assert.deepEqual(byId.tokens, ["token_id:300", "token_id:302"]);
  assert.deepEqual(byId.top_logprobs[0], {
    "token_id:300": -0.5,
    "token_id:301": -1,
    "token_id:302": -2,
  });
  // Offsets count the decoded texts (one character each), not the token_id strings.
  assert.deepEqual(byId.text_offset, [5, 6]);
  assert.deepEqual(byId.text_offset, byText.text_offset);
  const chat = chatLogprobs(engine, lps, true);
  assert.deepEqual(chat.content[0]!.top_logprobs.map((t) => t.token), [
    "token_id:300",
    "token_id:301",
    "token_id:302",
  ]);
});

Deno.test("cache_salt reaches the engine for every choice, streamed or not", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 128 });
  await withServer(engine, {}, async (url) => {
    for (const stream of [false, true]) {
      const before = engine.requests.length;
      const res = await post(url, "/v1/completions", {
        prompt: PROMPTS,
        max_tokens: 2,
        n: 2,
        cache_salt: "tenant-a",
        stream,
      });
      assert.equal(res.status, 200, await res.text());
      const sent = engine.requests.slice(before);
      assert.equal(sent.length, 4);
      assert.deepEqual(sent.map((r) => r.cacheSalt), Array(4).fill("tenant-a"));
      const chat = await post(url, "/v1/chat/completions", {
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 2,
        n: 2,
        cache_salt: "tenant-b",
        stream,
      });
      assert.equal(chat.status, 200, await chat.text());
      assert.deepEqual(engine.requests.slice(-2).map((r) => r.cacheSalt), ["tenant-b", "tenant-b"]);
    }
    // Absent or null: no salt (the shared cache).
    for (const salt of [undefined, null]) {
      await ok(
        await post(url, "/v1/completions", { prompt: [1, 2], max_tokens: 1, cache_salt: salt }),
      );
      assert.ok(!("cacheSalt" in engine.requests.at(-1)!));
    }
  });
});

Deno.test("cache_salt that is empty or not a string is a 400 naming it, on both endpoints", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    for (const salt of ["", 5, true, ["a"], { a: 1 }]) {
      for (const path of ["/v1/completions", "/v1/chat/completions"]) {
        const base = path === "/v1/completions"
          ? { prompt: [1, 2], max_tokens: 1 }
          : { messages: [{ role: "user", content: "hi" }], max_tokens: 1 };
        for (const stream of [false, true]) {
          const res = await post(url, path, { ...base, cache_salt: salt, stream });
          const text = await res.text();
          assert.equal(res.status, 400, `${path} ${JSON.stringify(salt)}: ${text}`);
          const err = JSON.parse(text).error;
          assert.equal(err.param, "cache_salt", text);
          assert.match(err.message, /cache_salt/);
          if (salt === "") assert.match(err.message, /non-empty string/);
        }
      }
    }
    assert.equal(engine.requests.length, 0, "nothing reached the engine");
  });
});

Deno.test("return_token_ids and return_tokens_as_token_ids that are not booleans are a 400 naming them", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    for (const field of ["return_token_ids", "return_tokens_as_token_ids"]) {
      const res = await post(url, "/v1/completions", {
        prompt: [1],
        max_tokens: 1,
        [field]: "yes",
      });
      const text = await res.text();
      assert.equal(res.status, 400, text);
      assert.equal(JSON.parse(text).error.param, field);
    }
  });
});

Deno.test("cache_salt keeps prefix-cache hits within one salt on the real engine", async () => {
  // The real engine and scheduler on the mock executor: 4-token blocks, a 17-token prompt (four
  // full blocks that can be cached, the last token always computed).
  const engine = LLMEngine.createMock({
    mockBaseMs: 0,
    mockPerTokenMs: 0,
    blockSize: 4,
    numKvBlocks: 64,
  });
  try {
    await withServer(engine, {}, async (url) => {
      const prompt = Array.from({ length: 17 }, (_, i) => 100 + i);
      /** Prompt tokens the prefix cache served to one request with `salt`. */
      const hits = async (salt: string | undefined): Promise<number> => {
        const before = engine.stats().prefixCacheHits;
        const res = await ok<{ usage: { prompt_tokens: number } }>(
          await post(url, "/v1/completions", { prompt, max_tokens: 1, cache_salt: salt }),
        );
        assert.equal(res.usage.prompt_tokens, 17);
        return engine.stats().prefixCacheHits - before;
      };
      assert.equal(await hits("tenant-a"), 0, "first of salt a");
      assert.equal(await hits("tenant-b"), 0, "same prompt, salt b: no hit");
      assert.equal(await hits(undefined), 0, "same prompt, unsalted: no hit");
      assert.equal(await hits("tenant-a"), 16, "salt a again: its four blocks");
      assert.equal(await hits("tenant-b"), 16, "salt b again");
      assert.equal(await hits(undefined), 16, "unsalted again");
    });
  } finally {
    await engine.shutdown();
  }
});

Deno.test("--return-tokens-as-token-ids makes token_id:<id> the server's default, a request may still say false", async () => {
  const engine = new FakeEngine(await tinyTokenizer(), { maxModelLen: 64 });
  await withServer(engine, { returnTokensAsTokenIds: true }, async (url) => {
    const body = {
      prompt: "ab",
      max_tokens: 3,
      temperature: 0,
      logprobs: 1,
      return_token_ids: true,
    };
    const byDefault = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", body),
    );
    const c = byDefault.choices[0]!;
    assert.deepEqual(c.logprobs!.tokens, c.token_ids!.map((id) => `token_id:${id}`));
    const asked = await ok<{ choices: CompletionChoice[] }>(
      await post(url, "/v1/completions", { ...body, return_tokens_as_token_ids: false }),
    );
    assert.ok(asked.choices[0]!.logprobs!.tokens.every((t) => !t.startsWith("token_id:")));
  });
  assert.equal(
    serveSettingsFromFlags({ "return-tokens-as-token-ids": true }, () => undefined).server
      .returnTokensAsTokenIds,
    true,
  );
});
