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
 * `LLMEngine.create` and `LLMEngine.createMock` wrap it. The steps in flight are in
 * step_pipeline.ts, a request's output queue in live_request.ts. This file stays a little over
 * 400 lines: it is the one place of the request lifecycle (intake, admission, postprocess,
 * finish, failure), which reads best whole.
 *
 * @module
 */

import { BadWords, badWordTokenIds } from "./bad_words.ts";
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
} from "./engine_api.ts";
import { type EngineParts, type Logger, setupEngine, setupMockEngine } from "./engine_setup.ts";
import type { Executor, SampledToken, ScoredPromptToken } from "./executors/executor.ts";
import type { GpuContext } from "../gpu/context.ts";
import type { DeviceMemoryReader } from "../gpu/device_memory.ts";
import {
  checkServable,
  checkTokenIds,
  STRUCTURED_PARAM,
  validateSamplingParams,
} from "./input_processor.ts";
import { LiveRequest } from "./live_request.ts";
import { RequestOutputState } from "./output_processor.ts";
import { StepPipeline } from "./step_pipeline.ts";
import type { Tokenizer } from "./tokenizer.ts";
import type { Scheduler } from "../scheduler/scheduler_api.ts";
import {
  endsRequests,
  hasDeviceWork,
  type ScheduledRequest,
  type SchedulerOutput,
} from "../scheduler/scheduler_output.ts";
import type { SamplingParams } from "../scheduler/sampling_params.ts";

export { type Logger, resolveMaxModelLen } from "./engine_setup.ts";

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
  /** The steps in flight. */
  readonly #pipeline: StepPipeline;
  readonly #kvBlocks: number;
  readonly #live = new Map<string, LiveRequest>();
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
    this.#pipeline = new StepPipeline(
      Math.min(parts.config.maxInFlight ?? Infinity, parts.executor.maxInFlight),
    );
    parts.ctx?.failed.then((error) => this.#fail(error));
  }

  /**
   * Validates `options`, loads the model (WebGPU executor) or sets up the mock executor, sizes
   * the KV cache and logs what was chosen. `readMemory` reads the GPU's memory for the KV
   * cache's size (default: gpu/device_memory.ts `readDeviceMemory`, nvidia-smi's figures).
   */
  static async create(
    options: EngineOptions = {},
    log: Logger = () => {},
    readMemory?: DeviceMemoryReader,
  ): Promise<LLMEngine> {
    return new LLMEngine(await setupEngine(options, log, readMemory));
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
        ...(request.cacheSalt === undefined ? {} : { cacheSalt: request.cacheSalt }),
      });
    checkServable(request.params, {
      executor: this.#executor.kind,
      hasTokenizer: this.tokenizer !== null,
    });
    const spec = request.params.structuredOutput;
    const words = request.params.badWords;
    if (spec === null) admit();
    // One increment per step with new tokens, even when their text is held back or empty (as
    // vLLM streams): clients see every token arrive, e.g. for TTFT and ITL.
    const state = new RequestOutputState(this.tokenizer, {
      requestId: id,
      promptTokenIds: request.promptTokenIds,
      params: request.params,
    }, { emitTokenOnly: true });
    const live = new LiveRequest(
      state,
      request.params,
      this.model.vocabSize,
      words === null ? null : new BadWords(badWordTokenIds(this.tokenizer!, words)),
    );
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
      const loop: Promise<void> = this.#run().finally(() => {
        if (this.#loop === loop) this.#loop = null;
      });
      this.#loop = loop;
    }
  }

  async #run(): Promise<void> {
    while (!this.#stopped && this.#error === null) {
      try {
        // 1. Schedule and run: fill the pipeline.
        const idle = await this.#fill();
        // 2. Postprocess the oldest step once its tokens are back, and the empty steps queued
        // behind it (they have nothing to wait for).
        const oldest = this.#pipeline.shift();
        if (oldest !== undefined) {
          // Its readback may be waiting for a later submit (overlapped steps): start it now.
          if (!oldest.readbackStarted()) this.#executor.flush?.();
          const sampled = await oldest.result;
          const scored = await oldest.promptLogprobs;
          if (this.#stopped) break;
          if (scored !== undefined) this.#score(oldest.output, scored);
          this.#postprocess(oldest.output, sampled);
          for (const empty of this.#pipeline.shiftEmpty()) this.#postprocess(empty, new Map());
          // With a synchronous device the next submit blocks for a whole step: first give the
          // event loop a turn, so the increments just emitted reach their consumers (and their
          // HTTP chunks are written) now rather than after that step.
          if (this.#pipeline.synchronousDevice) await new Promise((r) => setTimeout(r, 0));
          // Progress is possible unless the last schedule was empty and nothing real is in
          // flight.
          if (!idle || this.#pipeline.length > 0) continue;
        }
        // 3. Nothing to run now.
        if (!(await this.#waitForWork())) {
          // A request that arrived while waitForWork returned found this loop still running
          // (its kick did nothing): serve it. Otherwise end, marking the loop gone before the
          // next turn of the event loop, so that the next request starts a new one.
          if (this.#live.size > 0 || this.#scheduler.hasUnfinishedRequests()) continue;
          this.#loop = null;
          return;
        }
      } catch (error) {
        this.#fail(error instanceof Error ? error : new Error(String(error)));
      }
    }
  }

  /**
   * Schedules and submits steps while the pipeline has room; true when a schedule came back
   * empty (then it is queued, to be applied in order like any other, and filling stops).
   */
  async #fill(): Promise<boolean> {
    while (this.#pipeline.hasRoom) {
      // The masks of the tokens just read back are computed in the grammar worker: wait for
      // them (unless it is compiling a grammar first) so those requests run now.
      if (this.#structured.active) await this.#structured.settled();
      const output = this.#scheduler.schedule();
      for (const r of output.scheduled) if (r.isNew) this.#live.get(r.requestId)?.scheduled();
      if (!hasDeviceWork(output)) {
        this.#reportEndedIn(output);
        this.#pipeline.pushEmpty(output);
        return true;
      }
      const landing = this.#executor.swapInReady?.(output);
      if (landing !== undefined) await landing;
      const masks = this.#masks(output);
      const step = this.#pipeline.submit(this.#executor, output, masks);
      for (const [id, error] of step.failed ?? []) this.#failRequest(id, error);
      this.#steps++;
    }
    return false;
  }

  /**
   * The token masks of `output`'s sampling requests: their grammar's next mask (structured
   * outputs), or their `allowed_token_ids` mask less what their bad words ban now (a grammar is
   * never combined with those: engine/input_processor.ts).
   */
  #masks(output: SchedulerOutput): Map<string, Uint32Array> | undefined {
    let masks = this.#structured.active ? this.#structured.masks(output) : undefined;
    for (const r of output.scheduled) {
      const mask = r.samplesToken ? this.#live.get(r.requestId)?.nextMask() : null;
      if (mask !== null && mask !== undefined) (masks ??= new Map()).set(r.requestId, mask);
    }
    return masks;
  }

  /**
   * Waits on a timer or an arrival (awaiting resolved promises in a loop would starve Deno's
   * event loop: no I/O, no timers). False when the engine is idle and the loop should end (the
   * next request restarts it).
   */
  async #waitForWork(): Promise<boolean> {
    const scheduler = this.#scheduler;
    if (!scheduler.hasUnfinishedRequests()) {
      // One more (empty) step, so the executor learns of the requests ended since the last.
      const output = scheduler.schedule();
      this.#reportEndedIn(output);
      this.#postprocess(output, new Map());
      if (this.#live.size === 0) return false;
      await this.#sleep(null);
      return true;
    }
    // A batching baseline is collecting a batch: wake at its deadline or on an arrival.
    const wake = scheduler.wakeTime();
    if (wake === null) scheduler.flush();
    await this.#sleep(wake === null ? 1 : Math.max(0, wake - Date.now()));
    return true;
  }

  /**
   * Hands an output that schedules nothing to the executor when it lists ended requests: the
   * executor learns the request lifecycle from the outputs alone.
   */
  #reportEndedIn(output: SchedulerOutput): void {
    if (endsRequests(output)) this.#executor.execute(output);
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

  /** Hands a step's scored prompt tokens to their requests (before the step's tokens). */
  #score(output: SchedulerOutput, scored: ReadonlyMap<string, readonly ScoredPromptToken[]>): void {
    for (const r of output.scheduled) {
      const tokens = scored.get(r.requestId);
      if (tokens !== undefined && this.#current(r)) {
        this.#live.get(r.requestId)?.state.scorePrompt(tokens);
      }
    }
  }

  /**
   * Whether `r`'s request is still the live one of its id (not ended, its id not reused by a
   * newer request since the step was scheduled).
   */
  #current(r: ScheduledRequest): boolean {
    return this.#scheduler.getRequest(r.requestId)?.order === r.order;
  }

  /** Applies a step's tokens: stop checks, detokenization, stop strings, increments. */
  #postprocess(output: SchedulerOutput, sampled: ReadonlyMap<string, SampledToken>): void {
    for (const r of output.scheduled) {
      if (r.isNew && this.#current(r)) {
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
      // A token that stopped the request (EOS, stop_token_ids) leaves its text out (vLLM v1).
      const { generated, stopString } = live.accept(
        u.newTokenIds,
        sampled.get(u.requestId),
        u.finishReason === "stop",
      );
      this.#generationTokens += generated;
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
