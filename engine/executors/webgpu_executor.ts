/**
 * The WebGPU executor: turns each {@linkcode SchedulerOutput} into a {@linkcode ForwardBatch}
 * for the {@linkcode ModelRunner}, and performs the scheduler's swap copies between the KV
 * cache and a bounded host-memory pool (engine/executors/swap_space.ts). A request that cannot
 * be sampled in a step (see {@linkcode WebGpuExecutor.samplingOf}) fails alone: the step runs
 * for every other request.
 *
 * Tokens the host does not know yet ({@linkcode SAMPLED_TOKEN}) are fed from the GPU ring of
 * sampled tokens through `runner.sampledRef`, so no step waits for a readback. Sampling is
 * seeded per request (the request's seed, or one drawn from the engine's generator) with the
 * token's position as counter: the same request gives the same tokens whatever the batch.
 *
 * Logits processing (vLLM / OpenAI `repetition_penalty`, `presence_penalty`,
 * `frequency_penalty`, `logit_bias`) and `logprobs` / `top_logprobs` run on the GPU in the same
 * step. Penalties must see every output token so far, including those sampled by steps still in
 * flight: the runner keeps each penalised request's tokens on the GPU, under its request id
 * (`LogitsProcessing.history`), and appends each step the request's last fed token, which is
 * its newest output token whatever preemptions happened in between (a decode step feeds the
 * previous sample; a recompute ends on the newest known output, the earlier ones being in the
 * history already). The executor passes only the request id and its prompt (used when the
 * history is created): a step's host work does not grow with the output.
 *
 * Per-request state (seeds, penalised prompts, the runner's penalty histories) follows the
 * lifecycle in each {@linkcode SchedulerOutput}: created for its `newRequests` (a history on
 * the request's first sampled step), dropped for its `finished` and `aborted` ids.
 *
 * @module
 */

import { kernelSeed, type SamplingParams } from "../../scheduler/sampling_params.ts";
import {
  SAMPLED_TOKEN,
  type ScheduledRequest,
  type SchedulerOutput,
} from "../../scheduler/scheduler_output.ts";
import { checkLogitsProcessParams } from "../../kernels/logits_process.ts";
import { checkSampleParams } from "../../kernels/sample.ts";
import { TOP_LOGPROBS_MAX } from "../../kernels/top_logprobs.ts";
import type { ForwardBatch, SequenceChunk } from "../forward_batch.ts";
import type { ModelRunner, SampledRows } from "../model_runner.ts";
import type { ExecutedStep, Executor, SampledToken, ScoredPromptToken } from "./executor.ts";
import { SwapSpace } from "./swap_space.ts";

/** Options of {@linkcode WebGpuExecutor}. */
export interface WebGpuExecutorOptions {
  /** Host swap slots (blocks), 0 for none. */
  readonly numSwapBlocks: number;
  /** Seeds for requests without one. */
  readonly seedSource: () => number;
  /**
   * Defer each step's readback to a later step's submit (`StepOptions.overlap`), so the host
   * encodes a step while the GPU runs the previous ones; the engine then calls
   * {@linkcode WebGpuExecutor.flush} before it waits on a step whose readback has not started.
   * Default false.
   */
  readonly overlapSteps?: boolean;
  /**
   * With `overlapSteps`: the readbacks of decode-only steps start this many at a time
   * (`StepOptions.readbackBatch`; the GPU waits for the host once per this many steps); a step
   * that prefills, or samples under a grammar's token mask, starts its own at the next step, so
   * neither a first token nor a constrained request's next step is held back. Default 1.
   */
  readonly readbackBatch?: number;
}

/** One request's row in a step's sampler (see {@linkcode WebGpuExecutor.samplingOf}). */
export interface SampledRow {
  readonly sample: NonNullable<SequenceChunk["sample"]>;
  readonly process: SequenceChunk["process"];
  readonly topLogprobs: number;
}

/** One step's runner batch and what its sampled rows stand for. */
interface StepPlan {
  readonly batch: ForwardBatch;
  /** Request id of each sampled row, in row order. */
  readonly samplers: string[];
  /** Each scored prompt position's request and position, in row order (after the samplers). */
  readonly scored: { readonly requestId: string; readonly position: number }[];
  /** Requests that cannot be sampled this step: they fail alone (see `samplingOf`). */
  readonly failed: Map<string, Error>;
}

/** The tokens of a step read back, by request id. */
function collect(rows: SampledRows, plan: StepPlan): Map<string, SampledToken> {
  const map = new Map<string, SampledToken>();
  plan.samplers.forEach((id, row) => {
    const tokenId = rows.tokens[row]!;
    const top = rows.top[row] ?? [];
    // A processed row's own logprob is under the processed logits; the raw value is known when
    // the token is among the raw top tokens.
    const raw = top.find((e) => e.tokenId === tokenId);
    map.set(id, {
      tokenId,
      logprob: raw?.logprob ?? rows.logprobs[row]!,
      ...(top.length > 0 ? { top } : {}),
    });
  });
  return map;
}

/** The scored prompt tokens of a step read back, by request id. */
function collectPrompt(
  rows: SampledRows,
  plan: StepPlan,
): Map<string, readonly ScoredPromptToken[]> {
  const map = new Map<string, ScoredPromptToken[]>();
  plan.scored.forEach(({ requestId, position }, j) => {
    const row = rows.prompt[j]!;
    let list = map.get(requestId);
    if (list === undefined) map.set(requestId, list = []);
    list.push({
      position,
      tokenId: row.tokenId,
      logprob: row.logprob,
      rank: row.rank,
      top: row.top,
    });
  });
  return map;
}

/** True when `p` needs the output so far (a penalty is on). */
function penalised(p: SamplingParams): boolean {
  return p.repetitionPenalty !== 1 || p.presencePenalty !== 0 || p.frequencyPenalty !== 0;
}

/** See the module documentation. */
export class WebGpuExecutor implements Executor {
  readonly kind = "webgpu" as const;
  readonly runner: ModelRunner;
  readonly #seeds = new Map<string, number>();
  readonly #seedSource: () => number;
  /** Scheduler step -> runner step, for steps whose samples may still be fed from the GPU. */
  readonly #runnerStep = new Map<number, number>();
  /** Penalised requests' prompts (their histories are the runner's; see the module doc). */
  readonly #penalised = new Map<string, readonly number[]>();
  /** Requests whose penalty history the step being planned creates (see `samplingOf`). */
  readonly #newHistories = new Set<string>();
  /** The host swap pool and the copies to and from it. */
  readonly #swap: SwapSpace;
  readonly #overlap: boolean;
  readonly #readbackBatch: number;

  constructor(runner: ModelRunner, options: WebGpuExecutorOptions) {
    this.runner = runner;
    this.#seedSource = options.seedSource;
    this.#overlap = options.overlapSteps ?? false;
    this.#readbackBatch = options.readbackBatch ?? 1;
    this.#swap = new SwapSpace(runner.ctx, runner.kv, options.numSwapBlocks);
  }

  get maxInFlight(): number {
    return this.runner.maxInFlight;
  }

  /** Drops the state of the ended requests, then starts that of the new ones (the contract's order). */
  #track(output: SchedulerOutput): void {
    for (const ids of [output.finished, output.aborted]) {
      for (const id of ids) {
        this.#seeds.delete(id);
        this.#penalised.delete(id);
        // Its last steps' appends are queued before any later reuse of the slot.
        this.runner.penaltyHistories.free(id);
      }
    }
    for (const r of output.newRequests) {
      if (penalised(r.params)) this.#penalised.set(r.requestId, r.promptTokenIds);
    }
  }

  /**
   * Requests whose state the executor or its runner holds (seeds, penalised prompts, penalty
   * histories on the GPU): for leak checks.
   */
  get numTracked(): number {
    const ids = [...this.#seeds.keys(), ...this.#penalised.keys()];
    return new Set([...ids, ...this.runner.penaltyHistories.keys()]).size;
  }

  /** Starts the deferred readbacks (see `overlapSteps`). */
  flush(): void {
    this.runner.flush();
  }

  swapInReady(output: SchedulerOutput): Promise<void> | undefined {
    return this.#swap.ready(output);
  }

  /**
   * @throws {RangeError} when `output` swaps in a block whose swap-out has not reached host
   *   memory (await {@linkcode WebGpuExecutor.swapInReady} first), or moves blocks without swap
   *   space.
   */
  execute(output: SchedulerOutput, tokenMasks?: ReadonlyMap<string, Uint32Array>): ExecutedStep {
    this.#track(output);
    this.#swap.copy(output);
    if (output.scheduled.length === 0) {
      // No runner step to start the previous one's deferred readback: start it here, so every
      // step the engine submitted before this one has its readback under way.
      this.runner.flush();
      return { result: Promise.resolve(new Map()) };
    }
    const plan = this.#plan(output, tokenMasks);
    // A first token, or one a grammar or bad words wait for before the request's next step (any
    // step with token masks, allowed_token_ids' fixed ones too): read back at the next step, not
    // batched.
    const batched = output.scheduled.every((r) => r.numTokens === 1 && !r.isNew) &&
      (tokenMasks === undefined || tokenMasks.size === 0);
    const handle = this.runner.execute(plan.batch, {
      overlap: this.#overlap,
      readbackBatch: batched ? this.#readbackBatch : 1,
    });
    this.#runnerStep.set(output.step, handle.step);
    // Steps the ring has moved past can no longer be fed from.
    for (const [step, runnerStep] of this.#runnerStep) {
      if (handle.step - runnerStep > this.runner.maxInFlight) this.#runnerStep.delete(step);
    }
    const result = handle.result.then((rows) => collect(rows, plan));
    const step: ExecutedStep = {
      result,
      readbackStarted: handle.readbackStarted,
      ...(plan.scored.length > 0
        ? { promptLogprobs: handle.result.then((rows) => collectPrompt(rows, plan)) }
        : {}),
    };
    return plan.failed.size > 0 ? { ...step, failed: plan.failed } : step;
  }

  /** The runner's batch for `output` and what its sampled rows stand for. */
  #plan(output: SchedulerOutput, tokenMasks?: ReadonlyMap<string, Uint32Array>): StepPlan {
    const n = output.totalTokens;
    const batch = {
      inputIds: new Uint32Array(n),
      positions: new Uint32Array(n),
      slotMapping: new Uint32Array(n),
      seqs: [] as SequenceChunk[],
    };
    const plan: StepPlan = { batch, samplers: [], scored: [], failed: new Map() };
    this.#newHistories.clear();
    let t = 0;
    for (const r of output.scheduled) {
      for (let i = 0; i < r.numTokens; i++, t++) {
        batch.inputIds[t] = this.#inputId(r, i);
        batch.positions[t] = r.positionStart + i;
        batch.slotMapping[t] = r.slotMapping[i]!;
      }
      const contextLen = r.positionStart + r.numTokens;
      const prompt = r.promptLogprobs ?? null;
      const chunk = {
        queryLen: r.numTokens,
        contextLen,
        blockTable: r.blockTable,
        ...(prompt === null ? {} : { promptLogprobs: prompt }),
      };
      if (prompt !== null) {
        prompt.targets.forEach((_, j) => {
          // The token at position p + 1 is scored by the row of position p.
          plan.scored.push({
            requestId: r.requestId,
            position: r.positionStart + prompt.first + j + 1,
          });
        });
      }
      const row = this.#rowOrFallback(r, contextLen, plan.failed);
      if (row === null) {
        batch.seqs.push({ ...chunk, sample: null });
        continue;
      }
      batch.seqs.push({
        ...chunk,
        sample: row.sample,
        process: row.process,
        topLogprobs: row.topLogprobs,
        tokenMask: tokenMasks?.get(r.requestId) ?? null,
      });
      plan.samplers.push(r.requestId);
    }
    return plan;
  }

  /** The runner input id of fed token `i` of `r`: a vocabulary id or a sampled-token ref. */
  #inputId(r: ScheduledRequest, i: number): number {
    const id = r.tokenIds[i]!;
    if (id !== SAMPLED_TOKEN) return id;
    const from = r.sampledFrom;
    const step = from === null ? undefined : this.#runnerStep.get(from.step);
    if (from === null || step === undefined) {
      throw new RangeError(
        `Cannot feed request "${r.requestId}": its sampled token is no longer on the GPU`,
      );
    }
    return this.runner.sampledRef(step, from.row);
  }

  /**
   * {@linkcode samplingOf}, or for a request that cannot be sampled (recorded in `failed`) a
   * greedy row: the step still runs for every request (same rows, same shapes) and the engine
   * ends this one with the error.
   */
  #rowOrFallback(
    r: ScheduledRequest,
    contextLen: number,
    failed: Map<string, Error>,
  ): SampledRow | null {
    try {
      return this.samplingOf(r, contextLen);
    } catch (error) {
      failed.set(r.requestId, error instanceof Error ? error : new Error(String(error)));
      return r.samplesToken
        ? { sample: { temperature: 0, counter: 0 }, process: null, topLogprobs: 0 }
        : null;
    }
  }

  /**
   * The sampled row of scheduled request `r` in a step ending at `contextLen` (null when it
   * samples nothing this step): its sampling record, logits processing and top-logprob count,
   * checked with the packers' own rules. Also seeds the request on its first step after an
   * admission.
   *
   * @throws {RangeError} when the request cannot be sampled (an out-of-range parameter, a
   *   context shorter than its prompt, no penalty history left on the runner);
   *   {@linkcode execute} then fails that request alone.
   */
  samplingOf(r: ScheduledRequest, contextLen: number): SampledRow | null {
    const p = r.params;
    if (r.isNew || !this.#seeds.has(r.requestId)) {
      this.#seeds.set(r.requestId, p.seed === null ? this.#seedSource() : kernelSeed(p.seed));
    }
    if (!r.samplesToken) return null;
    const prompt = penalised(p) ? this.#penalised.get(r.requestId) : undefined;
    if (penalised(p) && prompt === undefined) {
      throw new RangeError(
        `Cannot penalise request "${r.requestId}": it was never listed in newRequests`,
      );
    }
    if (prompt !== undefined && contextLen < prompt.length) {
      throw new RangeError(
        `Cannot penalise request "${r.requestId}": it samples at ${contextLen} tokens, inside its prompt of ${prompt.length}`,
      );
    }
    const bias = p.logitBias !== null && p.logitBias.size > 0 ? { logitBias: p.logitBias } : {};
    let process: SequenceChunk["process"] = null;
    if (prompt !== undefined) {
      process = {
        repetitionPenalty: p.repetitionPenalty,
        presencePenalty: p.presencePenalty,
        frequencyPenalty: p.frequencyPenalty,
        history: { key: r.requestId, promptTokens: prompt },
        ...bias,
      };
    } else if ("logitBias" in bias) {
      process = bias;
    }
    const sample = {
      temperature: p.temperature,
      topK: p.topK,
      topP: p.topP,
      minP: p.minP,
      seed: this.#seeds.get(r.requestId)!,
      counter: contextLen,
    };
    checkSampleParams(sample);
    if (process !== null) checkLogitsProcessParams(process);
    const topLogprobs = p.logprobs ?? 0;
    if (!(Number.isInteger(topLogprobs) && topLogprobs >= 0 && topLogprobs <= TOP_LOGPROBS_MAX)) {
      throw new RangeError(
        `Cannot sample request "${r.requestId}": logprobs must be 0 to ${TOP_LOGPROBS_MAX}`,
      );
    }
    if (prompt !== undefined) this.#reserveHistory(r.requestId);
    return { sample, process, topLogprobs };
  }

  /**
   * Counts a penalised request's history against the runner's capacity: the step creates it
   * when the request has none yet.
   *
   * @throws {RangeError} when every history the runner can hold is taken.
   */
  #reserveHistory(requestId: string): void {
    const h = this.runner.penaltyHistories;
    if (h.has(requestId) || this.#newHistories.has(requestId)) return;
    if (h.inUse + this.#newHistories.size >= h.capacity) {
      throw new RangeError(
        `Cannot penalise request "${requestId}": the runner holds ${h.capacity} penalty histories, all in use`,
      );
    }
    this.#newHistories.add(requestId);
  }

  destroy(): void {
    this.runner.destroy();
  }
}
