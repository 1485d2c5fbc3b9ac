/**
 * Request fields outside the server's schemas: OpenAI's and vLLM's fields that the server does
 * not implement are a 400 naming them unless they hold their default; any other field is
 * ignored (as vLLM does) and logged once per name.
 */

import assert from "node:assert/strict";
import {
  chatRequestSchema,
  completionRequestSchema,
  UNIMPLEMENTED_FIELDS,
  unlistedFields,
} from "../server/protocol.ts";
import { MAX_REPORTED_IGNORED_FIELDS } from "../server/context.ts";
import { FakeEngine, tinyTokenizer, withServer } from "./support/fake_engine.ts";
import { makeModel } from "../tools/make_model.ts";
import { Tokenizer } from "../engine/tokenizer.ts";
import { post } from "./support/http.ts";

const messages = [{ role: "user", content: "hi" }];

Deno.test("unlistedFields() rejects an unimplemented field set to more than its default", () => {
  const cases: [string, unknown][] = [
    ["use_beam_search", true],
    ["chat_template", "{{ messages }}"],
    ["logits_processors", ["my.module.Processor"]],
    ["modalities", ["text", "audio"]],
  ];
  for (const [name, value] of cases) {
    assert.throws(
      () => unlistedFields(chatRequestSchema, { messages, [name]: value }),
      (e: unknown) => {
        const err = e as { status: number; param: string; code: string; message: string };
        assert.equal(err.status, 400, name);
        assert.equal(err.param, name);
        assert.equal(err.code, "unsupported_parameter");
        assert.match(
          err.message,
          new RegExp(`^Unsupported parameter: '${name}': this server does not implement .+$`),
        );
        return true;
      },
    );
  }
});

Deno.test("unlistedFields() lets default values of unimplemented fields through and lists unknown ones", () => {
  const body = {
    messages,
    temperature: 0,
    use_beam_search: false,
    skip_special_tokens: true,
    modalities: ["text"],
    store: true,
    metadata: { a: "b" },
    frobnicate: 1,
  };
  assert.deepEqual(unlistedFields(chatRequestSchema, body), ["store", "metadata", "frobnicate"]);
  // Not an object: nothing here (the schema's own 400 names the problem).
  assert.deepEqual(unlistedFields(chatRequestSchema, [1]), []);
  assert.deepEqual(unlistedFields(chatRequestSchema, "x"), []);
});

Deno.test("UNIMPLEMENTED_FIELDS names no field the request schemas accept", () => {
  for (const name of Object.keys(UNIMPLEMENTED_FIELDS)) {
    assert.ok(!(name in chatRequestSchema.shape), name);
    assert.ok(!(name in completionRequestSchema.shape), name);
  }
});

Deno.test("POST /v1/chat/completions answers 400 for use_beam_search and logs unknown fields once", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  const warnings: string[] = [];
  await withServer(engine, { onWarning: (m) => warnings.push(m) }, async (url) => {
    const CH = "/v1/chat/completions";
    const rejected = await post(url, CH, { messages, max_tokens: 2, use_beam_search: true });
    const err = (await rejected.json()).error;
    assert.equal(rejected.status, 400);
    assert.equal(err.param, "use_beam_search");
    assert.equal(err.code, "unsupported_parameter");
    assert.equal(engine.requests.length, 0, "nothing reached the engine");
    for (let i = 0; i < 2; i++) {
      const ok = await post(url, CH, { messages, max_tokens: 2, store: true, frobnicate: i });
      assert.equal(ok.status, 200, await ok.text());
    }
    const done = await post(url, "/v1/completions", { prompt: "a", max_tokens: 1, metadata: {} });
    assert.equal(done.status, 200, await done.text());
  });
  assert.deepEqual(warnings, [
    "Request fields ignored (not part of this server's API; reported once each): store, frobnicate",
    "Request fields ignored (not part of this server's API; reported once each): metadata",
  ]);
});

Deno.test("POST /v1/completions passes include_stop_str_in_output and allowed_token_ids to the engine and checks them", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const C = "/v1/completions";
    const ok = await post(url, C, {
      prompt: "a",
      max_tokens: 2,
      stop: ["x"],
      include_stop_str_in_output: true,
    });
    assert.equal(ok.status, 200, await ok.text());
    assert.equal(engine.requests.at(-1)?.params.includeStopStrInOutput, true);
    const plain = await post(url, C, { prompt: "a", max_tokens: 2 });
    assert.equal(plain.status, 200, await plain.text());
    assert.equal(engine.requests.at(-1)?.params.includeStopStrInOutput, false);
    assert.equal(engine.requests.at(-1)?.params.allowedTokenIds, null);
    const allowed = await post(url, C, { prompt: "a", max_tokens: 2, allowed_token_ids: [3, 4] });
    assert.equal(allowed.status, 200, await allowed.text());
    assert.deepEqual(engine.requests.at(-1)?.params.allowedTokenIds, [3, 4]);
    assert.equal(engine.requests.at(-1)?.params.skipSpecialTokens, true);
    const special = await post(url, C, { prompt: "a", max_tokens: 2, skip_special_tokens: false });
    assert.equal(special.status, 200, await special.text());
    assert.equal(engine.requests.at(-1)?.params.skipSpecialTokens, false);
    const banned = await post(url, C, { prompt: "a", max_tokens: 2, bad_words: ["no", "never"] });
    assert.equal(banned.status, 200, await banned.text());
    assert.deepEqual(engine.requests.at(-1)?.params.badWords, ["no", "never"]);
    const blank = await post(url, C, { prompt: "a", bad_words: ["ok", " "] });
    assert.equal(blank.status, 400);
    assert.equal((await blank.json()).error.param, "bad_words.1");
    const outside = await post(url, C, { prompt: "a", allowed_token_ids: [3, 99999] });
    assert.equal(outside.status, 400);
    assert.equal((await outside.json()).error.param, "allowed_token_ids.1");
    const bad = await post(url, C, { prompt: "a", include_stop_str_in_output: "yes" });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.param, "include_stop_str_in_output");
  });
});

Deno.test("truncate_prompt_tokens keeps the last k prompt tokens, as vLLM does", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const C = "/v1/completions";
    const ids = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20];
    const cut = await post(url, C, { prompt: ids, max_tokens: 1, truncate_prompt_tokens: 3 });
    assert.equal(cut.status, 200, await cut.text());
    assert.deepEqual(engine.requests.at(-1)?.promptTokenIds, [18, 19, 20]);
    // Shorter than k, and -1 (max_model_len): the prompt as it is.
    for (const k of [10, 50, -1]) {
      const same = await post(url, C, { prompt: ids, max_tokens: 1, truncate_prompt_tokens: k });
      assert.equal(same.status, 200, await same.text());
      assert.deepEqual(engine.requests.at(-1)?.promptTokenIds, ids, `k = ${k}`);
    }
    // Every prompt of a list is truncated.
    const list = await post(url, C, {
      prompt: [ids, [7, 8]],
      max_tokens: 1,
      truncate_prompt_tokens: 1,
    });
    assert.equal(list.status, 200, await list.text());
    assert.deepEqual(engine.requests.slice(-2).map((r) => r.promptTokenIds), [[20], [8]]);
    // Chat: the templated prompt's last tokens.
    const full = await post(url, "/v1/chat/completions", { messages, max_tokens: 1 });
    assert.equal(full.status, 200, await full.text());
    const chatIds = engine.requests.at(-1)!.promptTokenIds;
    const chat = await post(url, "/v1/chat/completions", {
      messages,
      max_tokens: 1,
      truncate_prompt_tokens: 4,
    });
    assert.equal(chat.status, 200, await chat.text());
    assert.deepEqual(engine.requests.at(-1)?.promptTokenIds, chatIds.slice(-4));
    for (const k of [0, -2, 65]) {
      const bad = await post(url, C, { prompt: ids, max_tokens: 1, truncate_prompt_tokens: k });
      assert.equal(bad.status, 400, `k = ${k}`);
      assert.equal((await bad.json()).error.param, "truncate_prompt_tokens");
    }
  });
});

Deno.test("continue_final_message leaves the final message open in chat and /tokenize, not with add_generation_prompt", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 256 });
  await withServer(engine, {}, async (url) => {
    const prefilled = [...messages, { role: "assistant", content: "Sure: " }];
    const expected = tok.encode(
      tok.applyChatTemplate(prefilled, { continueFinalMessage: true }),
      { addSpecialTokens: false },
    );
    const body = { messages: prefilled, continue_final_message: true };
    const chat = await post(url, "/v1/chat/completions", {
      ...body,
      add_generation_prompt: false,
      max_tokens: 1,
    });
    assert.equal(chat.status, 200, await chat.text());
    assert.deepEqual(engine.requests.at(-1)?.promptTokenIds, expected);
    const counted = await post(url, "/tokenize", { ...body, add_generation_prompt: false });
    assert.deepEqual((await counted.json()).tokens, expected);
    // add_generation_prompt defaults to true, as in vLLM: both at once is a 400.
    for (const path of ["/v1/chat/completions", "/tokenize"]) {
      const both = await post(url, path, body);
      assert.equal(both.status, 400, path);
      assert.equal((await both.json()).error.param, "continue_final_message", path);
    }
  });
});

Deno.test("ignored field names are reported up to MAX_REPORTED_IGNORED_FIELDS, then no more", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  const warnings: string[] = [];
  await withServer(engine, { onWarning: (m) => warnings.push(m) }, async (url) => {
    for (let batch = 0; batch < 3; batch++) {
      const extra = Object.fromEntries(
        Array.from({ length: 100 }, (_, i) => [`f${batch}_${i}`, 1]),
      );
      const r = await post(url, "/v1/completions", { prompt: "a", max_tokens: 1, ...extra });
      assert.equal(r.status, 200, await r.text());
    }
  });
  const names = warnings.flatMap((w) => w.split(": ")[1]!.split("; ")[0]!.split(", "));
  assert.equal(names.length, MAX_REPORTED_IGNORED_FIELDS);
  assert.equal(warnings.length, 3);
  assert.match(warnings[2]!, new RegExp(`; ${MAX_REPORTED_IGNORED_FIELDS} names reported`));
});

Deno.test("add_special_tokens decides whether a string prompt gets BOS, as in /tokenize", async () => {
  const dir = await Deno.makeTempDir({ prefix: "bos_tok_" });
  try {
    await makeModel({ out: dir, preset: "tiny-llama", dtype: "f16" });
    const tok = await Tokenizer.fromDir(dir);
    const bos = tok.bosTokenId!;
    const engine = new FakeEngine(tok, { maxModelLen: 64 });
    await withServer(engine, {}, async (url) => {
      const bare = tok.encode("hello world", { addSpecialTokens: false });
      assert.notEqual(bare[0], bos);
      const cases: [boolean | undefined, number[]][] = [
        [undefined, [bos, ...bare]],
        [true, [bos, ...bare]],
        [false, bare],
      ];
      for (const [add, want] of cases) {
        const body = { prompt: "hello world", max_tokens: 1, add_special_tokens: add };
        const res = await post(url, "/v1/completions", body);
        assert.equal(res.status, 200, await res.text());
        assert.deepEqual(engine.requests.at(-1)?.promptTokenIds, want, `completions, ${add}`);
        const list = await post(url, "/v1/completions", { ...body, prompt: ["hello world"] });
        assert.equal(list.status, 200, await list.text());
        assert.deepEqual(engine.requests.at(-1)?.promptTokenIds, want, `list, ${add}`);
        const counted = await post(url, "/tokenize", {
          prompt: "hello world",
          add_special_tokens: add,
        });
        assert.deepEqual((await counted.json()).tokens, want, `/tokenize, ${add}`);
      }
      // Chat: the template writes BOS itself; add_special_tokens: true adds the tokenizer's
      // before it, as transformers (and so vLLM) do.
      for (const add of [undefined, false, true]) {
        const res = await post(url, "/v1/chat/completions", {
          messages,
          max_tokens: 1,
          add_special_tokens: add,
        });
        assert.equal(res.status, 200, await res.text());
        const ids = engine.requests.at(-1)!.promptTokenIds;
        assert.equal(ids[0], bos, `chat, ${add}`);
        assert.equal(ids[1] === bos, add === true, `chat, ${add}`);
      }
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("/tokenize answers each token's vocabulary string when return_token_strs is set", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const plain = await (await post(url, "/tokenize", { prompt: "hello world" })).json();
    assert.equal(plain.token_strs, undefined);
    const res = await post(url, "/tokenize", { prompt: "hello world", return_token_strs: true });
    assert.equal(res.status, 200);
    const body = await res.json();
    assert.equal(body.token_strs.length, body.tokens.length);
    body.tokens.forEach((id: number, i: number) => {
      assert.equal(body.token_strs[i], tok.idToToken(id));
      assert.equal(typeof body.token_strs[i], "string");
    });
    // Chat messages too (through the template).
    const chat = await post(url, "/tokenize", { messages, return_token_strs: true });
    const c = await chat.json();
    assert.deepEqual(c.token_strs, c.tokens.map((id: number) => tok.idToToken(id)));
    const bad = await post(url, "/tokenize", { prompt: "x", return_token_strs: "yes" });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.param, "return_token_strs");
  });
});
