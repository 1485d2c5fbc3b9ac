/**
 * Real OpenAI-compatible clients against the server and the real WebGPU engine with a
 * random-weight tiny model, where only the grammar can make the answers valid: the Vercel AI SDK
 * (`generateObject` with a zod schema, `generateText` with a tool and `toolChoice` required or
 * named) and LangChain JS (`withStructuredOutput`, `bindTools` with `tool_choice` required).
 */

import assert from "node:assert/strict";
// The clients are pinned here rather than in deno.json: only this test uses them.
// deno-lint-ignore no-import-prefix
import { generateObject, generateText, tool as aiTool } from "npm:ai@7.0.173";
// deno-lint-ignore no-import-prefix
import { createOpenAICompatible } from "npm:@ai-sdk/openai-compatible@3.0.92";
// deno-lint-ignore no-import-prefix
import { ChatOpenAI } from "npm:@langchain/openai@1.6.0";
// deno-lint-ignore no-import-prefix
import { tool as lcTool } from "npm:@langchain/core@1.4.0/tools";
import { z } from "zod";
import { LLMEngine } from "../engine/llm_engine.ts";
import { startServer } from "../server/server.ts";
import { makeModel } from "../tools/make_model.ts";
import { GPU_TEST } from "./support/gpu.ts";

const Answer = z.object({ role: z.enum(["admin", "user"]), score: z.number().int().min(0).max(9) });
const Weather = z.object({ unit: z.enum(["c", "f"]) });

Deno.test(
  "the Vercel AI SDK and LangChain get schema-valid objects and tool calls from a random-weight model",
  GPU_TEST,
  async () => {
    // The AI SDK logs deprecation warnings (generateObject) through this global.
    (globalThis as { AI_SDK_LOG_WARNINGS?: boolean }).AI_SDK_LOG_WARNINGS = false;
    const dir = await Deno.makeTempDir();
    try {
      await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed: 9 });
      const engine = await LLMEngine.create({ model: dir, showProgress: false, forceF32: true });
      const server = startServer(engine, { port: 0, onError: () => {} });
      try {
        const name = engine.model.name;
        const model = createOpenAICompatible({
          name: "local",
          baseURL: `${server.url}/v1`,
          supportsStructuredOutputs: true,
        }).chatModel(name);
        const object = await generateObject({
          model,
          schema: Answer,
          prompt: "Who are you?",
          maxOutputTokens: 80,
          temperature: 0,
        });
        Answer.parse(object.object);
        for (const toolChoice of ["required", { type: "tool", toolName: "get_weather" }] as const) {
          const text = await generateText({
            model,
            prompt: "What is the weather?",
            tools: { get_weather: aiTool({ description: "The weather", inputSchema: Weather }) },
            toolChoice,
            maxOutputTokens: 100,
            temperature: 0,
          });
          assert.equal(text.finishReason, "tool-calls");
          assert.equal(text.toolCalls[0]?.toolName, "get_weather");
          Weather.parse(text.toolCalls[0]!.input);
        }

        const llm = new ChatOpenAI({
          model: name,
          apiKey: "none",
          configuration: { baseURL: `${server.url}/v1` },
          temperature: 0,
          maxTokens: 100,
        });
        Answer.parse(await llm.withStructuredOutput(Answer).invoke("Who are you?"));
        const weather = lcTool(({ unit }: z.infer<typeof Weather>) => `sunny, in ${unit}`, {
          name: "get_weather",
          description: "The weather",
          schema: Weather,
        });
        const message = await llm.bindTools([weather], { tool_choice: "required" })
          .invoke("What is the weather?");
        assert.equal(message.tool_calls?.[0]?.name, "get_weather");
        Weather.parse(message.tool_calls![0]!.args);
        assert.equal(engine.stats().numRunning, 0);
      } finally {
        await server.shutdown(0);
        await engine.shutdown();
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);
