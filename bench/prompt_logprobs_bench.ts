/**
 * The cost of prompt log-probabilities (`prompt_logprobs`, and `echo` with `logprobs`: what
 * lm-eval-harness's loglikelihood requests ask), through the engine with the WebGPU executor:
 * `--prompts` requests of `--len` random prompt tokens and one output token each, all at once,
 * scored (`promptLogprobs` = `--top`) against not scored, in interleaved rounds of the same
 * requests. Prefix caching is off in both, so both prefill every prompt token.
 *
 * Scored prompt positions are rows of the step's sampler (LM head, top logprobs, `sample`'s
 * scoring mode), in sub-batches of `--max-num-seqs` rows (the logits'), at most 8 per step
 * (engine/sampler.ts), so a scored prompt is prefilled in chunks of up to 8 x `--max-num-seqs`
 * tokens: the cost is the LM head over every prompt position plus any extra steps.
 *
 * Prints per round the wall time, engine steps and prompt tokens per second of both runs and
 * their ratio, then the median ratio.
 *
 * Run: `deno task bench:prompt-logprobs [--model tiny|qwen3-0.6b|DIR] [--prompts N]
 * [--len L] [--top K] [--max-num-seqs S] [--rounds R] [--kernel-profile auto|cpu|gpu]
 * [--quantization none|int8|int4] [--json]`.
 *
 * @module
 */

import { resolveModelDir } from "../cli/engine_flags.ts";
import { LLMEngine } from "../engine/llm_engine.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import { makeModel } from "../tools/make_model.ts";
import { benchContext, describeMachine } from "./support.ts";
import { oneOf, parseFlags, reportUsage, runMain, UsageError } from "./bench_io.ts";

const USAGE = `usage: deno task bench:prompt-logprobs [options]

  --model tiny|qwen3-0.6b|DIR  model (default tiny: the generated tiny-qwen3)
  --prompts N                  requests per run (default 8)
  --len L                      prompt tokens per request (default 128)
  --top K                      prompt_logprobs of the scored run, 0 to 20 (default 1)
  --max-num-seqs S             max_num_seqs: logits rows per sub-batch (default 64)
  --rounds R                   interleaved rounds (default 3)
  --kernel-profile P           auto | cpu | gpu (default auto)
  --quantization Q             none | int8 | int4: weights quantized while loading (default none)
  --json                       print the rounds as JSON
  --help                       this text`;

/** One run's measurement. */
interface RunResult {
  readonly ms: number;
  readonly steps: number;
  readonly tokPerS: number;
}

function positiveInt(name: string, v: string, min = 1, max = Number.MAX_SAFE_INTEGER): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new UsageError(`--${name} must be an integer from ${min} to ${max}, got ${v}`);
  }
  return n;
}

/** All requests at once; prompt tokens per second of wall time until the last one ends. */
async function run(
  engine: LLMEngine,
  prompts: readonly number[][],
  top: number | null,
  tag: string,
): Promise<RunResult> {
  const steps0 = engine.stats().steps;
  const t0 = performance.now();
  await Promise.all(prompts.map(async (prompt, i) => {
    let scored = 0;
    for await (
      const out of engine.generate({
        requestId: `${tag}-${i}`,
        promptTokenIds: prompt,
        params: samplingParams({ temperature: 0, maxTokens: 1, promptLogprobs: top }),
      })
    ) scored += out.promptLogprobs?.length ?? 0;
    if (top !== null && scored !== prompt.length) {
      throw new Error(`request ${tag}-${i}: ${scored} prompt logprobs for ${prompt.length} tokens`);
    }
  }));
  const ms = performance.now() - t0;
  const tokens = prompts.reduce((n, p) => n + p.length, 0);
  return { ms, steps: engine.stats().steps - steps0, tokPerS: tokens / (ms / 1000) };
}

/** The options of `argv`, or null for `--help` (printed). */
function parseOptions(argv: string[]) {
  const args = parseFlags(argv, {
    model: { type: "string", default: "tiny" },
    prompts: { type: "string", default: "8" },
    len: { type: "string", default: "128" },
    top: { type: "string", default: "1" },
    "max-num-seqs": { type: "string", default: "64" },
    rounds: { type: "string", default: "3" },
    "kernel-profile": { type: "string", default: "auto" },
    quantization: { type: "string", default: "none" },
    json: { type: "boolean", default: false },
    help: { type: "boolean", default: false },
  });
  if (args.help) throw new UsageError(USAGE);
  return {
    model: args.model,
    json: args.json,
    prompts: positiveInt("prompts", args.prompts),
    len: positiveInt("len", args.len, 2),
    top: positiveInt("top", args.top, 0, 20),
    maxNumSeqs: positiveInt("max-num-seqs", args["max-num-seqs"]),
    rounds: positiveInt("rounds", args.rounds),
    profile: oneOf("kernel-profile", args["kernel-profile"], ["auto", "cpu", "gpu"] as const),
    quantization: oneOf("quantization", args.quantization, ["none", "int8", "int4"] as const),
  };
}

async function main(): Promise<number> {
  let o: ReturnType<typeof parseOptions>;
  try {
    o = parseOptions(Deno.args);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    return reportUsage(error, { log: console.log, err: console.error }, "bench:prompt-logprobs");
  }
  let tempDir: string | null = null;
  let dir: string;
  if (o.model === "qwen3-0.6b") {
    tempDir = await Deno.makeTempDir({ prefix: "prompt-logprobs-qwen3-" });
    await makeModel({ out: tempDir, preset: "qwen3-0.6b", dtype: "f16", seed: 0 });
    dir = tempDir;
  } else {
    dir = await resolveModelDir(o.model === "tiny" ? undefined : o.model);
  }
  try {
    const ctx = await benchContext();
    const machine = describeMachine(ctx);
    ctx.destroy();
    const engine = await LLMEngine.create({
      model: dir,
      showProgress: false,
      enablePrefixCaching: false,
      maxNumSeqs: o.maxNumSeqs,
      kernelProfile: o.profile,
      quantization: o.quantization,
    });
    try {
      const vocab = Math.min(engine.model.vocabSize, 30_000);
      let seed = 1;
      const next = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) % vocab;
      const prompts = Array.from({ length: o.prompts }, () => Array.from({ length: o.len }, next));
      // Warm-up of both runs, all prompts (the plain run's whole-prompt chunks and the scored
      // run's row-bounded ones compile different kernels and shapes): compiles and first-use
      // allocations out of the timed rounds.
      await run(engine, prompts, null, "warm-plain");
      await run(engine, prompts, o.top, "warm-scored");
      const rounds: { plain: RunResult; scored: RunResult; ratio: number }[] = [];
      for (let r = 0; r < o.rounds; r++) {
        const plain = await run(engine, prompts, null, `plain-${r}`);
        const scored = await run(engine, prompts, o.top, `scored-${r}`);
        rounds.push({ plain, scored, ratio: scored.tokPerS / plain.tokPerS });
      }
      const ratios = rounds.map((r) => r.ratio).sort((a, b) => a - b);
      const mid = ratios.length / 2;
      const median = ratios.length % 2 === 1
        ? ratios[Math.floor(mid)]!
        : (ratios[mid - 1]! + ratios[mid]!) / 2;
      if (o.json) {
        console.log(JSON.stringify({ machine, model: dir, options: o, rounds, median }, null, 2));
        return 0;
      }
      console.log(
        `${machine}\nmodel: ${o.model} (${engine.model.architecture}, ${engine.model.dtype}; weights ${o.quantization})`,
      );
      console.log(
        `command: deno task bench:prompt-logprobs ${Deno.args.join(" ")}`.trimEnd(),
      );
      console.log(
        `${o.prompts} prompts x ${o.len} tokens, prompt_logprobs ${o.top}, max_num_seqs ${o.maxNumSeqs}, no prefix caching\n`,
      );
      console.log(
        "| round | not scored: ms, steps, prompt tok/s | scored: ms, steps, prompt tok/s | scored / not |",
      );
      console.log(
        "| ----- | ----------------------------------- | ------------------------------- | ------------ |",
      );
      rounds.forEach((r, i) => {
        const f = (x: RunResult) => `${x.ms.toFixed(0)}, ${x.steps}, ${x.tokPerS.toFixed(1)}`;
        console.log(`| ${i + 1} | ${f(r.plain)} | ${f(r.scored)} | ${r.ratio.toFixed(3)}x |`);
      });
      console.log(`\nmedian scored / not scored throughput: ${median.toFixed(3)}x`);
      return 0;
    } finally {
      await engine.shutdown();
    }
  } finally {
    if (tempDir !== null) await Deno.remove(tempDir, { recursive: true });
  }
}

if (import.meta.main) Deno.exit(await runMain(main));
