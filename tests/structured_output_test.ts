/**
 * Structured outputs end to end (engine/structured_output/, kernels/token_mask.ts), on the real
 * WebGPU executor with a random-weight tiny model: only the grammar can make its output valid.
 * `response_format` json_schema (a zod schema through `z.toJSONSchema`, checked back with zod,
 * and through the `openai` SDK's `chat.completions.parse`), json_object, vLLM's
 * `structured_outputs` choice / regex / grammar and `guided_choice`, streaming, constrained and
 * free requests in one batch, and the 400s for what cannot be enforced.
 */

import assert from "node:assert/strict";
// The client is pinned here rather than in deno.json: only the server tests use it.
// deno-lint-ignore no-import-prefix
import OpenAI from "npm:openai@7.57.0";
// deno-lint-ignore no-import-prefix
import { zodResponseFormat } from "npm:openai@7.57.0/helpers/zod";
import { z } from "zod";
import { LLMEngine } from "../engine/llm_engine.ts";
import { startServer } from "../server/server.ts";
import { makeModel } from "../tools/make_model.ts";
import { GPU_TEST } from "./support/gpu.ts";

const Person = z.object({
  name: z.string().max(12),
  age: z.number().int().min(0).max(120),
  role: z.enum(["admin", "user", "guest"]),
  tags: z.array(z.string().max(6)).max(3),
});
/**
 * `Person` with string lengths counted as the grammar counts them: in Unicode code points of
 * the UTF-8 it generates. A random byte-level model can emit a byte sequence that is not UTF-8
 * (decoded to several U+FFFD) or an astral character (two UTF-16 units for zod): those strings
 * are checked with the replacement characters left out.
 */
const codePoints = (max: number) =>
  z.string().refine(
    (s) => [...s.replaceAll("\uFFFD", "")].length <= max,
    `over ${max} code points`,
  );
const PersonAsGenerated = z.object({
  name: codePoints(12),
  age: z.number().int().min(0).max(120),
  role: z.enum(["admin", "user", "guest"]),
  tags: z.array(codePoints(6)).max(3),
}).strict();

async function withServer(fn: (url: string, engine: LLMEngine) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir();
  try {
    await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed: 5 });
    const engine = await LLMEngine.create({ model: dir, showProgress: false, forceF32: true });
    const server = startServer(engine, { port: 0, onError: () => {} });
    try {
      await fn(server.url, engine);
    } finally {
      await server.shutdown(0);
      await engine.shutdown();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

async function post(url: string, path: string, body: object) {
  const res = await fetch(`${url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: await res.json() };
}

Deno.test(
  "structured outputs constrain a random-weight model to a JSON schema, a choice, a regex and a grammar",
  GPU_TEST,
  async () => {
    await withServer(async (url, engine) => {
      const schema = z.toJSONSchema(Person);
      const prompts = ["hello", "tell me about a user", "x y z", "json please"];
      // json_schema, several prompts and temperatures, in one batch with free-text requests.
      const runs = prompts.flatMap((prompt, i) => [
        post(url, "/v1/chat/completions", {
          messages: [{ role: "user", content: prompt }],
          max_tokens: 120,
          temperature: i % 2,
          seed: i,
          response_format: {
            type: "json_schema",
            json_schema: { name: "person", schema, strict: true },
          },
        }),
        post(url, "/v1/completions", { prompt, max_tokens: 20 }),
      ]);
      const results = await Promise.all(runs);
      for (const [i, r] of results.entries()) {
        assert.equal(r.status, 200, JSON.stringify(r.json));
        if (i % 2 === 1) continue;
        const choice = r.json.choices[0];
        assert.equal(choice.finish_reason, "stop", choice.message.content);
        PersonAsGenerated.parse(JSON.parse(choice.message.content));
      }
      // json_object: any JSON object (on one line: no free whitespace).
      const obj = await post(url, "/v1/completions", {
        prompt: "data",
        max_tokens: 200,
        temperature: 0,
        response_format: { type: "json_object" },
      });
      assert.equal(obj.status, 200);
      if (obj.json.choices[0].finish_reason === "stop") {
        const parsed = JSON.parse(obj.json.choices[0].text);
        assert.ok(typeof parsed === "object" && parsed !== null && !Array.isArray(parsed));
      }
      // vLLM's structured_outputs and guided_choice.
      const choice = await post(url, "/v1/completions", {
        prompt: "pick",
        max_tokens: 10,
        structured_outputs: { choice: ["red", "green", "blue"] },
      });
      assert.ok(["red", "green", "blue"].includes(choice.json.choices[0].text), choice.json);
      const guided = await post(url, "/v1/completions", {
        prompt: "pick",
        max_tokens: 10,
        guided_choice: ["yes", "no"],
      });
      assert.ok(["yes", "no"].includes(guided.json.choices[0].text), guided.json);
      const regex = await post(url, "/v1/completions", {
        prompt: "digits",
        max_tokens: 10,
        structured_outputs: { regex: "[0-9]{3}-[a-c]{2}" },
      });
      assert.match(regex.json.choices[0].text, /^[0-9]{3}-[a-c]{2}$/);
      const grammar = await post(url, "/v1/completions", {
        prompt: "greet",
        max_tokens: 10,
        structured_outputs: { grammar: 'root ::= "hi" (" there")? "!"' },
      });
      assert.match(grammar.json.choices[0].text, /^hi( there)?!$/);
      // Streaming: the concatenated deltas are the constrained text.
      const res = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          prompt: "stream",
          max_tokens: 10,
          stream: true,
          structured_outputs: { choice: ["alpha", "beta"] },
        }),
      });
      const text = (await res.text()).split("\n\n").filter((e) => e.startsWith("data: {"))
        .map((e) => JSON.parse(e.slice(6)).choices[0]?.text ?? "").join("");
      assert.ok(["alpha", "beta"].includes(text), text);
      // Nothing left behind.
      assert.equal(engine.stats().numRunning, 0);
      assert.equal(engine.stats().kvBlocksUsed, 0);
    });
  },
);

Deno.test(
  "the openai SDK's chat.completions.parse gets an object of its zod schema from a random-weight model",
  GPU_TEST,
  async () => {
    await withServer(async (url) => {
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "none" });
      // Greedy: its strings are whole UTF-8 characters, so zod's own length checks hold.
      const completion = await client.chat.completions.parse({
        model: (await client.models.list()).data[0]!.id,
        messages: [{ role: "user", content: "Who is the admin?" }],
        max_tokens: 120,
        temperature: 0,
        response_format: zodResponseFormat(Person, "person"),
      });
      const parsed = completion.choices[0]!.message.parsed;
      assert.ok(parsed !== null);
      Person.parse(parsed);
    });
  },
);

Deno.test(
  "structured outputs refuse what they cannot enforce with a 400 naming it",
  GPU_TEST,
  async () => {
    await withServer(async (url) => {
      const cases: [object, string, RegExp][] = [
        [
          {
            response_format: {
              type: "json_schema",
              json_schema: { name: "x", schema: { type: "string", format: "email" } },
            },
          },
          "response_format",
          /keyword "format"/,
        ],
        [
          { structured_outputs: { grammar: "root ::= ???" } },
          "structured_outputs.grammar",
          /grammar/,
        ],
        [{ structured_outputs: { choice: [] } }, "structured_outputs.choice", /non-empty/],
        [
          { guided_regex: "[0-9]", guided_choice: ["a"] },
          "guided_choice",
          /one structured-output constraint/,
        ],
        [{ guided_json: "{not json" }, "guided_json", /not valid JSON/],
        [{ response_format: { type: "xml" } }, "response_format", /.*/],
      ];
      for (const [extra, param, message] of cases) {
        const r = await post(url, "/v1/completions", { prompt: "x", max_tokens: 4, ...extra });
        assert.equal(r.status, 400, JSON.stringify(r.json));
        assert.ok(r.json.error.param.startsWith(param), JSON.stringify(r.json));
        assert.match(r.json.error.message, message);
      }
      // The server still serves constrained requests afterwards.
      const ok = await post(url, "/v1/completions", {
        prompt: "x",
        max_tokens: 4,
        structured_outputs: { choice: ["ok"] },
      });
      assert.equal(ok.json.choices[0].text, "ok");
    });
  },
);

Deno.test("LLMEngine refuses structured outputs on the mock executor, which runs no model", async () => {
  const engine = LLMEngine.createMock();
  try {
    const { samplingParams } = await import("../scheduler/sampling_params.ts");
    assert.throws(
      () =>
        engine.generate({
          requestId: "r",
          promptTokenIds: [1, 2, 3],
          params: samplingParams({ structuredOutput: { kind: "json_object" } }),
        }),
      (e: unknown) =>
        e instanceof Error && e.name === "InvalidParameterError" &&
        (e as { param?: string }).param === "response_format",
    );
    assert.equal(engine.stats().numWaiting, 0);
  } finally {
    await engine.shutdown();
  }
});

Deno.test(
  "tool_choice required and a named function make a random-weight model call tools (openai SDK)",
  GPU_TEST,
  async () => {
    await withServer(async (url) => {
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "none" });
      const model = (await client.models.list()).data[0]!.id;
      const tools = [
        {
          type: "function" as const,
          function: {
            name: "get_weather",
            parameters: {
              type: "object",
              properties: {
                city: { type: "string", maxLength: 4 },
                unit: { enum: ["c", "f"] },
              },
              required: ["city", "unit"],
              additionalProperties: false,
            },
          },
        },
        {
          type: "function" as const,
          function: { name: "now", parameters: { type: "object", properties: {} } },
        },
      ];
      for (
        const tool_choice of ["required", {
          type: "function",
          function: { name: "get_weather" },
        }] as const
      ) {
        const r = await client.chat.completions.create({
          model,
          messages: [{ role: "user", content: "What is the weather?" }],
          tools,
          tool_choice,
          parallel_tool_calls: false,
          max_tokens: 200,
          temperature: 0,
        });
        const choice = r.choices[0]!;
        assert.equal(
          choice.finish_reason,
          "tool_calls",
          JSON.stringify(choice) + JSON.stringify(r.usage),
        );
        assert.equal(choice.message.tool_calls?.length, 1);
        const call = choice.message.tool_calls![0]!;
        assert.equal(call.type, "function");
        if (call.type !== "function") continue;
        if (typeof tool_choice === "object") assert.equal(call.function.name, "get_weather");
        const args = JSON.parse(call.function.arguments);
        if (call.function.name === "get_weather") {
          assert.ok(["c", "f"].includes(args.unit));
          assert.equal(typeof args.city, "string");
        } else {
          assert.deepEqual(args, {});
        }
        // The call round-trips through the history with the tool's answer.
        const next = await client.chat.completions.create({
          model,
          messages: [
            { role: "user", content: "What is the weather?" },
            { role: "assistant", content: null, tool_calls: [call] },
            { role: "tool", tool_call_id: call.id, content: "sunny" },
          ],
          tools,
          tool_choice: "none",
          max_tokens: 4,
        });
        assert.equal(next.choices[0]!.message.tool_calls, undefined);
      }
      // Streamed: OpenAI's deltas, name first, arguments concatenating to a JSON string.
      const stream = await client.chat.completions.create({
        model,
        messages: [{ role: "user", content: "What is the weather?" }],
        tools,
        tool_choice: { type: "function", function: { name: "get_weather" } },
        max_tokens: 200,
        temperature: 0,
        stream: true,
      });
      let name = "";
      let args = "";
      let finish: string | null = null;
      for await (const chunk of stream) {
        const c = chunk.choices[0];
        for (const d of c?.delta.tool_calls ?? []) {
          assert.equal(d.index, 0);
          name += d.function?.name ?? "";
          args += d.function?.arguments ?? "";
        }
        finish = c?.finish_reason ?? finish;
      }
      assert.equal(name, "get_weather");
      assert.ok(["c", "f"].includes(JSON.parse(args).unit), args);
      assert.equal(finish, "tool_calls");
    });
  },
);
