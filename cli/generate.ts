/**
 * `main.ts generate`: offline generation. Several `--prompt` / `--prompt-ids` run together as one
 * batch through the engine. Without `--json` the text is streamed to stdout as it is generated
 * (prompt 0 live, the others printed in turn as they complete); with `--json`, one line per
 * prompt: `{"index", "token_ids", "text", "finish_reason"}`.
 *
 * @module
 */

import { InvalidParameterError, validateSamplingParams } from "../engine/input_processor.ts";
import { LLMEngine } from "../engine/llm_engine.ts";
import { parseCommandArgs } from "./usage.ts";
import type { RequestOutput } from "../engine/engine_api.ts";
import { type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import type { Tokenizer } from "../engine/tokenizer.ts";
import {
  ENGINE_FLAGS,
  ENGINE_FLAGS_USAGE,
  engineOptionsFromFlags,
  resolveModelDir,
} from "./engine_flags.ts";

export const GENERATE_USAGE =
  `usage: main.ts generate [--model DIR] (--prompt TEXT | --prompt-ids 1,2,3)...
  [--chat] [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P] [--seed S]
  [--ignore-eos] [--stop STR]... [--json] [engine flags]

${ENGINE_FLAGS_USAGE}`;

function parseNumber(
  flag: string,
  value: string | undefined,
  integer: boolean,
): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || (integer && !Number.isInteger(n))) {
    throw new TypeError(`--${flag} expects ${integer ? "an integer" : "a number"}, got "${value}"`);
  }
  return n;
}

/** `parseArgs` options of `generate`: the engine flags and its own. */
const GENERATE_FLAGS = {
  ...ENGINE_FLAGS,
  prompt: { type: "string", multiple: true },
  "prompt-ids": { type: "string", multiple: true },
  chat: { type: "boolean", default: false },
  "max-tokens": { type: "string" },
  temperature: { type: "string" },
  "top-p": { type: "string" },
  "top-k": { type: "string" },
  "min-p": { type: "string" },
  seed: { type: "string" },
  "ignore-eos": { type: "boolean", default: false },
  stop: { type: "string", multiple: true },
  json: { type: "boolean", default: false },
  help: { type: "boolean", default: false },
} as const;

/** The flag values `generate` reads. */
type GenerateValues = {
  [K in keyof typeof GENERATE_FLAGS]?: string | boolean | string[];
};

/** One `--prompt` (text) or `--prompt-ids` (token ids). */
type Prompt = { text: string } | { ids: number[] };

/** Runs `generate` with `args`; returns the exit code. */
export async function runGenerate(args: string[]): Promise<number> {
  const { values, tokens } = parseCommandArgs("generate", {
    args,
    options: GENERATE_FLAGS,
    tokens: true,
  });
  if (values.help) {
    console.log(GENERATE_USAGE);
    return 0;
  }
  if (values["served-model-name"] !== undefined) {
    throw new TypeError("--served-model-name applies to serve: generate names no model");
  }
  const prompts = promptsOf(tokens);
  const params = samplingParamsOf(values);
  const model = await resolveModelDir(values.model, values.revision);
  const options = engineOptionsFromFlags({ ...values, model });
  const engine = await LLMEngine.create(
    { maxNumSeqs: Math.max(prompts.length, 1), ...options },
    (line) => console.error(line),
  );
  try {
    const encoded = encodePrompts(engine.tokenizer, prompts, values.chat);
    const merged = { ...params, ...engine.generationDefaults, ...explicit(values) };
    const streams = encoded.map((ids, i) =>
      engine.generate({ requestId: `prompt-${i}`, promptTokenIds: ids, params: merged })
    );
    await printOutputs(streams, values.json);
  } finally {
    await engine.shutdown();
  }
  return 0;
}

/**
 * The prompts in command-line order, text and ids mixed.
 *
 * @throws {TypeError} on a bad `--prompt-ids` list, or when there is no prompt.
 */
function promptsOf(
  tokens: Iterable<{ kind: string; name?: string; value?: string | undefined }>,
): Prompt[] {
  const prompts: Prompt[] = [];
  for (const t of tokens) {
    if (t.kind !== "option" || t.value === undefined) continue;
    if (t.name === "prompt") prompts.push({ text: t.value });
    if (t.name === "prompt-ids") {
      const ids = t.value.split(",").map((s) => s.trim());
      if (ids.some((s) => !/^\d+$/.test(s))) {
        throw new TypeError(`--prompt-ids expects comma-separated token ids, got "${t.value}"`);
      }
      prompts.push({ ids: ids.map(Number) });
    }
  }
  if (prompts.length === 0) throw new TypeError("give at least one --prompt or --prompt-ids");
  return prompts;
}

/**
 * The sampling flags as parameters (greedy, 32 tokens by default), checked with the engine's
 * rules before the model loads.
 *
 * @throws {TypeError} naming the flag of a bad value.
 */
function samplingParamsOf(values: GenerateValues): SamplingParams {
  const flag = (name: keyof typeof GENERATE_FLAGS) => {
    const v = values[name];
    return typeof v === "string" ? v : undefined;
  };
  const params = samplingParams({
    temperature: parseNumber("temperature", flag("temperature"), false) ?? 0,
    topP: parseNumber("top-p", flag("top-p"), false) ?? 1,
    topK: parseNumber("top-k", flag("top-k"), true) ?? 0,
    minP: parseNumber("min-p", flag("min-p"), false) ?? 0,
    seed: parseNumber("seed", flag("seed"), true) ?? null,
    maxTokens: parseNumber("max-tokens", flag("max-tokens"), true) ?? 32,
    ignoreEos: values["ignore-eos"] === true,
    stop: Array.isArray(values.stop) ? values.stop : [],
  });
  // The engine's parameter rules, checked before the model loads; errors name the flag.
  try {
    validateSamplingParams(params, { vocabSize: 0 });
  } catch (e) {
    if (!(e instanceof InvalidParameterError)) throw e;
    throw new TypeError(`--${e.param.split(".")[0]!.replaceAll("_", "-")}: ${e.message}`);
  }
  return params;
}

/** Token ids of each prompt (text encoded, through the chat template with `chat`). */
function encodePrompts(tokenizer: Tokenizer | null, prompts: Prompt[], chat: boolean): number[][] {
  return prompts.map((p) => {
    if ("ids" in p) return p.ids;
    if (tokenizer === null) throw new TypeError("--prompt needs a model with a tokenizer");
    if (chat) {
      const text = tokenizer.applyChatTemplate([{ role: "user", content: p.text }], {
        addGenerationPrompt: true,
      });
      return tokenizer.encode(text, { addSpecialTokens: false });
    }
    return tokenizer.encode(p.text);
  });
}

/**
 * Consumes every stream concurrently and prints the outputs: with `json` one line per prompt;
 * else prompt 0's text as it arrives, then each other prompt's in turn under a header.
 */
async function printOutputs(
  streams: AsyncIterable<RequestOutput>[],
  json: boolean,
): Promise<void> {
  const out = new TextEncoder();
  const results = streams.map((stream, i) =>
    collect(stream, (o) => {
      if (!json && i === 0) Deno.stdout.writeSync(out.encode(o.text));
    })
  );
  for (let i = 0; i < results.length; i++) {
    const r = await results[i]!;
    if (json) {
      console.log(JSON.stringify({
        index: i,
        token_ids: r.tokenIds,
        text: r.text,
        finish_reason: r.finishReason,
      }));
    } else {
      if (i > 0) Deno.stdout.writeSync(out.encode(`\n--- prompt ${i} ---\n${r.text}`));
      if (i === results.length - 1) Deno.stdout.writeSync(out.encode("\n"));
    }
  }
}

/** Sampling fields given explicitly on the command line (they beat generation_config.json). */
function explicit(values: Record<string, unknown>) {
  const o: Record<string, number> = {};
  if (typeof values.temperature === "string") o.temperature = Number(values.temperature);
  if (typeof values["top-p"] === "string") o.topP = Number(values["top-p"]);
  if (typeof values["top-k"] === "string") o.topK = Number(values["top-k"]);
  if (typeof values["min-p"] === "string") o.minP = Number(values["min-p"]);
  // Without flags, generate is greedy: the defaults above stay unless generation_config sets them.
  return o;
}

async function collect(stream: AsyncIterable<RequestOutput>, each: (o: RequestOutput) => void) {
  const tokenIds: number[] = [];
  let text = "";
  let finishReason: string | null = null;
  for await (const o of stream) {
    each(o);
    tokenIds.push(...o.tokenIds);
    text += o.text;
    finishReason = o.finishReason;
  }
  return { tokenIds, text, finishReason };
}
