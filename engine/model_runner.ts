/**
 * The model runner: owns a loaded model's weights, KV cache and step buffers, and executes
 * {@linkcode ForwardBatch}es. One step is one command encoder with one compute pass:
 * resolve input ids (host ids or the previous step's samples, on the GPU), the model's forward
 * pass, then the sampling stage ({@linkcode Sampler}: the LM head over the sampled rows only,
 * `top_logprobs` on the raw logits when some row asks for them, `logits_process` in place when
 * some row has a penalty or a logit bias, GPU sampling; scored prompt positions are rows too,
 * after the sampled ones); then one copy of the sampled ids and
 * logprobs (and top logprobs when asked) into a staging buffer of a readback ring. `execute`
 * returns without waiting for the GPU: the caller awaits the readback when it needs the tokens,
 * so several steps can be in flight. The runner decides nothing: the batch says what to compute.
 *
 * @module
 */

import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import { ReadbackRing } from "../gpu/readback.ts";
import { StagedWrites } from "../gpu/staged_writes.ts";
import { DeferredReadbacks } from "./deferred_readbacks.ts";
import type { StepHandle, StepOptions } from "./step_options.ts";
import { type ForwardBatch, FROM_SAMPLED, validateBatch } from "./forward_batch.ts";
import { KvCache } from "./kv_cache.ts";
import type { PenaltyHistorySlots } from "./logits_process_lists.ts";
import { type Checkpoint, openCheckpoint } from "./model/checkpoint.ts";
import { resolveQuantization } from "./model/checkpoint_quantization.ts";
import type { ModelConfig } from "./model/config.ts";
import { WeightLoader } from "./model/weight_loader.ts";
import { Sampler, samplerRowsFor } from "./sampler.ts";
import type { SampledRows } from "./sampled_rows.ts";
import type { StepBuffers } from "./step_buffers.ts";
import { StepInputs } from "./step_inputs.ts";
import { gpuPrefillCompiles, type StepShape } from "./models/attention_block.ts";
import { allocateBindTargets, type BindTargets, kvCacheShape } from "./models/bind_targets.ts";
import { loadModel } from "./models/load_model.ts";
import type { Model } from "./models/model.ts";
import { KERNEL_GROUPS, SinglePass } from "./models/step_passes.ts";
import type { TokenFeedOp } from "../kernels/token_feed.ts";
import type { Matmul } from "../kernels/matmul.ts";
import type { PagedAttentionDecode } from "../kernels/paged_attention_decode.ts";
import type { PagedAttentionPrefill } from "../kernels/paged_attention_prefill.ts";
import type { PrefillChoice } from "../kernels/prefill_attention_tuner.ts";
import type { AttentionKernels } from "./models/attention_block.ts";

export type { SampledRows, TopLogprob } from "./sampled_rows.ts";
export type { StepHandle, StepOptions, StepTiming } from "./step_options.ts";
import {
  checkOptions,
  checkPositive,
  type LoadedRunnerOptions,
  type ModelRunnerOptions,
  type WeightBytes,
} from "./model_runner_options.ts";

export type { ModelRunnerOptions, WeightBytes };

/** Owns a loaded model on one GPU context. */
export class ModelRunner {
  readonly ctx: GpuContext;
  readonly config: ModelConfig;
  readonly options: LoadedRunnerOptions;
  readonly kv: KvCache;
  /** The weights' bytes on the device, and what they would be unquantized. */
  readonly weights: WeightBytes;
  readonly #model: Model;
  readonly #bufs: StepBuffers;
  readonly #arena: ParamArena;
  readonly #feed: TokenFeedOp;
  readonly #matmuls: readonly Matmul[];
  readonly #attention: AttentionKernels;
  readonly #sampler: Sampler;
  /** The step's host-to-device writes, one upload per step (gpu/staged_writes.ts). */
  readonly #writes: StagedWrites;
  /** Every dispatch of a step in its one pass (the path without `timing.groups`). */
  readonly #single = new SinglePass();
  #step = 0;
  readonly #ring: ReadbackRing;
  /** The readbacks of overlapped steps that wait for a later submit. */
  readonly #deferred = new DeferredReadbacks();
  readonly #own: { destroy(): void }[];
  /** The batch's ids, positions, slots, lengths and block tables, staged each step. */
  readonly #inputs: StepInputs;

  private constructor(
    ctx: GpuContext,
    config: ModelConfig,
    options: LoadedRunnerOptions,
    parts: BindTargets & {
      model: Model;
      own: { destroy(): void }[];
      weights: WeightBytes;
    },
  ) {
    this.weights = parts.weights;
    this.ctx = ctx;
    this.config = config;
    this.options = options;
    this.kv = parts.kv;
    this.#model = parts.model;
    this.#bufs = parts.bufs;
    this.#arena = parts.arena;
    this.#own = parts.own;
    this.#matmuls = parts.kernels.matmuls;
    this.#attention = parts.attention;
    const b = (buffer: GPUBuffer) => ({ buffer });
    const bufs = parts.bufs;
    this.#feed = parts.kernels.tokenFeed.bind(parts.arena, {
      hostIds: b(bufs.hostIds),
      sampled: b(bufs.sampled),
      ids: b(bufs.ids),
    });
    this.#sampler = new Sampler(ctx, parts.kernels, parts.arena, bufs, parts.model.lmHead, {
      maxSeqs: options.maxSeqs,
      maxRows: bufs.maxRows,
      maxModelLen: options.maxModelLen,
      vocab: config.vocabSize,
    });
    this.#ring = new ReadbackRing(ctx, bufs.readbackBytes(true), bufs.ringSlots);
    this.#writes = new StagedWrites(ctx);
    this.#inputs = new StepInputs(bufs);
  }

  /**
   * Loads the checkpoint in `dir` onto `ctx` (weights in `ctx.weightDtype`) and allocates the
   * KV cache and step buffers.
   */
  static async load(
    ctx: GpuContext,
    dir: string,
    options: ModelRunnerOptions,
  ): Promise<ModelRunner> {
    const ck: Checkpoint = await openCheckpoint(dir);
    try {
      return await ModelRunner.fromCheckpoint(ctx, ck, options);
    } finally {
      ck.close();
    }
  }

  /** Like {@linkcode ModelRunner.load} from an open checkpoint. */
  static async fromCheckpoint(
    ctx: GpuContext,
    ck: Checkpoint,
    options: ModelRunnerOptions,
  ): Promise<ModelRunner> {
    checkOptions(options);
    const c = ck.config;
    // A kernel never run on this adapter kind is compiled inside error scopes first: one that
    // fails there is left out (noted), not fatal to the context.
    const kvShape = kvCacheShape(ctx, c, options.blockSize, options.kvCacheDtype);
    const gpuPrefill = await gpuPrefillCompiles(ctx, c, kvShape.dtype);
    const maxRows = samplerRowsFor(
      options.maxSeqs,
      c.hiddenSize,
      options.maxSamplerRows ?? options.maxSeqs,
    );
    const targets = allocateBindTargets(ctx, c, { ...options, maxRows }, gpuPrefill.variants);
    // What to destroy on failure or at the end, in allocation order.
    const own: { destroy(): void }[] = [targets.bufs, targets.arena, targets.attention];
    // Allocated by the model once its weights are loaded (numKvBlocks may be sized then).
    let kv: KvCache | undefined;
    const kvCache = async (): Promise<KvCache> => {
      const blocks = typeof options.numKvBlocks === "number"
        ? options.numKvBlocks
        : await options.numKvBlocks();
      checkPositive("numKvBlocks", blocks);
      kv = new KvCache(ctx, kvShape, blocks);
      own.push(kv);
      return kv;
    };
    const loader = new WeightLoader(
      ctx,
      ck,
      ctx.weightDtype,
      options.showProgress,
      resolveQuantization(options.quantization ?? "auto", ck.quantization),
    );
    let model: Model;
    try {
      model = await loadModel(ctx, ck, loader, targets, own, kvCache);
      if (kv === undefined) throw new Error(`The ${c.arch} loader allocated no KV cache`);
    } catch (error) {
      loader.destroy();
      for (const o of own) o.destroy();
      throw error;
    }
    loader.progress.finish();
    const notes = [
      ...loader.notes,
      ...gpuPrefill.errors.map((error) =>
        `a prefill attention kernel does not compile on this adapter (${error}): left out`
      ),
    ];
    const weights = { ...loader.bytes, notes, quantization: loader.quantization };
    own.push(model);
    ctx.check();
    return new ModelRunner(ctx, c, { ...options, numKvBlocks: kv.numBlocks }, {
      ...targets,
      kv,
      model,
      own,
      weights,
    });
  }

  /**
   * The matmuls every call site of the model and the LM head is bound to (measure and apply a
   * tuning with kernels/matmul_tuner.ts and `Matmul.setTuning`, before steps run).
   */
  get matmuls(): readonly Matmul[] {
    return this.#matmuls;
  }

  /**
   * The decode attention kernel of every layer (measure and apply its split choice with
   * kernels/decode_split_tuner.ts and `setSplitTuning`, before steps run).
   */
  get decodeAttention(): PagedAttentionDecode {
    return this.#attention.decodeKernel;
  }

  /**
   * The prefill attention kernels every layer can run and the choice among them (measure with
   * kernels/prefill_attention_tuner.ts, then `use`), before steps run.
   */
  get prefillAttention(): {
    readonly kernels: readonly PagedAttentionPrefill[];
    /** The name (`PagedAttentionPrefill.name`) of the kernel every layer runs (long prefills). */
    readonly name: string;
    /** The name of the kernel of a step of `tokens` new tokens. */
    nameFor(tokens: number): string;
    use(name: string): void;
    /** Chooses the kernel by step length (see {@linkcode PrefillChoice}). */
    useChoice(choice: PrefillChoice): void;
  } {
    const a = this.#attention;
    return {
      kernels: a.prefillKernels,
      name: a.prefillName(),
      nameFor: (tokens) => a.prefillName(tokens),
      use: (name) => a.usePrefill(name),
      useChoice: (choice) => a.usePrefillChoice(choice),
    };
  }

  /**
   * Sampler rows one step may hold, sampled tokens and scored prompt positions together (at least
   * `maxSeqs`; `maxSamplerRows` where {@linkcode samplerRowsFor} allows it): the scheduler's
   * bound on a step's rows.
   */
  get samplerRows(): number {
    return this.#bufs.maxRows;
  }

  /** Steps that may be in flight at once (the sampled-token ring's size minus one). */
  get maxInFlight(): number {
    return this.#bufs.ringSlots - 1;
  }

  /**
   * Block-table entries the last step staged for upload (a header of one per sequence, and the
   * entries its tables gained; engine/block_table_rows.ts): for benches and tests.
   */
  get stagedBlockTableEntries(): number {
    return this.#inputs.stagedBlockTableEntries;
  }

  /**
   * The penalty histories kept on the GPU, by key (`LogitsProcessing.history`): free a
   * sequence's when it ends; `inUse` for leak checks.
   */
  get penaltyHistories(): PenaltyHistorySlots {
    return this.#sampler.penaltyHistories;
  }

  /**
   * The input id meaning "the token sampled in row `row` of step `step`" (see
   * {@linkcode ForwardBatch.inputIds}), valid while fewer than `ringSlots` steps have been
   * executed since `step`.
   *
   * @throws {RangeError} when that sample is no longer on the GPU.
   */
  sampledRef(step: number, row: number): number {
    const slots = this.#bufs.ringSlots;
    if (step < 0 || step >= this.#step || this.#step - step >= slots) {
      throw new RangeError(
        `Cannot feed the sample of step ${step}: the runner is at step ${this.#step} and keeps ${slots}`,
      );
    }
    if (!Number.isInteger(row) || row < 0 || row >= this.options.maxSeqs) {
      throw new RangeError(
        `Cannot feed sample row ${row}: steps sample at most ${this.options.maxSeqs}`,
      );
    }
    return (FROM_SAMPLED | ((step % slots) * (this.#bufs.slotStride / 4) + row)) >>> 0;
  }

  /**
   * Starts the deferred readbacks ({@linkcode StepOptions.overlap}): blocks until the GPU has
   * finished every submitted step. Call it before waiting on the result of a step whose readback
   * has not started ({@linkcode StepHandle.readbackStarted}).
   */
  flush(): void {
    this.#deferred.startAll();
  }

  /**
   * Encodes and submits one step; does not wait for the GPU. Starts the deferred readbacks once
   * this step is encoded, when as many wait as one of them allows (see {@linkcode StepOptions}).
   *
   * @throws {RangeError} when the batch does not fit the runner (see {@linkcode validateBatch}),
   *   or `readbackBatch` is not an integer in [1, {@linkcode maxInFlight}].
   */
  execute(batch: ForwardBatch, options: StepOptions = {}): StepHandle {
    this.ctx.check();
    const readbackBatch = options.readbackBatch;
    if (
      readbackBatch !== undefined &&
      (!Number.isInteger(readbackBatch) || readbackBatch < 1 || readbackBatch > this.maxInFlight)
    ) {
      throw new RangeError(
        `Cannot batch ${readbackBatch} readbacks: between 1 and ${this.maxInFlight} steps may be in flight`,
      );
    }
    const B = this.#bufs.capacity.maxBlocksPerSeq;
    validateBatch(batch, {
      maxTokens: this.options.maxTokens,
      maxSeqs: this.options.maxSeqs,
      maxBlocksPerSeq: B,
      blockSize: this.options.blockSize,
    });
    // Leftovers of a step that failed after staging are dropped. Packs and stages the sampled
    // rows' records and lists (validating them) first, then the batch's inputs; all of them are
    // uploaded in one write and copied in place by this step's command buffer.
    this.#writes.clear();
    const plan = this.#sampler.prepare(batch.seqs, this.#writes);
    const rows = plan.rows;
    const { allDecode, maxContextLen } = this.#inputs.stage(batch, this.#writes);
    const T = batch.inputIds.length;
    const S = batch.seqs.length;
    const q = this.ctx.device.queue;
    const bufs = this.#bufs;
    const stepIndex = this.#step++;
    const slot = stepIndex % bufs.ringSlots;
    const step: StepShape = {
      numTokens: T,
      numSeqs: S,
      allDecode,
      maxContextLen,
      numSampled: rows,
    };
    const encoder = this.ctx.device.createCommandEncoder({ label: "step" });
    this.#writes.encode(encoder);
    const pass = encoder.beginComputePass(options.descriptor);
    const passes = options.groups?.use(pass) ?? this.#single.use(pass);
    this.#feed.encode(passes.at(KERNEL_GROUPS.embedding), T);
    this.#model.encode(passes, step);
    this.#sampler.encode(passes, plan, slot);
    pass.end();
    options.resolve?.(encoder);
    const readback = rows > 0
      ? this.#ring.encode(
        encoder,
        bufs.sampled,
        slot * bufs.slotStride,
        bufs.readbackBytes(plan.anyTop, rows),
      )
      : undefined;
    this.#arena.flush();
    const commands = encoder.finish();
    // The deferred readbacks, when they start now: the first waits for the GPU to finish every
    // submitted step, so the submit below follows at once.
    if (this.#deferred.length > 0 && (options.overlap !== true || this.#deferred.due)) {
      this.flush();
    }
    q.submit([commands]);
    const complete = (): Promise<SampledRows> =>
      readback === undefined
        ? q.onSubmittedWorkDone().then(() => ({
          tokens: new Uint32Array(0),
          logprobs: new Float32Array(0),
          top: [],
          prompt: [],
        }))
        : readback.start().data.then((bytes) => this.#sampler.read(bytes, plan));
    if (options.overlap !== true) {
      const result = complete();
      return {
        step: stepIndex,
        rows: plan.sampled,
        result,
        readbackStarted: () => true,
        wait: () => result,
      };
    }
    const deferred = this.#deferred.defer(complete, readbackBatch ?? 1);
    return {
      step: stepIndex,
      rows: plan.sampled,
      result: deferred.result,
      readbackStarted: deferred.started,
      wait: () => {
        if (!deferred.started()) this.flush();
        return deferred.result;
      },
    };
  }

  /** Releases every GPU buffer of the model. */
  destroy(): void {
    this.flush();
    this.#ring.destroy();
    this.#writes.destroy();
    this.#sampler.destroy();
    for (const o of this.#own.reverse()) o.destroy();
  }
}
