/**
 * `--reasoning-parser qwen3` (server/reasoning.ts): the split of an answer into reasoning and
 * content is the same whole or streamed in pieces of any size.
 */

import assert from "node:assert/strict";
import { ReasoningStream, splitReasoning } from "../server/reasoning.ts";

const CASES: [string, string | null, string | null][] = [
  ["<think>\nabc\n</think>\n\nhello", "abc", "hello"],
  ["<think>\n\n</think>\n\nhi", "", "hi"],
  ["<think>reason only, cut short", "reason only, cut short", null],
  ["no thinking here", null, "no thinking here"],
  ["  <think>x</think>y", "x", "y"],
  ["<thinking is not a tag", null, "<thinking is not a tag"],
  ["<think>a </thi b</think>c </think> d", "a </thi b", "c </think> d"],
  ["", null, ""],
  ["<", null, "<"],
];

Deno.test("splitReasoning() separates Qwen3's <think> block from the answer", () => {
  for (const [text, reasoning, content] of CASES) {
    assert.deepEqual(splitReasoning(text), { reasoning, content }, JSON.stringify(text));
  }
});

Deno.test("ReasoningStream gives the same split whatever the pieces", () => {
  for (const [text, reasoning, content] of CASES) {
    for (const size of [1, 2, 3, 5, 8]) {
      const s = new ReasoningStream();
      let r = "";
      let c = "";
      for (let i = 0; i < text.length; i += size) {
        const out = s.push(text.slice(i, i + size));
        r += out.reasoning;
        c += out.content;
      }
      const end = s.finish();
      r += end.reasoning;
      c += end.content;
      const label = `${JSON.stringify(text)} in pieces of ${size}`;
      assert.equal(s.sawReasoning ? r : null, reasoning, label);
      assert.equal(c === "" && s.sawReasoning ? null : c, content, label);
    }
  }
});

Deno.test("--reasoning-parser qwen3 returns reasoning_content in the message and in stream deltas", async () => {
  const { FakeEngine, tinyTokenizer, withServer } = await import("./support/fake_engine.ts");
  const tok = await tinyTokenizer();
  const reply = "<think>\nweigh the options\n</think>\n\nthe answer";
  const engine = new FakeEngine(tok, { reply });
  const n = tok.encode(reply, { addSpecialTokens: false }).length;
  const body = (stream: boolean, extra: object = {}) =>
    JSON.stringify({
      messages: [{ role: "user", content: "why?" }],
      max_tokens: n,
      temperature: 0,
      stream,
      ...extra,
    });
  const post = (url: string, b: string) =>
    fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: b,
    });
  await withServer(engine, { reasoningParser: "qwen3" }, async (url) => {
    const plain = await (await post(url, body(false))).json();
    assert.deepEqual(plain.choices[0].message, {
      role: "assistant",
      content: "the answer",
      reasoning_content: "weigh the options",
    });
    const events = (await (await post(url, body(true))).text()).split("\n\n")
      .filter((e) => e.startsWith("data: {")).map((e) => JSON.parse(e.slice(6)));
    const deltas = events.flatMap((e) => e.choices.map((c: { delta: object }) => c.delta));
    const join = (key: string) => deltas.map((d: Record<string, string>) => d[key] ?? "").join("");
    assert.equal(join("reasoning_content"), "weigh the options");
    assert.equal(join("content"), "the answer");
    // With a grammar, the model thinks freely first: it applies after "</think>" (none when
    // thinking is off).
    for (const [kwargs, after] of [[{}, "</think>"], [{ enable_thinking: false }, null]] as const) {
      const constrained = await post(
        url,
        body(false, { response_format: { type: "json_object" }, chat_template_kwargs: kwargs }),
      );
      assert.equal(constrained.status, 200);
      await constrained.body?.cancel();
      assert.equal(engine.requests.at(-1)!.params.structuredOutputAfter, after);
    }
  });
  // Without the parser the text is returned as it is.
  await withServer(engine, {}, async (url) => {
    const plain = await (await post(url, body(false))).json();
    assert.deepEqual(plain.choices[0].message, { role: "assistant", content: reply });
  });
});

Deno.test("serve --reasoning-parser accepts qwen3 and refuses other names in one line", async () => {
  const { serveSettingsFromFlags } = await import("../cli/serve_flags.ts");
  const env = () => undefined;
  assert.equal(
    serveSettingsFromFlags({ "reasoning-parser": "qwen3" }, env).server.reasoningParser,
    "qwen3",
  );
  assert.equal(serveSettingsFromFlags({}, env).server.reasoningParser, null);
  assert.throws(
    () => serveSettingsFromFlags({ "reasoning-parser": "deepseek" }, env),
    /--reasoning-parser expects one of qwen3, got "deepseek"/,
  );
});

Deno.test("a grammar that starts after </think> leaves the reasoning free, then masks", async () => {
  const { tinyTokenizer } = await import("./support/fake_engine.ts");
  const { StructuredOutputs } = await import("../engine/structured_output/structured_outputs.ts");
  const tok = await tinyTokenizer();
  const so = new StructuredOutputs(tok, tok.size, [tok.eosTokenId ?? 0]);
  await so.admit("r", { kind: "choice", choices: ["yes", "no"] }, "p", "</think>");
  const step = { scheduled: [{ requestId: "r", samplesToken: true }] } as never;
  assert.equal(so.masks(step), undefined, "no mask while thinking");
  // Free text, including what the grammar would refuse, then the closing tag in pieces.
  so.accept("r", tok.encode("hmm, maybe </thi", { addSpecialTokens: false }));
  await so.settled();
  assert.ok(so.ready("r"));
  assert.equal(so.masks(step), undefined);
  so.accept("r", tok.encode("nk>", { addSpecialTokens: false }));
  await so.settled();
  const mask = so.masks(step)!.get("r")!;
  const allowed = [...Array(tok.size).keys()].filter((t) => (mask[t >> 5]! >>> (t & 31)) & 1);
  assert.ok(allowed.length > 0 && allowed.length < 10, `${allowed.length} tokens allowed`);
  for (const t of allowed) {
    assert.ok(
      ["y", "n", "yes", "no", "ye"].some((w) => w.startsWith(tok.decode([t]))),
      tok.decode([t]),
    );
  }
  so.close();
});
