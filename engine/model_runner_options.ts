/**
 * A model runner's sizes fixed at load time, their check, and the weight bytes it reports
 * (engine/model_runner.ts `ModelRunner`).
 *
 * @module
 */

import type { KvCacheDtypeChoice } from "../gpu/dtype.ts";
import type { Quantization, QuantizationChoice } from "../gpu/quant.ts";

/** The model's weight bytes on the device (see {@linkcode WeightLoader.bytes}). */
export interface WeightBytes {
  /** Bytes of every weight buffer on the device. */
  readonly device: number;
  /** The same weights in the device dtype, unquantized. */
  readonly unquantized: number;
  /** Load notes (e.g. a matrix left unquantized, and why). */
  readonly notes: readonly string[];
  /** How the projections are stored (`auto` resolved). */
  readonly quantization: Quantization;
}

/** Sizes fixed at load time. */
export interface ModelRunnerOptions {
  /** Most new tokens in one step (max_num_batched_tokens). */
  readonly maxTokens: number;
  /** Most sequences in one step (max_num_seqs). */
  readonly maxSeqs: number;
  /**
   * Most sampler rows in one step, sampled tokens and scored prompt positions
   * (`prompt_logprobs`) together, when more than `maxSeqs` are wanted: the LM head and sampling
   * then run in sub-batches of `maxSeqs` rows (engine/sampler.ts; `samplerRowsFor` says where
   * that is possible, `ModelRunner.samplerRows` what the runner holds). Default `maxSeqs`.
   */
  readonly maxSamplerRows?: number;
  /** Longest sequence, prompt and output (max_model_len). */
  readonly maxModelLen: number;
  /** Tokens per KV block. */
  readonly blockSize: number;
  /**
   * KV blocks in the pool, or a function that says how many once the weights and step buffers
   * are on the device, before the cache is allocated (the engine reads the GPU's memory then:
   * engine/engine_setup.ts). `ModelRunner.options` holds the number.
   */
  readonly numKvBlocks: number | (() => Promise<number>);
  /** Draw a load progress bar (default: when stderr is a terminal). */
  readonly showProgress?: boolean;
  /**
   * Projections and LM head as loaded, or int8 / int4 (gpu/quant.ts); `auto` (the default): a
   * packed-integer checkpoint's own format, else as loaded
   * (engine/model/checkpoint_quantization.ts `resolveQuantization`).
   */
  readonly quantization?: QuantizationChoice;
  /**
   * The KV cache's element type: `auto` (the default) the weights' f16 / f32, `fp8_e4m3` one
   * byte per element (vLLM's `--kv-cache-dtype fp8`; twice the tokens in the memory of an f16
   * cache; kernels/kv_codec.ts).
   */
  readonly kvCacheDtype?: KvCacheDtypeChoice;
  /**
   * Run a RoPE model's all-decode steps with the decode attention's fused variant (q/k norms,
   * RoPE and the K/V write inside it, no rope_and_cache dispatch; under the cpu profile where its
   * `unrolled` kernel's variant fits the workgroup memory, engine/models/attention_block.ts
   * `fusesRope`). Default true; false keeps the separate dispatch (to compare the two:
   * bench:model --fused-decode).
   */
  readonly fusedDecode?: boolean;
  /**
   * Steps that may be in flight at once (default 7, engine/step_buffers.ts `DEFAULT_RING_SLOTS`
   * less one): the sampled-token ring holds one slot more. More lets deferred readbacks start in
   * larger batches (`StepOptions.readbackBatch`; the GPU waits for the host once per batch) with
   * as many steps still queued behind them.
   */
  readonly maxInFlight?: number;
}

/** {@linkcode ModelRunnerOptions} with the KV cache's blocks known. */
export type LoadedRunnerOptions = Omit<ModelRunnerOptions, "numKvBlocks"> & {
  readonly numKvBlocks: number;
};

/** @throws {RangeError} when a numeric option is not a positive integer. */
export function checkOptions(options: ModelRunnerOptions): void {
  for (const [name, v] of Object.entries(options)) checkPositive(name, v);
}

/** @throws {RangeError} naming option `name` when `v` is a number but not a positive integer. */
export function checkPositive(name: string, v: unknown): void {
  if (typeof v === "number" && (!Number.isInteger(v) || v < 1)) {
    throw new RangeError(`Model runner option ${name} must be a positive integer: got ${v}`);
  }
}
