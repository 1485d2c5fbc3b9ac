/**
 * `POST /v1/responses` (OpenAI's Responses API on the chat path, server/responses.ts) with the
 * openai SDK against the deterministic fake engine: the answer is the chat path's for the same
 * chat request (same prompt, same text), streamed as OpenAI's events, with function tools,
 * reasoning, logprobs, `max_output_tokens` and the 400s that name the Responses field.
 */

import assert from "node:assert/strict";
// deno-lint-ignore no-import-prefix
import OpenAI from "npm:openai@7.57.0";
import { Tokenizer } from "../engine/tokenizer.ts";
import { createHandler } from "../server/server.ts";
import { makeModel } from "../tools/make_model.ts";
import { FakeEngine, tinyTokenizer, withServer } from "./support/fake_engine.ts";
import { post } from "./support/http.ts";

function client(url: string): OpenAI {
  return new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
}

/** The raw events of a streamed `/v1/responses` answer: `event:` name and parsed data. */
async function rawEvents(res: Response) {
  const text = await res.text();
  return text.split("\n\n").filter((e) => e !== "").map((block) => {
    const lines = block.split("\n");
    assert.ok(lines[0]!.startsWith("event: "), block);
    assert.ok(lines[1]!.startsWith("data: "), block);
    return { event: lines[0]!.slice(7), data: JSON.parse(lines[1]!.slice(6)) };
  });
}

/**
 * A tokenizer whose chat template shows everything a request can reach it with: the tools'
 * names, each message's role, reasoning, content, tool calls and tool call id, and
 * `reasoning_effort`.
 */
async function showingTokenizer(): Promise<Tokenizer> {
  const dir = await Deno.makeTempDir({ prefix: "responses_tok_" });
  try {
    await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f16" });
    await Deno.writeTextFile(
      `${dir}/chat_template.jinja`,
      "{%- if tools %}[tools:{% for t in tools %} {{ t.function.name }}{% endfor %}]\n{% endif %}" +
        "{%- if reasoning_effort %}[effort: {{ reasoning_effort }}]\n{% endif %}" +
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n" +
        "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}" +
        "{{ m.content }}" +
        "{%- if m.tool_calls %}{% for c in m.tool_calls %}" +
        "[call {{ c.id }} {{ c.function.name }} {{ c.function.arguments | tojson }}]" +
        "{% endfor %}{% endif %}" +
        "{%- if m.tool_call_id %}[result of {{ m.tool_call_id }}]{% endif %}<|im_end|>\n" +
        "{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    );
    return await Tokenizer.fromDir(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** The prompt of the engine's last request, decoded. */
function lastPrompt(engine: FakeEngine, tok: Tokenizer): string {
  return tok.decode(engine.requests.at(-1)!.promptTokenIds, { skipSpecialTokens: false });
}

Deno.test("responses.create() answers the chat path's text as one output_text message when input is a string", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 128 });
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const chat = await oa.chat.completions.create({
      model: "fake-model",
      messages: [{ role: "user", content: "Hello there" }],
      temperature: 0,
      max_completion_tokens: 40,
    });
    const chatPrompt = engine.requests.at(-1)!.promptTokenIds;
    const r = await oa.responses.create({
      model: "fake-model",
      input: "Hello there",
      temperature: 0,
      max_output_tokens: 40,
    });
    assert.deepEqual(engine.requests.at(-1)!.promptTokenIds, chatPrompt);
    assert.equal(r.output_text, chat.choices[0]!.message.content);
    assert.match(r.id, /^resp_[0-9a-f]{32}$/);
    assert.equal(r.object, "response");
    assert.equal(r.status, "completed");
    assert.equal(r.incomplete_details, null);
    assert.equal(r.model, "fake-model");
    assert.equal(r.output.length, 1);
    const item = r.output[0]!;
    assert.equal(item.type, "message");
    if (item.type !== "message") return;
    assert.match(item.id, /^msg_[0-9a-f]{32}$/);
    assert.equal(item.role, "assistant");
    assert.equal(item.status, "completed");
    assert.deepEqual(item.content, [{
      type: "output_text",
      text: chat.choices[0]!.message.content,
      annotations: [],
      logprobs: [],
    }]);
    assert.deepEqual(r.usage, {
      input_tokens: chat.usage!.prompt_tokens,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: chat.usage!.completion_tokens,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: chat.usage!.total_tokens,
    });
    // The request's settings are echoed; nothing is stored.
    assert.equal(r.temperature, 0);
    assert.equal(r.top_p, 1);
    assert.equal(r.max_output_tokens, 40);
    assert.equal(r.tool_choice, "auto");
    assert.deepEqual(r.tools, []);
    assert.equal(r.parallel_tool_calls, true);
    assert.equal((r as unknown as { store: boolean }).store, false);
    assert.deepEqual(r.text, { format: { type: "text" }, verbosity: "medium" });
  });
});

Deno.test("responses.create() streams OpenAI's events in order when stream is true", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 128 });
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const body = { model: "fake-model", input: "Stream me", temperature: 0, max_output_tokens: 12 };
    const plain = await oa.responses.create({ ...body, max_output_tokens: 100 });
    const stream = await oa.responses.create({ ...body, max_output_tokens: 100, stream: true });
    const events = [];
    for await (const e of stream) events.push(e);
    const types = events.map((e) => e.type);
    const deltas = types.filter((t) => t === "response.output_text.delta").length;
    assert.ok(deltas > 1, `${deltas} deltas`);
    assert.deepEqual(types, [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      ...Array(deltas).fill("response.output_text.delta"),
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
    const text = events.map((e) => e.type === "response.output_text.delta" ? e.delta : "").join(
      "",
    );
    assert.equal(text, plain.output_text);
    const created = events[0]!;
    const completed = events.at(-1)!;
    assert.ok(created.type === "response.created" && completed.type === "response.completed");
    assert.equal(created.response.status, "in_progress");
    assert.deepEqual(created.response.output, []);
    assert.equal(completed.response.id, created.response.id);
    assert.equal(completed.response.status, "completed");
    const added = events[2]!;
    assert.ok(added.type === "response.output_item.added");
    assert.deepEqual(completed.response.output, [
      {
        type: "message",
        id: added.item.id,
        role: "assistant",
        status: "completed",
        content: [{ type: "output_text", text, annotations: [], logprobs: [] }],
      },
    ]);
    assert.equal(completed.response.usage!.output_tokens, plain.usage!.output_tokens);
    // The SDK's stream helper accepts the events (it checks the items' identities).
    const final = await oa.responses.stream({ ...body, max_output_tokens: 100 }).finalResponse();
    assert.equal(final.output_text, text);
    assert.equal(final.status, "completed");
  });
});

Deno.test("responses.create() says incomplete with reason max_output_tokens when the budget runs out", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 128 });
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const body = {
      model: "fake-model",
      input: "Count to ten",
      temperature: 0,
      max_output_tokens: 3,
    };
    const r = await oa.responses.create(body);
    assert.equal(engine.requests.at(-1)!.params.maxTokens, 3);
    assert.equal(r.status, "incomplete");
    assert.deepEqual(r.incomplete_details, { reason: "max_output_tokens" });
    assert.equal(r.usage!.output_tokens, 3);
    assert.equal(r.output[0]!.type === "message" && r.output[0]!.status, "incomplete");
    const events = await rawEvents(await post(url, "/v1/responses", { ...body, stream: true }));
    const last = events.at(-1)!;
    assert.equal(last.event, "response.incomplete");
    assert.equal(last.data.type, "response.incomplete");
    assert.equal(last.data.response.status, "incomplete");
    assert.deepEqual(last.data.response.incomplete_details, { reason: "max_output_tokens" });
    assert.equal(last.data.response.output[0].status, "incomplete");
    // Every event is named by its type.
    assert.ok(events.every((e) => e.event === e.data.type));
    // A full answer is complete.
    const full = await oa.responses.create({ ...body, max_output_tokens: 100 });
    assert.equal(full.status, "completed");
  });
});

Deno.test("responses.create() renders instructions and input items as the equivalent chat messages", async () => {
  const tok = await showingTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 512 });
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    await oa.chat.completions.create({
      model: "fake-model",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "developer", content: "Answer in English." },
        { role: "user", content: "Hi, who are you?" },
        { role: "assistant", content: "A model." },
        { role: "user", content: "And now?" },
      ],
      temperature: 0,
      max_completion_tokens: 2,
    });
    const chatPrompt = lastPrompt(engine, tok);
    await oa.responses.create({
      model: "fake-model",
      instructions: "Be brief.",
      input: [
        { role: "developer", content: "Answer in English." },
        {
          type: "message",
          role: "user",
          content: [{ type: "input_text", text: "Hi, " }, {
            type: "input_text",
            text: "who are you?",
          }],
        },
        {
          type: "message",
          id: "msg_1",
          role: "assistant",
          status: "completed",
          content: [{ type: "output_text", text: "A model.", annotations: [] }],
        },
        { role: "user", content: "And now?" },
      ],
      temperature: 0,
      max_output_tokens: 2,
    });
    assert.equal(lastPrompt(engine, tok), chatPrompt);
    assert.match(
      chatPrompt,
      /^<\|im_start\|>system\nBe brief\.<\|im_end\|>\n<\|im_start\|>developer/,
    );
    // An assistant message passed back incomplete is continued (vLLM's continue_final_message).
    await oa.responses.create({
      model: "fake-model",
      input: [
        { role: "user", content: "Say hello" },
        {
          type: "message",
          id: "msg_2",
          role: "assistant",
          status: "incomplete",
          content: [{ type: "output_text", text: "Hel", annotations: [] }],
        },
      ],
      temperature: 0,
      max_output_tokens: 2,
    });
    assert.ok(
      lastPrompt(engine, tok).endsWith("<|im_start|>assistant\nHel"),
      lastPrompt(engine, tok),
    );
  });
});

/** A reply that calls a tool, then ends (EOS). */
const CALL_REPLY =
  'Checking. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n' +
  "</tool_call><|im_end|>";

const WEATHER_TOOL = {
  type: "function" as const,
  name: "get_weather",
  description: "The weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  strict: true,
};

Deno.test("responses.create() answers a function_call item when the model calls a function tool", async () => {
  const tok = await showingTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 512, reply: CALL_REPLY });
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const body = {
      model: "fake-model",
      input: "Weather in Oslo?",
      tools: [WEATHER_TOOL],
      temperature: 0,
      max_output_tokens: 200,
    };
    const r = await oa.responses.create(body);
    assert.match(lastPrompt(engine, tok), /^\[tools: get_weather\]/);
    assert.equal(r.status, "completed");
    assert.deepEqual(r.output.map((o) => o.type), ["message", "function_call"]);
    assert.equal(r.output_text, "Checking.");
    const call = r.output[1]!;
    assert.ok(call.type === "function_call");
    assert.match(call.id!, /^fc_[0-9a-f]{32}$/);
    assert.match(call.call_id, /^call_[0-9a-f]{24}$/);
    assert.equal(call.name, "get_weather");
    assert.deepEqual(JSON.parse(call.arguments), { city: "Oslo" });
    assert.equal(call.status, "completed");
    assert.deepEqual(r.tools, [{ ...WEATHER_TOOL }]);
    // tool_choice by name reaches the chat path's grammar (only that function).
    await oa.responses.create({ ...body, tool_choice: { type: "function", name: "get_weather" } });
    const spec = engine.requests.at(-1)!.params.structuredOutput;
    assert.ok(spec?.kind === "tool_calls");
    assert.deepEqual(spec.tools.map((t) => t.name), ["get_weather"]);
    // Streamed: the text item, then the call's arguments as function_call_arguments events.
    const stream = await oa.responses.create({ ...body, stream: true });
    const events = [];
    for await (const e of stream) events.push(e);
    const types = events.map((e) => e.type).filter((t) => t !== "response.output_text.delta");
    assert.deepEqual(types, [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    const done = events.find((e) => e.type === "response.function_call_arguments.done");
    assert.ok(done?.type === "response.function_call_arguments.done");
    assert.deepEqual(JSON.parse(done.arguments), { city: "Oslo" });
    const completed = events.at(-1)!;
    assert.ok(completed.type === "response.completed");
    assert.deepEqual(completed.response.output.map((o) => o.type), ["message", "function_call"]);
  });
});

Deno.test("responses.create() leaves whitespace before a function call out of the output, streamed or not", async () => {
  const tok = await tinyTokenizer();
  const reply = '\n\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call><|im_end|>';
  const engine = new FakeEngine(tok, { maxModelLen: 256, reply });
  await withServer(engine, {}, async (url) => {
    const body = {
      input: "Weather?",
      tools: [WEATHER_TOOL],
      temperature: 0,
      max_output_tokens: 100,
    };
    const plain = await (await post(url, "/v1/responses", body)).json();
    assert.deepEqual(plain.output.map((o: { type: string }) => o.type), ["function_call"]);
    const events = await rawEvents(await post(url, "/v1/responses", { ...body, stream: true }));
    const final = events.at(-1)!.data.response;
    assert.deepEqual(final.output.map((o: { type: string }) => o.type), ["function_call"]);
    assert.equal(final.output[0].arguments, "{}");
  });
});

Deno.test("responses.create() passes function_call and function_call_output items to the template as tool_calls and a tool message", async () => {
  const tok = await showingTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 512 });
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    await oa.chat.completions.create({
      model: "fake-model",
      messages: [
        { role: "user", content: "Weather in Oslo?" },
        {
          role: "assistant",
          content: "",
          tool_calls: [{
            id: "call_1",
            type: "function",
            function: { name: "get_weather", arguments: '{"city":"Oslo"}' },
          }, {
            id: "call_2",
            type: "function",
            function: { name: "get_weather", arguments: '{"city":"Bergen"}' },
          }],
        },
        { role: "tool", tool_call_id: "call_1", content: "12 C" },
        { role: "tool", tool_call_id: "call_2", content: "9 C" },
      ],
      tools: [{
        type: "function",
        function: {
          name: WEATHER_TOOL.name,
          description: WEATHER_TOOL.description,
          parameters: WEATHER_TOOL.parameters,
          strict: true,
        },
      }],
      temperature: 0,
      max_completion_tokens: 2,
    });
    const chatPrompt = lastPrompt(engine, tok);
    await oa.responses.create({
      model: "fake-model",
      input: [
        { role: "user", content: "Weather in Oslo?" },
        {
          type: "function_call",
          call_id: "call_1",
          name: "get_weather",
          arguments: '{"city":"Oslo"}',
        },
        {
          type: "function_call",
          call_id: "call_2",
          name: "get_weather",
          arguments: '{"city":"Bergen"}',
        },
        { type: "function_call_output", call_id: "call_1", output: "12 C" },
        { type: "function_call_output", call_id: "call_2", output: "9 C" },
      ],
      tools: [WEATHER_TOOL],
      temperature: 0,
      max_output_tokens: 2,
    });
    const prompt = lastPrompt(engine, tok);
    assert.equal(prompt, chatPrompt);
    assert.ok(
      prompt.includes(
        '[call call_1 get_weather {"city": "Oslo"}][call call_2 get_weather {"city": "Bergen"}]',
      ),
      prompt,
    );
    assert.ok(prompt.includes("<|im_start|>tool\n12 C[result of call_1]<|im_end|>"), prompt);
    assert.ok(prompt.includes("<|im_start|>tool\n9 C[result of call_2]<|im_end|>"), prompt);
  });
});

Deno.test("responses.create() returns reasoning as a reasoning item before the message when a reasoning parser runs", async () => {
  const tok = await showingTokenizer();
  const reply = "<think>\nweigh the options\n</think>\n\nthe answer<|im_end|>";
  const engine = new FakeEngine(tok, { maxModelLen: 512, reply });
  await withServer(engine, { reasoningParser: "qwen3" }, async (url) => {
    const oa = client(url);
    const body = { model: "fake-model", input: "why?", temperature: 0, max_output_tokens: 200 };
    const r = await oa.responses.create(body);
    assert.equal(r.status, "completed");
    assert.deepEqual(r.output.map((o) => o.type), ["reasoning", "message"]);
    const reasoning = r.output[0]!;
    assert.ok(reasoning.type === "reasoning");
    assert.match(reasoning.id, /^rs_[0-9a-f]{32}$/);
    assert.deepEqual(reasoning.summary, []);
    assert.deepEqual(reasoning.content, [{ type: "reasoning_text", text: "weigh the options" }]);
    assert.equal(r.output_text, "the answer");
    const thought = tok.encode("weigh the options", { addSpecialTokens: false }).length;
    assert.equal(r.usage!.output_tokens_details.reasoning_tokens, thought);
    const events = await rawEvents(await post(url, "/v1/responses", { ...body, stream: true }));
    const join = (type: string) =>
      events.filter((e) => e.event === type).map((e) => e.data.delta).join("");
    assert.equal(join("response.reasoning_text.delta"), "weigh the options");
    assert.equal(join("response.output_text.delta"), "the answer");
    const added = events.filter((e) => e.event === "response.output_item.added");
    assert.deepEqual(added.map((e) => [e.data.item.type, e.data.output_index]), [
      ["reasoning", 0],
      ["message", 1],
    ]);
    const final = events.at(-1)!.data.response;
    assert.deepEqual(final.output[0].content, reasoning.content);
    assert.equal(final.usage.output_tokens_details.reasoning_tokens, thought);
    // A reasoning item passed back reaches the template as the assistant's reasoning_content.
    await oa.responses.create({
      ...body,
      input: [
        { role: "user", content: "why?" },
        reasoning,
        {
          type: "message",
          id: "msg_1",
          role: "assistant",
          status: "completed",
          content: [{ type: "output_text", text: "the answer", annotations: [] }],
        },
        { role: "user", content: "sure?" },
      ],
    });
    assert.ok(
      lastPrompt(engine, tok).includes(
        "<|im_start|>assistant\n<think>weigh the options</think>the answer<|im_end|>",
      ),
      lastPrompt(engine, tok),
    );
  });
});

Deno.test("responses.create() returns the output text's logprobs when include asks for them", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 128 });
  await withServer(engine, {}, async (url) => {
    const oa = client(url);
    const body = {
      model: "fake-model",
      input: "Score me",
      temperature: 0,
      max_output_tokens: 4,
      top_logprobs: 2,
      include: ["message.output_text.logprobs" as const],
    };
    const r = await oa.responses.create(body);
    assert.equal(engine.requests.at(-1)!.params.logprobs, 2);
    const part = r.output[0]!.type === "message" ? r.output[0]!.content[0]! : null;
    assert.ok(part?.type === "output_text");
    assert.equal(part.logprobs!.length, 4);
    assert.ok(part.logprobs!.every((lp) => lp.top_logprobs.length === 2));
    const events = await rawEvents(await post(url, "/v1/responses", { ...body, stream: true }));
    const streamed = events.filter((e) => e.event === "response.output_text.delta")
      .flatMap((e) => e.data.logprobs);
    assert.deepEqual(streamed, part.logprobs);
    // Without include, no logprobs are computed.
    await oa.responses.create({ ...body, include: [] });
    assert.equal(engine.requests.at(-1)!.params.logprobs, null);
  });
});

Deno.test("POST /v1/responses maps text.format and reasoning.effort onto the chat path when they are set", async () => {
  const tok = await showingTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 512 });
  await withServer(engine, {}, async (url) => {
    const schema = { type: "object", properties: { a: { type: "integer" } }, required: ["a"] };
    const ok = await post(url, "/v1/responses", {
      input: "JSON please",
      text: { format: { type: "json_schema", name: "thing", schema, strict: true } },
      reasoning: { effort: "low", summary: "auto" },
      max_output_tokens: 2,
    });
    assert.equal(ok.status, 200);
    const r = await ok.json();
    assert.deepEqual(r.text.format, { type: "json_schema", name: "thing", schema, strict: true });
    assert.deepEqual(r.reasoning, { effort: "low", summary: "auto" });
    const spec = engine.requests.at(-1)!.params.structuredOutput;
    assert.deepEqual(spec, { kind: "json_schema", schema, strict: true });
    assert.match(lastPrompt(engine, tok), /^\[effort: low\]\n/);
  });
  // A template without reasoning_effort cannot honour an effort.
  await withServer(new FakeEngine(await tinyTokenizer()), {}, async (url) => {
    const res = await post(url, "/v1/responses", { input: "hi", reasoning: { effort: "high" } });
    assert.equal(res.status, 400);
    const err = (await res.json()).error;
    assert.equal(err.param, "reasoning.effort");
    assert.equal(err.code, "unsupported_parameter");
  });
});

Deno.test("POST /v1/responses answers 400 naming the Responses field when the request is invalid or unsupported", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 64 });
  await withServer(engine, {}, async (url) => {
    const cases: [Record<string, unknown>, string, string?][] = [
      [{ input: "hi", previous_response_id: "resp_123" }, "previous_response_id"],
      [{}, "input"],
      [{ input: 5 }, "input"],
      [{ input: [] }, "input"],
      [{ input: [{ role: "robot", content: "hi" }] }, "input.0.role"],
      [{ input: [{ type: "input_image", image_url: "x" }] }, "input.0.type"],
      [
        { input: [{ role: "user", content: [{ type: "input_image", image_url: "x" }] }] },
        "input.0.content.0.type",
      ],
      [{ input: [{ type: "function_call", name: "f", arguments: "{}" }] }, "input.0.call_id"],
      [{ input: [{ type: "function_call_output", call_id: "c" }] }, "input.0.output"],
      [{ input: "hi", max_output_tokens: 1000 }, "max_output_tokens"],
      [{ input: "x".repeat(400) }, "input"],
      [{ input: "hi", tools: [{ type: "web_search" }] }, "tools.0.type"],
      [{ input: "hi", tools: [{ type: "function" }] }, "tools.0.name"],
      [{ input: "hi", tool_choice: "required" }, "tool_choice"],
      [
        { input: "hi", tools: [WEATHER_TOOL], tool_choice: { type: "function", name: "nope" } },
        "tool_choice.name",
      ],
      [{ input: "hi", tool_choice: { type: "web_search_preview" } }, "tool_choice.type"],
      [{ input: "hi", text: { format: { type: "json_schema", name: "x" } } }, "text.format.schema"],
      [{ input: "hi", text: { format: { type: "grammar" } } }, "text.format.type"],
      [{ input: "hi", text: { verbosity: "low" } }, "text.verbosity"],
      [{ input: "hi", reasoning: { summary: "detailed" } }, "reasoning.summary"],
      [{ input: "hi", include: ["bogus"] }, "include.0"],
      [{ input: "hi", top_logprobs: 21 }, "top_logprobs"],
      [{ input: "hi", background: true }, "background", "unsupported_parameter"],
      [{ input: "hi", truncation: "auto" }, "truncation", "unsupported_parameter"],
      [{ input: "hi", max_tokens: 5 }, "max_tokens", "unsupported_parameter"],
      [{ input: "hi", temperature: "hot" }, "temperature"],
    ];
    for (const [body, param, code] of cases) {
      const res = await post(url, "/v1/responses", body);
      const text = await res.text();
      assert.equal(res.status, 400, `${JSON.stringify(body).slice(0, 80)}: ${text}`);
      const err = JSON.parse(text).error;
      assert.equal(err.param, param, `${JSON.stringify(body).slice(0, 80)}: ${text}`);
      assert.equal(err.type, "invalid_request_error");
      if (code !== undefined) assert.equal(err.code, code);
    }
    // Harmless values of those fields, store, and fields this server ignores, are accepted.
    const ok = await post(url, "/v1/responses", {
      input: "hi",
      max_output_tokens: 2,
      store: true,
      background: false,
      truncation: "disabled",
      service_tier: "auto",
      metadata: { k: "v" },
      user: "u1",
    });
    assert.equal(ok.status, 200);
    const r = await ok.json();
    assert.equal(r.store, false);
    assert.deepEqual(r.metadata, { k: "v" });
    assert.equal(r.user, "u1");
  });
});

Deno.test("POST /v1/responses aborts the engine request when the client cancels the stream", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 256, stepMs: 5 });
  await withServer(engine, {}, async (url) => {
    const res = await post(url, "/v1/responses", {
      input: "Go on forever",
      max_output_tokens: 200,
      stream: true,
    });
    const reader = res.body!.getReader();
    const first = await reader.read();
    assert.ok(new TextDecoder().decode(first.value).startsWith("event: response.created\n"));
    await reader.cancel();
    await engine.whenIdle();
    const id = engine.requests.at(-1)!.requestId;
    assert.match(id, /^resp_[0-9a-f]{32}-0$/);
    assert.deepEqual(engine.aborted, [id]);
  });
  // Cancelling the body alone (the request's signal never fires) aborts it too.
  const handle = createHandler(engine, { onError: () => {}, onWarning: () => {} });
  const res = await handle.handler(
    new Request("http://127.0.0.1/v1/responses", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ input: "Go on", max_output_tokens: 200, stream: true }),
    }),
  );
  const reader = res.body!.getReader();
  await reader.read();
  await reader.cancel();
  await engine.whenIdle();
  assert.deepEqual(engine.aborted.slice(1), [engine.requests.at(-1)!.requestId]);
  // The response leaves the in-flight set once its run is cancelled.
  for (let i = 0; i < 100 && handle.inFlight > 0; i++) await new Promise((r) => setTimeout(r, 5));
  assert.equal(handle.inFlight, 0);
});

Deno.test("POST /v1/responses sends an error event when the engine fails mid-stream", async () => {
  const tok = await tinyTokenizer();
  const engine = new FakeEngine(tok, { maxModelLen: 256, stepMs: 5 });
  await withServer(engine, {}, async (url) => {
    const res = await post(url, "/v1/responses", {
      input: "Go on",
      max_output_tokens: 200,
      stream: true,
    });
    const reader = res.body!.getReader();
    await reader.read();
    engine.kill(new Error("device lost"));
    let text = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    const last = text.trim().split("\n\n").at(-1)!;
    assert.match(last, /^event: error\ndata: /);
    const data = JSON.parse(last.split("\n")[1]!.slice(6));
    assert.equal(data.type, "error");
    assert.equal(typeof data.sequence_number, "number");
    assert.equal(data.code, "request_aborted");
  });
});

Deno.test("POST /v1/responses is POST only and needs the API key like the other /v1 routes", async () => {
  const engine = new FakeEngine(await tinyTokenizer());
  await withServer(engine, { apiKey: "secret" }, async (url) => {
    const anonymous = await post(url, "/v1/responses", { input: "hi" });
    assert.equal(anonymous.status, 401);
    await anonymous.body?.cancel();
    const get = await fetch(`${url}/v1/responses`, { headers: { authorization: "Bearer secret" } });
    assert.equal(get.status, 405);
    assert.equal(get.headers.get("allow"), "POST");
    await get.body?.cancel();
    const ok = await new OpenAI({ baseURL: `${url}/v1`, apiKey: "secret", maxRetries: 0 })
      .responses.create({ input: "hi", max_output_tokens: 2 });
    assert.equal(ok.status, "incomplete");
  });
});
