/**
 * The model runner: owns a loaded model's weights, KV cache and step buffers, and executes
 * {@linkcode ForwardBatch}es. One step is one command encoder with one compute pass:
 * resolve input ids (host ids or the previous step's samples, on the GPU), the model's forward
 * pass, the LM head over the sampled rows only, then for the sampled rows: `top_logprobs` on the
 * raw logits (only when some row asks for top logprobs), `logits_process` in place (only when
 * some row has a penalty or a logit bias), GPU sampling; then one copy of the sampled ids and
 * logprobs (and top logprobs when asked) into a staging buffer of a readback ring. `execute`
 * returns without waiting for the GPU: the caller awaits the readback when it needs the tokens,
 * so several steps can be in flight. The runner decides nothing: the batch says what to compute.
 *
 * Logits processing lists (prompt and output tokens of penalised rows, logit-bias pairs) are
 * uploaded with `writeBuffer` each step into buffers created on the first step that needs them
 * and grown (x4 or more, never shrunk) when a step needs more: steady state creates nothing.
 * Bounds: `maxSeqs * maxModelLen` listed tokens (a sequence lists at most its prompt and output),
 * capped so the hash-table scratch (16 bytes per listed token) fits one binding; logit-bias pairs
 * up to one binding (8 bytes each). A step beyond a bound throws a RangeError.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "./gpu/context.ts";
import { ParamArena } from "./gpu/params.ts";
import { ReadbackRing } from "./gpu/readback.ts";
import { type ForwardBatch, FROM_SAMPLED, validateBatch } from "./forward_batch.ts";
import { KvCache } from "./kv_cache.ts";
import { type Checkpoint, openCheckpoint } from "./model/checkpoint.ts";
import { type ModelConfig, ropeInvFreq } from "./model/config.ts";
import { WeightLoader } from "./model/weight_loader.ts";
import { StepBuffers } from "./step_buffers.ts";
import { AttentionKernels, type StepShape } from "./models/attention_block.ts";
import { DecoderModel } from "./models/decoder.ts";
import { Gpt2Model } from "./models/gpt2.ts";
import { KernelSet } from "./models/kernel_set.ts";
import type { Model } from "./models/model.ts";
import {
  LOGITS_PROCESS_PARAMS_BYTES,
  LogitsProcess,
  type LogitsProcessOp,
  type LogitsProcessParams,
  type LogitsProcessRecord,
  packLogitsProcessRecords,
  TABLE_WORDS_PER_TOKEN,
} from "../kernels/logits_process.ts";
import { packSampleParams, SAMPLE_PARAMS_BYTES } from "../kernels/sample.ts";
import {
  packTopLogprobCounts,
  TOP_LOGPROBS_MAX,
  TopLogprobs,
  type TopLogprobsOp,
} from "../kernels/top_logprobs.ts";
import type { MatmulOp } from "../kernels/matmul.ts";
import type { SampleOp } from "../kernels/sample.ts";
import type { TokenFeedOp } from "../kernels/token_feed.ts";

/** Sizes fixed at load time. */
export interface ModelRunnerOptions {
  /** Most new tokens in one step (max_num_batched_tokens). */
  readonly maxTokens: number;
  /** Most sequences in one step (max_num_seqs). */
  readonly maxSeqs: number;
  /** Longest sequence, prompt and output (max_model_len). */
  readonly maxModelLen: number;
  /** Tokens per KV block. */
  readonly blockSize: number;
  /** KV blocks in the pool. */
  readonly numKvBlocks: number;
  /** Draw a load progress bar (default: when stderr is a terminal). */
  readonly showProgress?: boolean;
}

/** One entry of a row's top log-probabilities. */
export interface TopLogprob {
  readonly tokenId: number;
  /** log-softmax of the raw logits (before logits processing and temperature). */
  readonly logprob: number;
}

/** The sampled rows of one step, once read back. */
export interface SampledRows {
  /** u32 `[rows]`: token id per sampling sequence, in batch order. */
  readonly tokens: Uint32Array;
  /**
   * f32 `[rows]`: log-probability of each token under the logits `sample` saw: the raw logits,
   * or for a row with logits processing (penalties, bias) the processed ones.
   */
  readonly logprobs: Float32Array;
  /**
   * `[rows]`: each row's `min(topLogprobs, vocab)` most likely tokens under the raw logits, best
   * first (ties: lower id first); empty for rows that asked for none.
   */
  readonly top: readonly (readonly TopLogprob[])[];
}

/** Growable GPU buffers (and host mirrors) of the logits-processing lists. */
interface ProcessLists {
  /** u32 `[tokenCap]`: prompt then output tokens of each penalised row. */
  tokens: GPUBuffer;
  /** `[biasCap]` (token u32, bias f32) pairs. */
  bias: GPUBuffer;
  /** u32 `[TABLE_WORDS_PER_TOKEN * tokenCap]`: hash-table scratch. */
  table: GPUBuffer;
  tokenCap: number;
  biasCap: number;
  hostTokens: Uint32Array<ArrayBuffer>;
  hostBias: Uint32Array<ArrayBuffer>;
  hostBiasF32: Float32Array<ArrayBuffer>;
  op: LogitsProcessOp;
}

const MIN_LIST_TOKENS = 4096;
const MIN_BIAS_PAIRS = 1024;

/** A submitted step. */
export interface StepHandle {
  /** The runner's number for this step (0, 1, ...): name its samples with `sampledRef`. */
  readonly step: number;
  /** Sequences that sampled (rows of the result, in batch order). */
  readonly rows: number;
  /** Resolves when the GPU has finished the step (rows may be 0). */
  readonly result: Promise<SampledRows>;
}

/** Owns a loaded model on one GPU context. */
export class ModelRunner {
  readonly ctx: GpuContext;
  readonly config: ModelConfig;
  readonly options: ModelRunnerOptions;
  readonly kv: KvCache;
  readonly #model: Model;
  readonly #bufs: StepBuffers;
  readonly #arena: ParamArena;
  readonly #feed: TokenFeedOp;
  readonly #lmHead: MatmulOp;
  readonly #sample: SampleOp[];
  readonly #top: TopLogprobsOp[];
  readonly #logitsProcess: LogitsProcess;
  #lists: ProcessLists | null = null;
  /** Most listed tokens in one step (see the module doc). */
  readonly #maxListTokens: number;
  #step = 0;
  readonly #ring: ReadbackRing;
  readonly #own: { destroy(): void }[];
  readonly #host: {
    cuQLens: Uint32Array<ArrayBuffer>;
    contextLens: Uint32Array<ArrayBuffer>;
    blockTables: Uint32Array<ArrayBuffer>;
    sampleIndices: Uint32Array<ArrayBuffer>;
    sampleParams: ArrayBuffer;
    processRecords: Uint32Array<ArrayBuffer>;
    topCounts: Uint32Array<ArrayBuffer>;
    ids: Uint32Array<ArrayBuffer>;
    positions: Uint32Array<ArrayBuffer>;
    slots: Uint32Array<ArrayBuffer>;
  };

  private constructor(
    ctx: GpuContext,
    config: ModelConfig,
    options: ModelRunnerOptions,
    parts: {
      kv: KvCache;
      model: Model;
      bufs: StepBuffers;
      arena: ParamArena;
      attention: AttentionKernels;
      kernels: KernelSet;
      own: { destroy(): void }[];
    },
  ) {
    this.ctx = ctx;
    this.config = config;
    this.options = options;
    this.kv = parts.kv;
    this.#model = parts.model;
    this.#bufs = parts.bufs;
    this.#arena = parts.arena;
    this.#own = parts.own;
    const b = (buffer: GPUBuffer) => ({ buffer });
    const bufs = parts.bufs;
    this.#feed = parts.kernels.tokenFeed.bind(parts.arena, {
      hostIds: b(bufs.hostIds),
      sampled: b(bufs.sampled),
      ids: b(bufs.ids),
    });
    this.#lmHead = parts.kernels.matmul(false).bind(parts.arena, {
      x: b(bufs.lastNormed),
      weight: parts.model.lmHead,
      y: b(bufs.logits),
    });
    this.#sample = Array.from(
      { length: bufs.ringSlots },
      (_, slot) =>
        parts.kernels.sample.bind(parts.arena, {
          logits: b(bufs.logits),
          params: b(bufs.sampleParams),
          tokens: bufs.sampledTokens(slot),
          logprobs: bufs.sampledLogprobs(slot),
        }),
    );
    const top = new TopLogprobs(ctx);
    this.#top = Array.from(
      { length: bufs.ringSlots },
      (_, slot) =>
        top.bind(parts.arena, {
          logits: b(bufs.logits),
          counts: b(bufs.topCounts),
          ids: bufs.sampledTopIds(slot),
          logprobs: bufs.sampledTopLogprobs(slot),
        }),
    );
    this.#logitsProcess = new LogitsProcess(ctx);
    this.#maxListTokens = Math.min(
      options.maxSeqs * options.maxModelLen,
      Math.floor(ctx.maxBindingBytes / (4 * TABLE_WORDS_PER_TOKEN)),
    );
    this.#ring = new ReadbackRing(ctx, bufs.readbackBytes(true), bufs.ringSlots);
    const { maxTokens: T, maxSeqs: S } = options;
    const B = bufs.capacity.maxBlocksPerSeq;
    this.#host = {
      cuQLens: new Uint32Array(S + 1),
      contextLens: new Uint32Array(S),
      blockTables: new Uint32Array(S * B),
      sampleIndices: new Uint32Array(S),
      sampleParams: new ArrayBuffer(S * SAMPLE_PARAMS_BYTES),
      processRecords: new Uint32Array(S * LOGITS_PROCESS_PARAMS_BYTES / 4),
      topCounts: new Uint32Array(S),
      ids: new Uint32Array(T),
      positions: new Uint32Array(T),
      slots: new Uint32Array(T),
    };
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
    const c = ck.config;
    for (const [name, v] of Object.entries(options)) {
      if (typeof v === "number" && (!Number.isInteger(v) || v < 1)) {
        throw new RangeError(`Model runner option ${name} must be a positive integer: got ${v}`);
      }
    }
    const dtype = ctx.weightDtype;
    const D = c.headDim;
    const isGpt2 = c.arch === "GPT2LMHeadModel";
    const own: { destroy(): void }[] = [];
    const kv = new KvCache(ctx, {
      numLayers: c.numLayers,
      numKvHeads: c.numKvHeads,
      headDim: D,
      blockSize: options.blockSize,
      dtype,
    }, options.numKvBlocks);
    own.push(kv);
    const qkvWidth = (c.numHeads + 2 * c.numKvHeads) * D;
    const bufs = new StepBuffers(ctx, {
      maxTokens: options.maxTokens,
      maxSeqs: options.maxSeqs,
      maxBlocksPerSeq: Math.ceil(options.maxModelLen / options.blockSize),
    }, {
      hidden: c.hiddenSize,
      qkv: qkvWidth,
      attn: c.numHeads * D,
      mlp: isGpt2 ? c.intermediateSize : 2 * c.intermediateSize,
      vocab: c.vocabSize,
    });
    own.push(bufs);
    // 64 for the step's own kernels (feed, LM head, a sample and a top_logprobs per ring slot,
    // logits_process and its re-bindings when its lists grow) and the model's final layers.
    const arena = new ParamArena(ctx, 128 + 40 * c.numLayers);
    own.push(arena);
    const kernels = new KernelSet(ctx, dtype);
    const attention = new AttentionKernels(
      ctx,
      {
        numHeads: c.numHeads,
        numKvHeads: c.numKvHeads,
        headDim: D,
        qkvWidth,
        kOffset: c.numHeads * D,
        vOffset: (c.numHeads + c.numKvHeads) * D,
        maxModelLen: options.maxModelLen,
      },
      kv,
      options.maxSeqs,
    );
    own.push(attention);
    const loader = new WeightLoader(ctx, ck, dtype, options.showProgress);
    let model: Model;
    try {
      if (isGpt2) {
        model = await Gpt2Model.load(c, loader, kernels, attention, arena, bufs, kv);
      } else {
        const inv = Float32Array.from(ropeInvFreq(c));
        const invFreq = ctx.createBuffer("rope.invFreq", inv.byteLength, STORAGE_RW);
        ctx.device.queue.writeBuffer(invFreq, 0, inv);
        own.push(invFreq);
        model = await DecoderModel.load(c, loader, kernels, attention, arena, bufs, kv, invFreq);
      }
    } catch (error) {
      loader.destroy();
      for (const o of own) o.destroy();
      throw error;
    }
    loader.progress.finish();
    own.push(model);
    ctx.check();
    return new ModelRunner(ctx, c, options, { kv, model, bufs, arena, attention, kernels, own });
  }

  /** Steps that may be in flight at once (the sampled-token ring's size minus one). */
  get maxInFlight(): number {
    return this.#bufs.ringSlots - 1;
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
   * Encodes and submits one step; does not wait for the GPU.
   *
   * @throws {RangeError} when the batch does not fit the runner (see {@linkcode validateBatch}).
   */
  execute(batch: ForwardBatch): StepHandle {
    this.ctx.check();
    const B = this.#bufs.capacity.maxBlocksPerSeq;
    validateBatch(batch, {
      maxTokens: this.options.maxTokens,
      maxSeqs: this.options.maxSeqs,
      maxBlocksPerSeq: B,
      blockSize: this.options.blockSize,
    });
    const h = this.#host;
    const T = batch.inputIds.length;
    const S = batch.seqs.length;
    let tokens = 0;
    let rows = 0;
    let maxContextLen = 0;
    let allDecode = true;
    const samples = [];
    const processes: (LogitsProcessParams | null)[] = [];
    const topCounts: number[] = [];
    let anyTop = false;
    h.cuQLens[0] = 0;
    for (let s = 0; s < S; s++) {
      const seq = batch.seqs[s]!;
      tokens += seq.queryLen;
      h.cuQLens[s + 1] = tokens;
      h.contextLens[s] = seq.contextLen;
      h.blockTables.set(seq.blockTable, s * B);
      maxContextLen = Math.max(maxContextLen, seq.contextLen);
      if (seq.queryLen !== 1) allDecode = false;
      if (seq.sample !== null) {
        h.sampleIndices[rows++] = tokens - 1;
        samples.push(seq.sample);
        processes.push(seq.process ?? null);
        const n = seq.topLogprobs ?? 0;
        topCounts.push(n);
        if (n !== 0) anyTop = true;
      }
    }
    h.ids.set(batch.inputIds);
    h.positions.set(batch.positions);
    h.slots.set(batch.slotMapping);
    packSampleParams(samples, h.sampleParams);
    if (anyTop) packTopLogprobCounts(topCounts, h.topCounts);
    // Packs and uploads the lists (validating them) before anything is encoded.
    const processOp = rows > 0 ? this.#uploadProcessing(processes) : null;
    const q = this.ctx.device.queue;
    const bufs = this.#bufs;
    q.writeBuffer(bufs.hostIds, 0, h.ids, 0, T);
    q.writeBuffer(bufs.positions, 0, h.positions, 0, T);
    q.writeBuffer(bufs.slotMapping, 0, h.slots, 0, T);
    q.writeBuffer(bufs.blockTables, 0, h.blockTables, 0, S * B);
    q.writeBuffer(bufs.contextLens, 0, h.contextLens, 0, S);
    q.writeBuffer(bufs.cuQLens, 0, h.cuQLens, 0, S + 1);
    if (rows > 0) {
      q.writeBuffer(bufs.sampleIndices, 0, h.sampleIndices, 0, rows);
      q.writeBuffer(bufs.sampleParams, 0, h.sampleParams, 0, rows * SAMPLE_PARAMS_BYTES);
      if (anyTop) q.writeBuffer(bufs.topCounts, 0, h.topCounts, 0, rows);
    }

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
    const pass = encoder.beginComputePass();
    this.#feed.encode(pass, T);
    this.#model.encode(pass, step);
    const vocab = this.config.vocabSize;
    if (rows > 0) {
      this.#lmHead.encode(pass, rows);
      // Raw logits first (vLLM's default logprobs), then processing in place, then sampling.
      if (anyTop) this.#top[slot]!.encode(pass, rows, vocab, TOP_LOGPROBS_MAX);
      processOp?.encode(pass, rows, vocab);
      this.#sample[slot]!.encode(pass, rows, vocab);
    }
    pass.end();
    const readback = rows > 0
      ? this.#ring.encode(
        encoder,
        bufs.sampled,
        slot * bufs.slotStride,
        bufs.readbackBytes(anyTop),
      )
      : undefined;
    this.#arena.flush();
    q.submit([encoder.finish()]);
    const result = readback === undefined
      ? q.onSubmittedWorkDone().then(() => ({
        tokens: new Uint32Array(0),
        logprobs: new Float32Array(0),
        top: [],
      }))
      : readback.start().data.then((bytes) => ({
        tokens: new Uint32Array(bytes, 0, rows),
        logprobs: new Float32Array(bytes, bufs.logprobsOffset, rows),
        top: anyTop ? readTop(bytes, bufs, topCounts, vocab) : topCounts.map(() => []),
      }));
    return { step: stepIndex, rows, result };
  }

  /**
   * Packs the sampled rows' logits-processing records and lists and uploads them; returns the
   * op to encode, or null when no row has a penalty or a bias (the dispatch is skipped).
   */
  #uploadProcessing(processes: readonly (LogitsProcessParams | null)[]): LogitsProcessOp | null {
    const records: LogitsProcessRecord[] = [];
    const lists: { prompt: ArrayLike<number>; output: ArrayLike<number> }[] = [];
    const biases: (readonly (readonly [number, number])[])[] = [];
    let active = 0;
    let numTokens = 0;
    let numPairs = 0;
    processes.forEach((p, row) => {
      const repetition = p?.repetitionPenalty ?? 1;
      const presence = p?.presencePenalty ?? 0;
      const frequency = p?.frequencyPenalty ?? 0;
      const bias = p?.logitBias ? [...p.logitBias] : [];
      const useRep = repetition !== 1;
      const useOut = useRep || presence !== 0 || frequency !== 0;
      const prompt = (useRep ? p?.promptTokens : undefined) ?? [];
      const output = (useOut ? p?.outputTokens : undefined) ?? [];
      if (useOut || bias.length > 0) active++;
      records.push({
        repetition,
        presence,
        frequency,
        promptOffset: numTokens,
        promptLen: prompt.length,
        outputOffset: numTokens + prompt.length,
        outputLen: output.length,
        biasOffset: numPairs,
        biasLen: bias.length,
        tableOffset: TABLE_WORDS_PER_TOKEN * numTokens,
      });
      lists.push({ prompt, output });
      biases.push(bias);
      numTokens += prompt.length + output.length;
      numPairs += bias.length;
      if (numTokens > this.#maxListTokens) {
        throw new RangeError(
          `Cannot process logits: the step lists more than ${this.#maxListTokens} prompt and output tokens (sampled row ${row})`,
        );
      }
    });
    if (active === 0) return null;
    const h = this.#host;
    packLogitsProcessRecords(records, h.processRecords);
    const l = this.#ensureLists(numTokens, numPairs);
    const seen = new Set<number>();
    records.forEach((r, row) => {
      const { prompt, output } = lists[row]!;
      copyTokens(l.hostTokens, r.promptOffset, prompt, row, "prompt");
      copyTokens(l.hostTokens, r.outputOffset, output, row, "output");
      seen.clear();
      biases[row]!.forEach(([token, bias], j) => {
        if (!Number.isInteger(token) || token < 0 || token > 0x7fffffff || seen.has(token)) {
          throw new RangeError(
            `Cannot process logits: sampled row ${row} has logit bias token ${token} (not a token id, or listed twice)`,
          );
        }
        if (!Number.isFinite(bias)) {
          throw new RangeError(
            `Cannot process logits: sampled row ${row} has logit bias ${bias} for token ${token}`,
          );
        }
        seen.add(token);
        l.hostBias[2 * (r.biasOffset + j)] = token;
        l.hostBiasF32[2 * (r.biasOffset + j) + 1] = bias;
      });
    });
    const q = this.ctx.device.queue;
    const rows = processes.length;
    q.writeBuffer(
      this.#bufs.processParams,
      0,
      h.processRecords,
      0,
      rows * LOGITS_PROCESS_PARAMS_BYTES / 4,
    );
    if (numTokens > 0) q.writeBuffer(l.tokens, 0, l.hostTokens, 0, numTokens);
    if (numPairs > 0) q.writeBuffer(l.bias, 0, l.hostBias, 0, 2 * numPairs);
    return l.op;
  }

  /** The list buffers, created or grown (and the op re-bound) to hold the given sizes. */
  #ensureLists(numTokens: number, numPairs: number): ProcessLists {
    const old = this.#lists;
    if (old !== null && old.tokenCap >= numTokens && old.biasCap >= numPairs) return old;
    const grow = (need: number, cap: number, min: number, max: number) =>
      cap > 0 && need <= cap ? cap : Math.min(max, Math.max(2 * need, 4 * cap, min));
    const ctx = this.ctx;
    const tokenCap = grow(numTokens, old?.tokenCap ?? 0, MIN_LIST_TOKENS, this.#maxListTokens);
    const biasCap = grow(
      numPairs,
      old?.biasCap ?? 0,
      MIN_BIAS_PAIRS,
      Math.floor(ctx.maxBindingBytes / 8),
    );
    if (numPairs > biasCap) {
      throw new RangeError(
        `Cannot process logits: ${numPairs} logit-bias pairs in one step exceed one binding (${biasCap})`,
      );
    }
    const tokens = old?.tokenCap === tokenCap
      ? old.tokens
      : ctx.createBuffer("process.tokens", tokenCap * 4, STORAGE_RW);
    const table = old?.tokenCap === tokenCap
      ? old.table
      : ctx.createBuffer("process.table", TABLE_WORDS_PER_TOKEN * tokenCap * 4, STORAGE_RW);
    const bias = old?.biasCap === biasCap
      ? old.bias
      : ctx.createBuffer("process.bias", biasCap * 8, STORAGE_RW);
    const hostBias = old?.biasCap === biasCap ? old.hostBias : new Uint32Array(2 * biasCap);
    const b = (buffer: GPUBuffer) => ({ buffer });
    const lists: ProcessLists = {
      tokens,
      bias,
      table,
      tokenCap,
      biasCap,
      hostTokens: old?.tokenCap === tokenCap ? old.hostTokens : new Uint32Array(tokenCap),
      hostBias,
      hostBiasF32: new Float32Array(hostBias.buffer),
      op: this.#logitsProcess.bind(this.#arena, {
        logits: b(this.#bufs.logits),
        params: b(this.#bufs.processParams),
        tokens: b(tokens),
        bias: b(bias),
        sampled: b(this.#bufs.sampled),
        table: b(table),
      }),
    };
    // Steps already submitted keep their buffers alive until they complete.
    if (old !== null) {
      if (old.tokens !== tokens) old.tokens.destroy();
      if (old.table !== table) old.table.destroy();
      if (old.bias !== bias) old.bias.destroy();
    }
    this.#lists = lists;
    return lists;
  }

  /** Releases every GPU buffer of the model. */
  destroy(): void {
    this.#ring.destroy();
    const l = this.#lists;
    if (l !== null) {
      l.tokens.destroy();
      l.table.destroy();
      l.bias.destroy();
    }
    for (const o of this.#own.reverse()) o.destroy();
  }
}

/** Copies a token list into `out` at `offset`, checking every id is a u32. */
function copyTokens(
  out: Uint32Array,
  offset: number,
  list: ArrayLike<number>,
  row: number,
  what: string,
): void {
  for (let i = 0; i < list.length; i++) {
    const t = list[i]!;
    if (!Number.isInteger(t) || t < 0 || t > 0xffffffff) {
      throw new RangeError(`Cannot process logits: sampled row ${row} has ${what} token ${t}`);
    }
    out[offset + i] = t;
  }
}

/** Decodes the top-logprob regions of a read-back ring slot. */
function readTop(
  bytes: ArrayBuffer,
  bufs: StepBuffers,
  counts: readonly number[],
  vocab: number,
): TopLogprob[][] {
  const ids = new Uint32Array(bytes, bufs.topIdsOffset, counts.length * TOP_LOGPROBS_MAX);
  const lps = new Float32Array(bytes, bufs.topLogprobsOffset, counts.length * TOP_LOGPROBS_MAX);
  return counts.map((c, row) =>
    Array.from({ length: Math.min(c, vocab) }, (_, j) => ({
      tokenId: ids[row * TOP_LOGPROBS_MAX + j]!,
      logprob: lps[row * TOP_LOGPROBS_MAX + j]!,
    }))
  );
}
