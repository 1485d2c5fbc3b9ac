/**
 * Tool-call parsing (server/tools.ts): the Hermes / Qwen `<tool_call>` blocks of an answer become
 * OpenAI `tool_calls`, whole or streamed in pieces of any size (the deltas' arguments concatenate
 * to the same string), and a block that is not a call stays content.
 */

import assert from "node:assert/strict";
import { parseToolCalls, ToolCallStream } from "../server/tools.ts";

const ANSWER =
  'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n' +
  '</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>';

Deno.test("parseToolCalls() turns <tool_call> blocks into tool_calls and keeps the text before as content", () => {
  const r = parseToolCalls(ANSWER);
  assert.equal(r.content, "Let me check.");
  assert.deepEqual(r.calls.map((c) => [c.type, c.function.name, c.function.arguments]), [
    ["function", "get_weather", '{"city":"Oslo"}'],
    ["function", "now", "{}"],
  ]);
  assert.ok(r.calls.every((c) => /^call_[0-9a-f]{24}$/.test(c.id)));
  assert.equal(parseToolCalls("<tool_call>{}</tool_call>").calls.length, 0);
  assert.equal(
    parseToolCalls("<tool_call>not json</tool_call>").content,
    "<tool_call>not json</tool_call>",
  );
  assert.deepEqual(parseToolCalls("plain"), { content: "plain", calls: [] });
  assert.equal(parseToolCalls('<tool_call>{"name": "f"}</tool_call>').content, null);
});

Deno.test("ToolCallStream sends the same content and calls whatever the pieces", () => {
  for (const size of [1, 2, 3, 7, 16, 1000]) {
    const s = new ToolCallStream();
    let content = "";
    const calls: { id?: string; name?: string; args: string }[] = [];
    for (let i = 0; i < ANSWER.length; i += size) {
      const out = s.push(ANSWER.slice(i, i + size));
      content += out.content;
      for (const d of out.toolCalls) {
        calls[d.index] ??= { args: "" };
        if (d.id !== undefined) calls[d.index]!.id = d.id;
        if (d.function.name !== undefined) calls[d.index]!.name = d.function.name;
        calls[d.index]!.args += d.function.arguments;
      }
    }
    content += s.finish();
    assert.equal(content, "Let me check. ", `pieces of ${size}`);
    assert.deepEqual(calls.map((c) => [c.name, c.args]), [
      ["get_weather", '{"city":"Oslo"}'],
      ["now", "{}"],
    ]);
    assert.equal(s.calls, 2);
  }
  // Cut short: the unfinished block is content.
  const cut = new ToolCallStream();
  const a = cut.push('<tool_call>\n{"name": "f", "argu');
  assert.deepEqual(a, { content: "", toolCalls: [] });
  assert.equal(cut.finish(), '<tool_call>\n{"name": "f", "argu');
});
