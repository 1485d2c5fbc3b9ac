/**
 * {@linkcode LoadingEngine}: what `main.ts serve` serves while the model loads. It answers with
 * the model's name and context length at once, fails requests with 503 until the real engine is
 * handed over, and then forwards everything to it.
 *
 * @module
 */

import {
  type EngineClient,
  EngineDeadError,
  type EngineStats,
  type GenerateRequest,
  type ModelInfo,
  type RequestOutput,
} from "../engine/engine_api.ts";
import type { LLMEngine } from "../engine/llm_engine.ts";
import type { Tokenizer } from "../engine/tokenizer.ts";
import type { SamplingParams } from "../scheduler/sampling_params.ts";

/** The stats reported while no engine is there. */
const IDLE_STATS: EngineStats = {
  numRunning: 0,
  numWaiting: 0,
  kvCacheUsage: 0,
  kvBlocksUsed: 0,
  kvBlocksTotal: 0,
  promptTokensTotal: 0,
  generationTokensTotal: 0,
  prefixCacheQueries: 0,
  prefixCacheHits: 0,
  numPreemptions: 0,
  steps: 0,
};

/**
 * Stands in for the engine while it loads: requests get 503 (EngineDeadError) until
 * {@linkcode LoadingEngine.resolve} hands over the real one.
 */
export class LoadingEngine implements EngineClient {
  readonly #info: ModelInfo;
  #engine: LLMEngine | null = null;
  #error: Error | null = null;

  /** @param info what is known before loading (name, architecture, max_model_len). */
  constructor(info: ModelInfo) {
    this.#info = info;
  }

  /** Hands over the loaded engine. */
  resolve(engine: LLMEngine): void {
    this.#engine = engine;
  }

  /** Records a failed load (`/health` turns 503 for good). */
  reject(error: Error): void {
    this.#error = error;
  }

  get model(): ModelInfo {
    return this.#engine?.model ?? this.#info;
  }

  get tokenizer(): Tokenizer | null {
    return this.#engine?.tokenizer ?? null;
  }

  get generationDefaults(): Partial<SamplingParams> {
    return this.#engine?.generationDefaults ?? {};
  }

  get error(): Error | null {
    return this.#error ?? this.#engine?.error ?? null;
  }

  generate(request: GenerateRequest, signal?: AbortSignal): AsyncIterable<RequestOutput> {
    if (this.#engine === null) throw new EngineDeadError("The model is still loading");
    return this.#engine.generate(request, signal);
  }

  abort(requestId: string): void {
    this.#engine?.abort(requestId);
  }

  stats(): EngineStats {
    return this.#engine?.stats() ?? IDLE_STATS;
  }

  async shutdown(graceMs?: number): Promise<void> {
    await this.#engine?.shutdown(graceMs);
  }
}
