/**
 * Runs one prompt alone through a {@linkcode ModelRunner} with greedy sampling: the prompt in
 * prefill chunks of `chunk` tokens, then one decode step per token, the decode inputs fed from
 * the previous step's sample on the GPU. Blocks come from `blocks` in order (pass a shuffled
 * list to exercise non-contiguous block tables). No scheduler: this is the runner's own check.
 *
 * {@linkcode soloRun} adds logits processing (penalties, logit bias) and top logprobs, several
 * steps in flight: penalties read the run's token history, which the runner keeps on the GPU
 * under a key of the run's own (freed at the end), and {@linkcode referenceRun} is the same
 * greedy loop on the float64 reference model.
 *
 * @module
 */

import type { ModelRunner, StepHandle, TopLogprob } from "../../engine/model_runner.ts";
import { logitsProcessRef, topLogprobsRef } from "../reference/logits_process.ts";
import type { ReferenceModel, ReferenceStep } from "../reference/model.ts";
import type { Rng } from "./random.ts";

/**
 * Runner options for solo runs of up to 128 tokens (prompt + output): 24 KV blocks of 16 tokens,
 * steps of up to 64 tokens and 4 sequences.
 */
export const SOLO_RUNNER_OPTIONS = {
  maxTokens: 64,
  maxSeqs: 4,
  maxModelLen: 128,
  blockSize: 16,
  numKvBlocks: 24,
  showProgress: false,
} as const;

/** Penalties and bias of a run (vLLM meanings; every field optional). */
export interface SoloPenalties {
  readonly repetitionPenalty?: number;
  readonly presencePenalty?: number;
  readonly frequencyPenalty?: number;
  readonly logitBias?: ReadonlyMap<number, number> | null;
}

/** Options of {@linkcode soloRun}. */
export interface SoloOptions {
  /** Prefill chunk size (default: the whole prompt). */
  readonly chunk?: number;
  /** KV blocks in order of use (default 0, 1, ...). */
  readonly blocks?: readonly number[];
  readonly penalties?: SoloPenalties;
  /** Top logprobs per step (0 to 20; default 0). */
  readonly topLogprobs?: number;
  /** Decode steps in flight before the oldest is awaited (default 6, at most maxInFlight). */
  readonly depth?: number;
  /** Run steps with `overlap` (readback at a later submit; `flush()` before one not started). */
  readonly overlap?: boolean;
  /** With `overlap`: deferred readbacks started together (`StepOptions.readbackBatch`). */
  readonly readbackBatch?: number;
}

/** The outcome of a run: per output token, its id, logprob and top logprobs. */
export interface SoloResult {
  readonly tokens: number[];
  readonly logprobs: number[];
  readonly top: (readonly TopLogprob[])[];
}

/** Greedily generates `maxTokens` tokens for `prompt`. */
export async function soloGreedy(
  runner: ModelRunner,
  prompt: readonly number[],
  maxTokens: number,
  options: Pick<SoloOptions, "chunk" | "blocks" | "overlap" | "readbackBatch"> = {},
): Promise<number[]> {
  return (await soloRun(runner, prompt, maxTokens, options)).tokens;
}

/** Keys of the runs' penalty histories on the runner. */
let runs = 0;

/** Greedy generation with optional penalties, logit bias and top logprobs. */
export async function soloRun(
  runner: ModelRunner,
  prompt: readonly number[],
  maxTokens: number,
  options: SoloOptions = {},
): Promise<SoloResult> {
  const key = `solo-${runs++}`;
  try {
    return await run(runner, prompt, maxTokens, options, key);
  } finally {
    // Every step was awaited: the history is no longer read.
    runner.penaltyHistories.free(key);
  }
}

/** {@linkcode soloRun} with its penalty history under `key`. */
async function run(
  runner: ModelRunner,
  prompt: readonly number[],
  maxTokens: number,
  options: SoloOptions,
  key: string,
): Promise<SoloResult> {
  const bs = runner.options.blockSize;
  const blocks = options.blocks ?? Array.from({ length: runner.kv.numBlocks }, (_, i) => i);
  const chunk = options.chunk ?? prompt.length;
  const depth = Math.min(options.depth ?? 6, runner.maxInFlight);
  const table = (len: number) => blocks.slice(0, Math.ceil(len / bs));
  const slot = (pos: number) => blocks[Math.floor(pos / bs)]! * bs + (pos % bs);
  const result: SoloResult = { tokens: [], logprobs: [], top: [] };
  const out = result.tokens;
  /** Runner step of output token i, for every output sampled so far. */
  const steps: number[] = [];
  const pending: StepHandle[] = [];
  const p = options.penalties;
  // The same record every step: the history grows on the GPU.
  const process = p === undefined ? null : {
    repetitionPenalty: p.repetitionPenalty ?? 1,
    presencePenalty: p.presencePenalty ?? 0,
    frequencyPenalty: p.frequencyPenalty ?? 0,
    ...(p.logitBias ? { logitBias: p.logitBias } : {}),
    history: { key, promptTokens: prompt },
  };
  const sample = () => ({
    sample: { temperature: 0 },
    process,
    topLogprobs: options.topLogprobs ?? 0,
  });
  const stepOptions = { overlap: options.overlap === true, readbackBatch: options.readbackBatch };
  const collect = async () => {
    // An overlapped step's readback starts with a later execute, or here.
    const r = await pending[out.length]!.wait();
    out.push(r.tokens[0]!);
    result.logprobs.push(r.logprobs[0]!);
    result.top.push(r.top[0]!);
  };
  let done = 0;
  while (done < prompt.length) {
    const n = Math.min(chunk, prompt.length - done);
    const positions = Uint32Array.from({ length: n }, (_, i) => done + i);
    const last = done + n === prompt.length;
    const step = runner.execute({
      inputIds: Uint32Array.from(prompt.slice(done, done + n)),
      positions,
      slotMapping: positions.map(slot),
      seqs: [{
        queryLen: n,
        contextLen: done + n,
        blockTable: table(done + n),
        ...(last ? sample() : { sample: null }),
      }],
    }, stepOptions);
    done += n;
    if (last) {
      pending.push(step);
      steps.push(step.step);
    }
  }
  // Decode steps are submitted without waiting: each feeds on the previous sample on the GPU.
  for (let i = 1; i < maxTokens; i++) {
    const pos = prompt.length + i - 1;
    const step = runner.execute({
      inputIds: Uint32Array.of(runner.sampledRef(steps.at(-1)!, 0)),
      positions: Uint32Array.of(pos),
      slotMapping: Uint32Array.of(slot(pos)),
      seqs: [{ queryLen: 1, contextLen: pos + 1, blockTable: table(pos + 1), ...sample() }],
    }, stepOptions);
    pending.push(step);
    steps.push(step.step);
    if (pending.length - out.length >= depth) await collect();
  }
  while (out.length < pending.length) await collect();
  return result;
}

/** One step of {@linkcode referenceRun}. */
export interface ReferenceRunStep {
  readonly token: number;
  /** Gap between the two largest processed logits (small: f32 may legitimately differ). */
  readonly gap: number;
  /** Log-softmax of the raw logits at the chosen token. */
  readonly rawLogprob: number;
  /** The top `topLogprobs` of the raw logits. */
  readonly top: { ids: number[]; logprobs: number[] };
}

/**
 * The float64 reference of {@linkcode soloRun}: at each step the whole sequence's logits from
 * `ref.forward`, the last row processed with the same penalties (`logitsProcessRef`), argmax
 * (lowest id on ties), and the raw row's top logprobs.
 */
export function referenceRun(
  ref: ReferenceModel,
  prompt: readonly number[],
  maxTokens: number,
  penalties: SoloPenalties = {},
  topLogprobs = 0,
): ReferenceRunStep[] {
  const tokens = [...prompt];
  const output: number[] = [];
  const steps: ReferenceRunStep[] = [];
  for (let s = 0; s < maxTokens; s++) {
    const logits = ref.forward(tokens);
    const vocab = logits.cols;
    const raw = logits.data.subarray((logits.rows - 1) * vocab);
    const row = logitsProcessRef(raw, vocab, [{
      repetition: penalties.repetitionPenalty ?? 1,
      presence: penalties.presencePenalty ?? 0,
      frequency: penalties.frequencyPenalty ?? 0,
      prompt,
      output,
      bias: [...(penalties.logitBias ?? [])],
    }]);
    let best = 0;
    for (let i = 1; i < vocab; i++) if (row[i]! > row[best]!) best = i;
    let second = -Infinity;
    for (let i = 0; i < vocab; i++) if (i !== best && row[i]! > second) second = row[i]!;
    const all = topLogprobsRef(raw, vocab);
    steps.push({
      token: best,
      gap: row[best]! - second,
      rawLogprob: all.logprobs[all.ids.indexOf(best)]!,
      top: { ids: all.ids.slice(0, topLogprobs), logprobs: all.logprobs.slice(0, topLogprobs) },
    });
    tokens.push(best);
    output.push(best);
  }
  return steps;
}

/** Options of {@linkcode assertGreedyMatchesReference}. */
export interface GreedyComparison {
  /**
   * Prompt lengths in order (random tokens): the first three always run, the others only while
   * fewer than `minCompared` steps were compared (a random tiny model sometimes has near-ties
   * early).
   */
  readonly lengths: readonly number[];
  /** Tokens generated per prompt. */
  readonly maxTokens: number;
  /** Steps that must have been compared over all prompts. */
  readonly minCompared: number;
  /** A reference step whose top-2 logits are closer than this is a near-tie: the prompt ends there. */
  readonly gapTolerance: number;
  /** Sees each prompt and the reference's steps (e.g. to hold them against another reference). */
  readonly each?: (prompt: readonly number[], steps: readonly ReferenceStep[]) => void;
}

/**
 * The comparison of the weight-format tests (int8 / int4, FP8, packed-integer checkpoints): six
 * prompt lengths, 24 tokens each, near-ties below a top-2 logit gap of 1e-3.
 */
export const CHECKPOINT_GREEDY: GreedyComparison = {
  lengths: [1, 9, 33, 5, 17, 48],
  maxTokens: 24,
  minCompared: 24,
  gapTolerance: 1e-3,
};

/**
 * Asserts that `runner`'s greedy tokens equal `ref`'s on random prompts (blocks shuffled), each
 * up to its first near-tie, and that at least `minCompared` steps were compared; `seed` names
 * the run in the messages.
 */
export async function assertGreedyMatchesReference(
  runner: ModelRunner,
  ref: ReferenceModel,
  rng: Rng,
  seed: number,
  options: GreedyComparison,
): Promise<void> {
  const { maxTokens, minCompared, gapTolerance } = options;
  let compared = 0;
  for (const [k, len] of options.lengths.entries()) {
    if (k >= 3 && compared >= minCompared) break;
    const prompt = Array.from({ length: len }, () => rng.int(0, 500));
    const steps = ref.greedy(prompt, maxTokens);
    const got = await soloGreedy(runner, prompt, maxTokens, {
      blocks: rng.permutation(runner.options.numKvBlocks),
    });
    for (let i = 0; i < steps.length && steps[i]!.gap >= gapTolerance; i++, compared++) {
      if (got[i] !== steps[i]!.token) {
        throw new Error(
          `seed ${seed} prompt ${len}, step ${i}: token ${got[i]}, the reference's ${
            steps[i]!.token
          }`,
        );
      }
    }
    options.each?.(prompt, steps);
  }
  if (compared < minCompared) {
    throw new Error(
      `seed ${seed}: only ${compared} steps had a gap >= ${gapTolerance} (${minCompared} needed)`,
    );
  }
}

/** Prompts {@linkcode assertFollowsReference} draws, at most, for one where the references part. */
const MORE_PROMPTS = 16;

/**
 * Draws prompts (1 to 48 random tokens) until the greedy tokens of `ref` (a model that differs
 * from `plain` by design: quantized weights, a rounded KV cache) leave `plain`'s before ref's
 * first near-tie, and asserts that `runner` produces `ref`'s tokens there, so not the plain
 * ones: a runner that ignored the difference would fail. `what` names the difference in the
 * messages. Throws when no prompt of {@linkcode MORE_PROMPTS} parts the references.
 */
export async function assertFollowsReference(
  runner: ModelRunner,
  ref: ReferenceModel,
  plain: ReferenceModel,
  rng: Rng,
  seed: number,
  what: string,
  options: Pick<GreedyComparison, "maxTokens" | "gapTolerance"> = CHECKPOINT_GREEDY,
): Promise<void> {
  const { maxTokens, gapTolerance } = options;
  for (let k = 0; k < MORE_PROMPTS; k++) {
    const prompt = Array.from({ length: rng.int(1, 48) }, () => rng.int(0, 500));
    const steps = ref.greedy(prompt, maxTokens);
    const sure = steps.findIndex((s) => s.gap < gapTolerance);
    const compared = steps.slice(0, sure < 0 ? steps.length : sure).map((s) => s.token);
    const other = plain.greedy(prompt, maxTokens).map((s) => s.token);
    if (compared.every((t, i) => t === other[i])) continue;
    const got = (await soloGreedy(runner, prompt, maxTokens)).slice(0, compared.length);
    if (got.some((t, i) => t !== compared[i])) {
      throw new Error(
        `seed ${seed}, prompt of ${prompt.length}: tokens [${got}], the ${what} reference's ` +
          `[${compared}] (the plain one's [${other.slice(0, compared.length)}])`,
      );
    }
    return;
  }
  throw new Error(`seed ${seed}: ${what} changed no token in ${MORE_PROMPTS} more prompts`);
}

/**
 * {@linkcode assertGreedyMatchesReference} against `ref` with {@linkcode CHECKPOINT_GREEDY}, where
 * `ref` is a model that differs from `plain` by design (`what`: quantized weights, a rounded KV
 * cache). Were `ref`'s tokens always `plain`'s, the test could not tell a runner that ignores the
 * difference: when no prompt compared parted the two, {@linkcode assertFollowsReference} draws
 * more until they part, and the runner must follow `ref` there. `plain` null: no such check.
 */
export async function assertGreedyMatchesChangedReference(
  runner: ModelRunner,
  ref: ReferenceModel,
  plain: ReferenceModel | null,
  rng: Rng,
  seed: number,
  what: string,
): Promise<void> {
  let differsFromPlain = false;
  await assertGreedyMatchesReference(runner, ref, rng, seed, {
    ...CHECKPOINT_GREEDY,
    each: (prompt, steps) => {
      if (plain === null || differsFromPlain) return;
      const other = plain.greedy(prompt, CHECKPOINT_GREEDY.maxTokens).map((s) => s.token);
      if (other.some((t, i) => t !== steps[i]!.token)) differsFromPlain = true;
    },
  });
  if (plain !== null && !differsFromPlain) {
    await assertFollowsReference(runner, ref, plain, rng, seed, what);
  }
}
