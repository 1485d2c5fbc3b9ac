/**
 * The engine: requests in, streams of output increments out. Each iteration of its loop reads as
 * nano-vllm's step: **schedule** (the scheduler decides which requests compute how many tokens),
 * **run** (the executor submits the step to the GPU and returns at once), **postprocess** (when
 * a step's sampled tokens are read back: stop checks, detokenization, stop strings, increments).
 *
 * Asynchronous scheduling: a readback costs >= 10 ms in Deno whatever the GPU does, so the loop
 * keeps up to `maxInFlight` steps submitted before it awaits the oldest one's tokens. Sampled
 * tokens feed the next step on the GPU. A stop discovered late (EOS, a stop string) costs at most
 * `maxInFlight - 1` discarded steps of that request, never a wrong output: tokens computed after
 * a request finished are dropped by the scheduler.
 *
 * Construction (options, model loading, KV cache sizing, the scheduler) is in engine_setup.ts;
 * `LLMEngine.create` and `LLMEngine.createMock` wrap it.
 *
 * @module
 */

import type { StructuredOutputs } from "./structured_output/structured_outputs.ts";
import type { StructuredOutputSpec } from "../scheduler/sampling_params.ts";
import type { EngineConfig, EngineOptions } from "./engine_config.ts";
import {
  type EngineClient,
  EngineDeadError,
  EngineOverloadedError,
  type EngineStats,
  type FinishReason,
  type GenerateRequest,
  type ModelInfo,
  RequestFailedError,
  type RequestOutput,
  type TokenLogprob,
} from "./engine_api.ts";
import { type EngineParts, type Logger, setupEngine, setupMockEngine } from "./engine_setup.ts";
import type { Executor, SampledToken } from "./executors/executor.ts";
import type { GpuContext } from "../gpu/context.ts";
import { checkTokenIds, InvalidParameterError, validateSamplingParams } from "./input_processor.ts";
import { LiveRequest } from "./live_request.ts";
import { RequestOutputState } from "./output_processor.ts";
import type { Tokenizer } from "./tokenizer.ts";
import type { Scheduler } from "../scheduler/scheduler_api.ts";
import type { SchedulerOutput } from "../scheduler/scheduler_output.ts";
import type { SamplingParams } from "../scheduler/sampling_params.ts";

export { type Logger, resolveMaxModelLen } from "./engine_setup.ts";

/** The OpenAI / vLLM parameter a structured-output error names, by kind. */
const STRUCTURED_PARAM: Record<StructuredOutputSpec["kind"], string> = {
  json_object: "response_format",
  json_schema: "response_format",
  regex: "structured_outputs.regex",
  choice: "structured_outputs.choice",
  grammar: "structured_outputs.grammar",
  tool_calls: "tools",
};
/** Submit time the engine queues ahead of the oldest step's readback, ms (`#effectiveDepth`). */
const AHEAD_BUDGET_MS = 100;

/** Submissions slower than this (ms, moving average) do the device's work: yield after each. */
const SYNC_SUBMIT_MS = 40;

/** A submitted step awaiting its tokens. */
interface InFlight {
  readonly output: SchedulerOutput;
  readonly result: Promise<ReadonlyMap<string, SampledToken>>;
  /** Nothing was scheduled: no GPU work, nothing to wait for. */
  readonly empty: boolean;
}

/** The engine (see the module documentation). */
export class LLMEngine implements EngineClient {
  readonly config: EngineConfig;
  readonly model: ModelInfo;
  readonly tokenizer: Tokenizer | null;
  /** Sampling defaults from generation_config.json (requests override them). */
  readonly generationDefaults: Partial<SamplingParams>;
  readonly #scheduler: Scheduler;
  readonly #executor: Executor;
  readonly #ctx: GpuContext | null;
  readonly #depth: number;
  /** Moving average of the wall time `executor.execute` takes to return, ms. */
  #submitMs = 0;
  readonly #kvBlocks: number;
  readonly #live = new Map<string, LiveRequest>();
  readonly #inFlight: InFlight[] = [];
  #wake: (() => void) | null = null;
  #loop: Promise<void> | null = null;
  #accepting = true;
  #stopped = false;
  #error: Error | null = null;
  #reportFatal: (error: Error) => void = () => {};
  /**
   * Resolves with the fatal error once the engine cannot continue (device lost, a failed step
   * that no single request explains, a broken invariant); never rejects. A server exits on it
   * so that a supervisor restarts the process (cli/serve.ts).
   */
  readonly failed: Promise<Error> = new Promise((resolve) => (this.#reportFatal = resolve));
  #steps = 0;
  #promptTokens = 0;
  #generationTokens = 0;
  /** Grammar matchers of the constrained requests (structured outputs). */
  readonly #structured: StructuredOutputs;
  /** Constrained requests whose grammar is compiling (not yet in the scheduler). */
  readonly #admitting = new Set<string>();

  private constructor(parts: EngineParts) {
    this.config = parts.config;
    this.model = parts.model;
    this.tokenizer = parts.tokenizer;
    this.generationDefaults = parts.generationDefaults;
    this.#scheduler = parts.scheduler;
    this.#executor = parts.executor;
    this.#ctx = parts.ctx;
    this.#kvBlocks = parts.kvBlocks;
    this.#structured = parts.structured;
    this.#structured.listen(() => this.#kick(), (id, error) => this.#failRequest(id, error));
    this.#depth = Math.max(
      1,
      Math.min(parts.config.maxInFlight ?? Infinity, parts.executor.maxInFlight),
    );
    parts.ctx?.failed.then((error) => this.#fail(error));
  }

  /**
   * Validates `options`, loads the model (WebGPU executor) or sets up the mock executor, sizes
   * the KV cache and logs what was chosen.
   */
  static async create(options: EngineOptions = {}, log: Logger = () => {}): Promise<LLMEngine> {
    return new LLMEngine(await setupEngine(options, log));
  }

  /**
   * A mock-executor engine, built synchronously (no model is loaded; `tokenizer` gives text
   * output when present). Used by `POST /batch/test` and scheduler benchmarks.
   */
  static createMock(
    options: EngineOptions = {},
    tokenizer: Tokenizer | null = null,
    log: Logger = () => {},
  ): LLMEngine {
    return new LLMEngine(setupMockEngine(options, tokenizer, log));
  }

  get error(): Error | null {
    return this.#error;
  }

  generate(request: GenerateRequest, signal?: AbortSignal): AsyncIterable<RequestOutput> {
    if (this.#error !== null) throw new EngineDeadError(`Engine failed: ${this.#error.message}`);
    if (!this.#accepting) throw new EngineDeadError("Engine is shutting down");
    const id = request.requestId;
    if (this.#live.has(id)) throw new RangeError(`Request "${id}" is already running`);
    if (this.#scheduler.stats().numWaiting >= this.config.maxWaitingRequests) {
      throw new EngineOverloadedError(
        `Server is overloaded: ${this.config.maxWaitingRequests} requests are already waiting`,
      );
    }
    if (signal?.aborted) throw new RangeError(`Request "${id}" was aborted before it started`);
    // Input processing: the one set of parameter rules (engine/input_processor.ts).
    checkTokenIds(request.promptTokenIds, this.model, "prompt");
    request = { ...request, params: validateSamplingParams(request.params, this.model) };
    const admit = () =>
      this.#scheduler.addRequest({
        requestId: id,
        promptTokenIds: request.promptTokenIds,
        params: request.params,
        priority: request.priority ?? 0,
      });
    const spec = request.params.structuredOutput;
    if (spec !== null && this.#executor.kind !== "webgpu") {
      throw new InvalidParameterError(
        STRUCTURED_PARAM[spec.kind],
        "Structured outputs need the webgpu executor: the mock executor runs no model to constrain",
      );
    }
    if (spec === null) admit();
    // One increment per step with new tokens, even when their text is held back or empty (as
    // vLLM streams): clients see every token arrive, e.g. for TTFT and ITL.
    const state = new RequestOutputState(this.tokenizer, {
      requestId: id,
      promptTokenIds: request.promptTokenIds,
      params: request.params,
    }, { emitTokenOnly: true });
    const live = new LiveRequest(state, request.params);
    this.#live.set(id, live);
    this.#promptTokens += request.promptTokenIds.length;
    signal?.addEventListener("abort", () => this.abort(id), { once: true });
    // A constrained request enters the scheduler once its grammar is compiled; a grammar that
    // does not compile ends it with an InvalidParameterError (a 400 before any output).
    if (spec !== null) this.#admitConstrained(id, live, spec, admit);
    this.#kick();
    // A consumer that stops early (client gone) frees the request at once.
    return live.stream(() => this.abort(id));
  }

  abort(requestId: string): void {
    const live = this.#live.get(requestId);
    if (live === undefined || live.finished) return;
    if (!this.#admitting.has(requestId)) this.#scheduler.abortRequest(requestId);
    this.#finish(requestId, live, "abort", null);
  }

  /** Compiles a constrained request's grammar, then hands it to the scheduler (see generate). */
  #admitConstrained(
    id: string,
    live: LiveRequest,
    spec: StructuredOutputSpec,
    admit: () => void,
  ): void {
    this.#admitting.add(id);
    const after = live.params.structuredOutputAfter;
    this.#structured.admit(id, spec, STRUCTURED_PARAM[spec.kind], after).then(() => {
      this.#admitting.delete(id);
      if (live.finished || this.#error !== null || this.#stopped) {
        this.#structured.release(id);
        return;
      }
      admit();
      this.#kick();
    }).catch((error) => {
      this.#admitting.delete(id);
      this.#structured.release(id);
      if (live.finished) return;
      live.fail(error instanceof Error ? error : new Error(String(error)));
      this.#live.delete(id);
    });
  }

  /** Requests the executor holds state for (see `Executor.numTracked`): for leak checks. */
  get executorRequests(): number {
    return this.#executor.numTracked;
  }

  stats(): EngineStats {
    const s = this.#scheduler.stats();
    return {
      numRunning: s.numRunning,
      numWaiting: s.numWaiting,
      kvCacheUsage: s.kvCacheUsage,
      kvBlocksUsed: Math.round(s.kvCacheUsage * this.#kvBlocks),
      kvBlocksTotal: this.#kvBlocks,
      promptTokensTotal: this.#promptTokens,
      generationTokensTotal: this.#generationTokens,
      prefixCacheQueries: s.prefixCacheQueries,
      prefixCacheHits: s.prefixCacheHits,
      numPreemptions: s.numPreemptions,
      steps: this.#steps,
    };
  }

  async shutdown(graceMs = 0): Promise<void> {
    this.#accepting = false;
    const deadline = performance.now() + graceMs;
    while (this.#live.size > 0 && performance.now() < deadline && this.#error === null) {
      await new Promise((r) =>
        setTimeout(r, Math.min(20, Math.max(1, deadline - performance.now())))
      );
    }
    for (const id of [...this.#live.keys()]) this.abort(id);
    this.#stopped = true;
    this.#kick();
    await this.#loop;
    this.#structured.close();
    this.#executor.destroy();
    this.#ctx?.destroy();
  }

  /** Starts the loop if idle, or wakes it. */
  #kick(): void {
    if (this.#wake !== null) {
      const wake = this.#wake;
      this.#wake = null;
      wake();
    }
    if (this.#loop === null && !this.#stopped) {
      this.#loop = this.#run().finally(() => (this.#loop = null));
    }
  }

  async #run(): Promise<void> {
    const scheduler = this.#scheduler;
    while (!this.#stopped && this.#error === null) {
      try {
        // 1. Schedule and run: fill the pipeline up to `depth` steps in flight.
        let idle = false;
        while (this.#inFlight.length < this.#effectiveDepth()) {
          // The masks of the tokens just read back are computed in the grammar worker: wait
          // for them (unless it is compiling a grammar first) so those requests run now.
          if (this.#structured.active) await this.#structured.settled();
          const output = scheduler.schedule();
          if (
            output.scheduled.length === 0 && output.swappedIn.length === 0 &&
            output.swappedOut.length === 0
          ) {
            // The executor learns of ended requests from the outputs alone.
            if (output.finished.length > 0 || output.aborted.length > 0) {
              this.#executor.execute(output);
            }
            // Empty steps are applied in order like any other.
            this.#inFlight.push({ output, result: Promise.resolve(new Map()), empty: true });
            idle = true;
            break;
          }
          const landing = this.#executor.swapInReady?.(output);
          if (landing !== undefined) await landing;
          const masks = this.#structured.active ? this.#structured.masks(output) : undefined;
          const t0 = performance.now();
          const step = this.#executor.execute(output, masks);
          this.#submitMs = 0.7 * this.#submitMs + 0.3 * (performance.now() - t0);
          for (const [id, error] of step.failed ?? []) this.#failRequest(id, error);
          // The loop awaits results in order; a step that fails before its turn must not be
          // reported as an unhandled rejection meanwhile (the await below still throws).
          step.result.catch(() => {});
          this.#inFlight.push({ output, result: step.result, empty: false });
          this.#steps++;
        }
        // 2. Postprocess the oldest step once its tokens are back, and the empty steps queued
        // behind it (they have nothing to wait for).
        const oldest = this.#inFlight.shift();
        if (oldest !== undefined) {
          const sampled = await oldest.result;
          if (this.#stopped) break;
          this.#postprocess(oldest.output, sampled);
          while (this.#inFlight[0]?.empty === true) {
            this.#postprocess(this.#inFlight.shift()!.output, new Map());
          }
          // With a synchronous device the next submit blocks for a whole step: first give the
          // event loop a turn, so the increments just emitted reach their consumers (and their
          // HTTP chunks are written) now rather than after that step.
          if (this.#submitMs > SYNC_SUBMIT_MS) await new Promise((r) => setTimeout(r, 0));
          // Progress is possible unless the last schedule was empty and nothing real is in
          // flight.
          if (!idle || this.#inFlight.length > 0) continue;
        }
        // 3. Nothing to run now. Always wait on a timer or an arrival here: awaiting resolved
        // promises in a loop would starve Deno's event loop (no I/O, no timers).
        if (!scheduler.hasUnfinishedRequests()) {
          this.#reportEnded();
          if (this.#live.size === 0) return; // idle: the next request restarts the loop
          await this.#sleep(null);
          continue;
        }
        // A batching baseline is collecting a batch: wake at its deadline or on an arrival.
        const wake = scheduler.wakeTime();
        if (wake === null) scheduler.flush();
        await this.#sleep(wake === null ? 1 : Math.max(0, wake - Date.now()));
      } catch (error) {
        this.#fail(error instanceof Error ? error : new Error(String(error)));
      }
    }
  }

  /**
   * With nothing left to run: one more (empty) step, so the executor learns of the requests
   * that ended since the last output (it knows the lifecycle from the outputs alone).
   */
  #reportEnded(): void {
    const output = this.#scheduler.schedule();
    if (output.finished.length > 0 || output.aborted.length > 0) this.#executor.execute(output);
    this.#postprocess(output, new Map());
  }

  /**
   * Steps to keep in flight now. Pipelining hides Deno's ~10 ms readback latency. Some adapters
   * (lavapipe, measured) do a step's work on the calling thread, inside the executor's
   * `execute` (`queue.submit` and the readback's `mapAsync` call): then every step in flight ahead
   * of a token delays it by a whole step while the event loop is blocked (no HTTP chunk goes
   * out). So the work queued ahead is bounded in time: about {@linkcode AHEAD_BUDGET_MS} of
   * submit time, and never fewer than two steps (the second submit covers the first readback).
   */
  #effectiveDepth(): number {
    if (this.#submitMs <= 1) return this.#depth;
    return Math.max(2, Math.min(this.#depth, Math.floor(AHEAD_BUDGET_MS / this.#submitMs)));
  }

  /** Waits for `ms` (null: until kicked). */
  #sleep(ms: number | null): Promise<void> {
    return new Promise((resolve) => {
      const timer = ms === null ? undefined : setTimeout(() => {
        this.#wake = null;
        resolve();
      }, ms);
      this.#wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  /** Applies a step's tokens: stop checks, detokenization, stop strings, increments. */
  #postprocess(output: SchedulerOutput, sampled: ReadonlyMap<string, SampledToken>): void {
    for (const r of output.scheduled) {
      if (r.isNew) {
        const live = this.#live.get(r.requestId);
        if (live !== undefined) live.state.numCachedTokens = r.numCachedTokens;
      }
    }
    const ids = new Map<string, number>();
    for (const [id, s] of sampled) ids.set(id, s.tokenId);
    const updates = this.#scheduler.updateFromOutput(output, ids);
    for (const u of updates) {
      const live = this.#live.get(u.requestId);
      if (live === undefined || live.finished) continue;
      this.#structured.accept(u.requestId, u.newTokenIds);
      const s = sampled.get(u.requestId);
      const wantTop = (live.params.logprobs ?? 0) > 0;
      const logprobs: TokenLogprob[] | null = live.params.logprobs === null
        ? null
        : u.newTokenIds.map((tokenId) => ({
          tokenId,
          logprob: s?.logprob ?? 0,
          ...(wantTop ? { top: s?.top ?? [] } : {}),
        }));
      const before = live.state.numOutputTokens;
      const { output: increment, stopString } = live.state.push(u.newTokenIds, logprobs);
      // Tokens after a matched stop string are dropped, not counted.
      this.#generationTokens += live.state.numOutputTokens - before;
      if (increment !== null) live.emit(increment);
      if (stopString !== null && u.finishReason === null) {
        this.#scheduler.finishRequest(u.requestId, "stop", stopString);
        this.#finish(u.requestId, live, "stop", stopString);
      } else if (u.finishReason === null && this.#structured.terminated(u.requestId)) {
        // The grammar is complete (its stop token was sampled, e.g. under ignore_eos).
        this.#scheduler.finishRequest(u.requestId, "stop", null);
        this.#finish(u.requestId, live, "stop", null);
      } else if (u.finishReason !== null) {
        this.#finish(u.requestId, live, u.finishReason, u.stopReason);
      }
    }
  }

  #finish(id: string, live: LiveRequest, reason: FinishReason, stop: number | string | null): void {
    live.finish(reason, stop);
    this.#live.delete(id);
    this.#structured.release(id);
  }

  /**
   * One request failed inside a step (it was valid at admission: a bug): it ends with a
   * {@linkcode RequestFailedError}, its KV blocks are freed, every other request goes on.
   */
  #failRequest(id: string, cause: Error): void {
    const live = this.#live.get(id);
    if (live === undefined || live.finished) return;
    this.#scheduler.abortRequest(id);
    live.fail(new RequestFailedError(id, cause));
    this.#live.delete(id);
    this.#structured.release(id);
  }

  /** A fatal error: every live request's stream throws, new requests are refused. */
  #fail(error: Error): void {
    if (this.#error !== null) return;
    this.#error = error;
    this.#reportFatal(error);
    const dead = new EngineDeadError(`Engine failed: ${error.message}`, { cause: error });
    for (const [id, live] of this.#live) {
      live.fail(dead);
      this.#scheduler.abortRequest(id);
    }
    this.#live.clear();
    this.#kick();
  }
}
