/**
 * The cost of structured outputs (engine/structured_output/), on the tiny model through the
 * engine with the WebGPU executor:
 *
 * - grammar compile time: a JSON schema and a regex, cold (first compile of the engine) and
 *   cached (the same specification again);
 * - mask time per token per sequence, p50 / p99: feeding a token to the request's matcher and
 *   getting its next mask back from the grammar worker (the round trip the engine waits for
 *   when it schedules the request next), over the tokens the engine generated under the
 *   grammar, replayed on a fresh matcher;
 * - decode throughput of a batch of 16 requests of `--tokens` output tokens each, none
 *   constrained, against 4 of the 16 constrained (a regex allowing any lowercase text, so every
 *   request runs to its length), in the same run: output tokens / wall time until the last
 *   request ends (the 4 constrained ones end last, alone);
 * - the same two batches kept full for a few seconds (each finished request replaced at once, as
 *   under continuous load): output tokens / s.
 *
 * Run: `deno run -A bench/structured_output_bench.ts [--tokens N] [--json]`.
 *
 * @module
 */

import { LLMEngine } from "../engine/llm_engine.ts";
import { StructuredOutputs } from "../engine/structured_output/structured_outputs.ts";
import { Tokenizer } from "../engine/tokenizer.ts";
import { type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import type { StructuredOutputSpec } from "../scheduler/sampling_params.ts";
import { makeModel } from "../tools/make_model.ts";
import { isPositiveInteger, scriptFlags } from "./bench_io.ts";

const args = scriptFlags("bench/structured_output_bench.ts", Deno.args, {
  tokens: { type: "string", default: "64" },
  json: { type: "boolean", default: false },
}, (v) => {
  if (!isPositiveInteger(v.tokens)) throw new Error(`--tokens takes a positive integer`);
});
const TOKENS = Number(args.tokens);
const log = args.json ? () => {} : console.log;

const SCHEMA: StructuredOutputSpec = {
  kind: "json_schema",
  schema: {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 12 },
      age: { type: "integer", minimum: 0, maximum: 120 },
      role: { enum: ["admin", "user", "guest"] },
    },
    required: ["name", "age", "role"],
    additionalProperties: false,
  },
  strict: true,
};
const TEXT: StructuredOutputSpec = { kind: "regex", pattern: "[a-z ]{1,1000}" };

function percentile(sorted: readonly number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

async function generate(engine: LLMEngine, id: string, params: SamplingParams) {
  const tokens: number[] = [];
  for await (
    const out of engine.generate({ requestId: id, promptTokenIds: [1, 2, 3, id.length], params })
  ) tokens.push(...out.tokenIds);
  return tokens;
}

/** Wall ms of 16 requests of TOKENS tokens, `constrained` of them under TEXT. */
async function batch(engine: LLMEngine, constrained: number, tag: string): Promise<number> {
  const t0 = performance.now();
  const steps0 = engine.stats().steps;
  try {
    await Promise.all(Array.from({ length: 16 }, (_, i) =>
      generate(
        engine,
        `${tag}-${i}`,
        samplingParams({
          temperature: 0,
          maxTokens: TOKENS,
          ignoreEos: true,
          structuredOutput: i < constrained ? TEXT : null,
        }),
      )));
  } finally {
    steps.set(tag, engine.stats().steps - steps0);
  }
  return performance.now() - t0;
}
/** Engine steps each batch took. */
const steps = new Map<string, number>();

/**
 * Output tokens per second while 16 requests run at all times, `constrained` of them under TEXT:
 * each of 16 slots issues requests of TOKENS tokens one after another for `ms`; tokens streamed
 * after the first quarter (warm-up) are counted; requests still running at the end are aborted.
 */
async function steady(engine: LLMEngine, constrained: number, tag: string, ms: number) {
  const t0 = performance.now();
  const from = t0 + ms / 4;
  const until = t0 + ms;
  let counted = 0;
  await Promise.all(Array.from({ length: 16 }, async (_, slot) => {
    for (let n = 0; performance.now() < until; n++) {
      const params = samplingParams({
        temperature: 0,
        maxTokens: TOKENS,
        ignoreEos: true,
        structuredOutput: slot < constrained ? TEXT : null,
      });
      const id = `${tag}-${slot}-${n}`;
      for await (
        const out of engine.generate({ requestId: id, promptTokenIds: [1, 2, 3], params })
      ) {
        const now = performance.now();
        if (now >= until) break; // ends the request
        if (now >= from) counted += out.tokenIds.length;
      }
    }
  }));
  return counted / ((until - from) / 1000);
}

const dir = await Deno.makeTempDir({ prefix: "structured_bench_" });
try {
  await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "bf16", seed: 1 });
  const engine = await LLMEngine.create({
    model: dir,
    showProgress: false,
    maxNumSeqs: 16,
    maxModelLen: TOKENS + 16,
  });
  const tokenizer = await Tokenizer.fromDir(dir);
  const report: Record<string, unknown> = {
    date: new Date().toISOString(),
    command: `deno run -A bench/structured_output_bench.ts ${Deno.args.join(" ")}`.trim(),
    model: "tiny-qwen3 preset (random bf16 weights)",
    tokens: TOKENS,
  };
  // Compile times, on a fresh manager (cold includes starting its worker and building the
  // tokenizer info).
  const so = new StructuredOutputs(tokenizer, engine.model.vocabSize, [511]);
  try {
    const compile: Record<string, number> = {};
    for (
      const [name, spec] of [["schema cold", SCHEMA], ["schema cached", SCHEMA], [
        "regex",
        TEXT,
      ]] as const
    ) {
      const t0 = performance.now();
      await so.admit(name, spec, "bench");
      compile[name] = performance.now() - t0;
      so.release(name);
    }
    report.compileMs = compile;
    log(
      `grammar compile: JSON schema ${
        compile["schema cold"]!.toFixed(1)
      } ms cold (tokenizer info ` +
        `included), ${compile["schema cached"]!.toFixed(2)} ms cached; regex ${
          compile.regex!.toFixed(1)
        } ms`,
    );
    // Mask time per token: replay generated tokens through a fresh matcher.
    const times: number[] = [];
    for (let r = 0; r < 8; r++) {
      const spec = r % 2 === 0 ? SCHEMA : TEXT;
      const tokens = await generate(
        engine,
        `mask-${r}`,
        samplingParams({ temperature: 1, seed: r, maxTokens: TOKENS, structuredOutput: spec }),
      );
      await so.admit("replay", spec, "bench");
      for (const t of tokens) {
        const t0 = performance.now();
        so.accept("replay", [t]);
        await so.settled();
        times.push(performance.now() - t0);
      }
      so.release("replay");
    }
    times.sort((a, b) => a - b);
    report.maskMs = {
      count: times.length,
      p50: percentile(times, 0.5),
      p99: percentile(times, 0.99),
    };
    log(
      `accept + next mask per token per sequence (worker round trip): p50 ${
        percentile(times, 0.5).toFixed(3)
      } ms, ` +
        `p99 ${
          percentile(times, 0.99).toFixed(3)
        } ms (${times.length} tokens, vocabulary ${engine.model.vocabSize})`,
    );
    // Mixed batch against a free one (warm-up first).
    await batch(engine, 0, "warm");
    const free = await batch(engine, 0, "free");
    const mixed = await batch(engine, 4, "mixed");
    const rate = (ms: number) => (16 * TOKENS) / (ms / 1000);
    report.batch16 = { freeTokS: rate(free), mixedTokS: rate(mixed), ratio: free / mixed };
    log(
      `batch of 16 x ${TOKENS} tokens: ${rate(free).toFixed(0)} tok/s free, ${
        rate(mixed).toFixed(0)
      } tok/s ` +
        `with 4 constrained (${((100 * free) / mixed).toFixed(0)}% of the free throughput; ` +
        `${steps.get("free")} and ${steps.get("mixed")} engine steps)`,
    );
    // The same batches kept full: a finished request is replaced at once (continuous batching).
    const WINDOW_MS = 4000;
    const steadyFree = await steady(engine, 0, "steady-free", WINDOW_MS);
    const steadyMixed = await steady(engine, 4, "steady-mixed", WINDOW_MS);
    report.steady16 = {
      freeTokS: steadyFree,
      mixedTokS: steadyMixed,
      ratio: steadyMixed / steadyFree,
    };
    log(
      `16 requests at all times (${WINDOW_MS / 1000} s, first quarter not counted): ${
        steadyFree.toFixed(0)
      } tok/s free, ${steadyMixed.toFixed(0)} tok/s with 4 constrained (${
        ((100 * steadyMixed) / steadyFree).toFixed(0)
      }% of the free throughput)`,
    );
  } finally {
    so.close();
    await engine.shutdown();
  }
  if (args.json) console.log(JSON.stringify(report, null, 2));
} finally {
  await Deno.remove(dir, { recursive: true });
}
