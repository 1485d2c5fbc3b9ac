/**
 * The per-step inputs of `logits_process` (kernels/logits_process.ts) for the sampled rows of a
 * step: one record per row in `StepBuffers.processParams`, and the lists the records point
 * into: prompt and output tokens of penalised rows, logit-bias pairs, and the hash-table
 * scratch. The lists are uploaded with `writeBuffer` each step into buffers created on the first
 * step that needs them and grown (x4 or more, never shrunk) when a step needs more, re-binding
 * the op: steady state creates nothing.
 *
 * Bounds: `maxSeqs * maxModelLen` listed tokens (a sequence lists at most its prompt and output),
 * capped so the hash-table scratch (16 bytes per listed token) fits one binding; logit-bias pairs
 * up to one binding (8 bytes each). A step beyond a bound throws a RangeError.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import type { StepBuffers } from "./step_buffers.ts";
import {
  checkLogitsProcessParams,
  LOGITS_PROCESS_PARAMS_BYTES,
  LogitsProcess,
  type LogitsProcessOp,
  type LogitsProcessParams,
  type LogitsProcessRecord,
  packLogitsProcessRecords,
  TABLE_WORDS_PER_TOKEN,
} from "../kernels/logits_process.ts";

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

/** The logits-processing records and lists of one model runner (see the module doc). */
export class LogitsProcessLists {
  readonly ctx: GpuContext;
  readonly #arena: ParamArena;
  readonly #bufs: StepBuffers;
  readonly #kernel: LogitsProcess;
  /** The lists' buffers and the op bound to them; null until a step needs them. */
  #current: ProcessLists | null = null;
  /** Most listed tokens in one step (see the module doc). */
  readonly #maxListTokens: number;
  /** `[maxSeqs]` host records of LOGITS_PROCESS_PARAMS_BYTES bytes. */
  readonly #records: Uint32Array<ArrayBuffer>;

  /**
   * Compiles `logits_process`; its op (over `bufs.logits`, `bufs.processParams` and
   * `bufs.sampled`) is bound on the first step that needs it.
   */
  constructor(
    ctx: GpuContext,
    arena: ParamArena,
    bufs: StepBuffers,
    limits: { readonly maxSeqs: number; readonly maxModelLen: number },
  ) {
    this.ctx = ctx;
    this.#arena = arena;
    this.#bufs = bufs;
    this.#kernel = new LogitsProcess(ctx);
    this.#maxListTokens = Math.min(
      limits.maxSeqs * limits.maxModelLen,
      Math.floor(ctx.maxBindingBytes / (4 * TABLE_WORDS_PER_TOKEN)),
    );
    this.#records = new Uint32Array(limits.maxSeqs * LOGITS_PROCESS_PARAMS_BYTES / 4);
  }

  /**
   * Packs the sampled rows' logits-processing records (one per row, null: no processing) and
   * lists, validating them, and uploads them; returns the op to encode, or null when no row has
   * a penalty or a bias (the dispatch is skipped). Nothing is uploaded when a check fails.
   *
   * @throws {RangeError} on an invalid penalty, listed token or logit bias, or lists beyond the
   * bounds of the module doc.
   */
  upload(processes: readonly (LogitsProcessParams | null)[]): LogitsProcessOp | null {
    const records: LogitsProcessRecord[] = [];
    const lists: { prompt: ArrayLike<number>; output: ArrayLike<number> }[] = [];
    const biases: (readonly (readonly [number, number])[])[] = [];
    let active = 0;
    let numTokens = 0;
    let numPairs = 0;
    processes.forEach((p, row) => {
      if (p !== null) checkLogitsProcessParams(p, row);
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
    packLogitsProcessRecords(records, this.#records);
    const l = this.#ensureLists(numTokens, numPairs);
    records.forEach((r, row) => {
      const { prompt, output } = lists[row]!;
      copyTokens(l.hostTokens, r.promptOffset, prompt, row, "prompt");
      copyTokens(l.hostTokens, r.outputOffset, output, row, "output");
      biases[row]!.forEach(([token, bias], j) => {
        l.hostBias[2 * (r.biasOffset + j)] = token;
        l.hostBiasF32[2 * (r.biasOffset + j) + 1] = bias;
      });
    });
    const q = this.ctx.device.queue;
    const rows = processes.length;
    q.writeBuffer(
      this.#bufs.processParams,
      0,
      this.#records,
      0,
      rows * LOGITS_PROCESS_PARAMS_BYTES / 4,
    );
    if (numTokens > 0) q.writeBuffer(l.tokens, 0, l.hostTokens, 0, numTokens);
    if (numPairs > 0) q.writeBuffer(l.bias, 0, l.hostBias, 0, 2 * numPairs);
    return l.op;
  }

  /** The list buffers, created or grown (and the op re-bound) to hold the given sizes. */
  #ensureLists(numTokens: number, numPairs: number): ProcessLists {
    const old = this.#current;
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
      op: this.#kernel.bind(this.#arena, {
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
    this.#current = lists;
    return lists;
  }

  /** Releases the list buffers (the step buffers belong to the runner). */
  destroy(): void {
    const l = this.#current;
    if (l !== null) {
      l.tokens.destroy();
      l.table.destroy();
      l.bias.destroy();
    }
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
