/**
 * The inputs of `logits_process` (kernels/logits_process.ts) for the sampled rows of a step:
 *
 * - the penalty histories ({@linkcode PenaltyHistories}): each penalised sequence's prompt then
 *   output so far, resident on the GPU for the sequence's lifetime in a slot of `maxModelLen`
 *   u32 of one buffer, under the caller's key (the request id). The prompt is uploaded once,
 *   when the slot is created; each step the kernel appends the row's last fed token, read from
 *   the step's resolved input ids (`StepBuffers.ids`, bound as the kernel's `sampled`), at index
 *   `promptLen + outputLen - 1` when `outputLen >= 1` ({@linkcode LogitsProcessing} says why
 *   that is the newest output token). A slot is reused only once its key is freed; GPU work is
 *   queue-ordered, so a freed slot's last appends land before its next prompt is written;
 * - per step, one record per sampled row in `StepBuffers.processParams` (slot offset, prompt
 *   and output lengths, last token index, penalties) and the row's logit-bias pairs: their size
 *   does not grow with the sequence's length;
 * - the hash-table scratch (16 bytes per token a row counts).
 *
 * Buffers are created on the first step that needs them and grown, never shrunk, re-binding the
 * op: steady state creates nothing. The history buffer grows x2 (or to what a step needs), its
 * contents copied on the GPU. Bounds: history slots, scratch and bias pairs each fit one storage
 * binding (`ctx.maxBindingBytes`); a step beyond a bound throws a RangeError.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import type { LogitsProcessing } from "./forward_batch.ts";
import type { StepBuffers } from "./step_buffers.ts";
import type { StagedWrites } from "../gpu/staged_writes.ts";
import {
  checkLogitsProcessParams,
  LOGITS_PROCESS_PARAMS_BYTES,
  LogitsProcess,
  type LogitsProcessOp,
  type LogitsProcessRecord,
  packLogitsProcessRecords,
  TABLE_WORDS_PER_TOKEN,
} from "../kernels/logits_process.ts";
import { FROM_SAMPLED } from "../kernels/token_feed.ts";

/** A sampled row as logits processing sees it. */
export interface ProcessRow {
  readonly process: LogitsProcessing | null;
  /** Tokens in the KV cache after this step: the prompt, then the output so far. */
  readonly contextLen: number;
  /** Index of the row's last token among the step's tokens (in `StepBuffers.ids`). */
  readonly lastIndex: number;
}

/** What the runner's callers see of the penalty histories: release and leak checks. */
export interface PenaltyHistorySlots {
  /** Slots held: one per key that was penalised and not freed since. */
  readonly inUse: number;
  /** Most slots at once (one storage binding of `maxModelLen` u32 slots). */
  readonly capacity: number;
  /** Whether `key` holds a slot. */
  has(key: string): boolean;
  /** The keys holding a slot. */
  keys(): IterableIterator<string>;
  /** Frees `key`'s slot, if any: its sequence ended, no later step may name it. */
  free(key: string): void;
}

/** Least slots, scratch words and bias pairs of a buffer, once created. */
const MIN_SLOTS = 4;
const MIN_TABLE_WORDS = 16384;
const MIN_BIAS_PAIRS = 1024;

/** The penalty histories: one slot of `slotWords` u32 per key (see the module doc). */
export class PenaltyHistories implements PenaltyHistorySlots {
  readonly #ctx: GpuContext;
  /** u32 per slot: max_model_len (a sequence never holds more tokens). */
  readonly slotWords: number;
  readonly capacity: number;
  /** u32 `[#slotCap, slotWords]`: slot s holds a prompt, then its outputs, from word s * slotWords. */
  #buffer: GPUBuffer;
  #slotCap = 0;
  readonly #slots = new Map<string, { readonly slot: number; readonly promptLen: number }>();
  /** Slots handed out so far are 0 .. #high - 1; the freed ones wait in #free. */
  #high = 0;
  readonly #free: number[] = [];

  constructor(ctx: GpuContext, slotWords: number) {
    this.#ctx = ctx;
    this.slotWords = slotWords;
    this.capacity = Math.floor(ctx.maxBindingBytes / (4 * slotWords));
    // A placeholder to bind until a slot is needed.
    this.#buffer = ctx.createBuffer("process.history", 4, STORAGE_RW);
  }

  /** The buffer the op binds (replaced when it grows). */
  get buffer(): GPUBuffer {
    return this.#buffer;
  }
  get inUse(): number {
    return this.#slots.size;
  }
  has(key: string): boolean {
    return this.#slots.has(key);
  }
  keys(): IterableIterator<string> {
    return this.#slots.keys();
  }

  /** `key`'s slot and prompt length, or undefined. */
  get(key: string): { readonly slot: number; readonly promptLen: number } | undefined {
    return this.#slots.get(key);
  }

  free(key: string): void {
    const s = this.#slots.get(key);
    if (s !== undefined && this.#slots.delete(key)) this.#free.push(s.slot);
  }

  /**
   * Creates a slot for each key of `prompts` (none may hold one) and uploads its prompt, growing
   * the buffer first. The caller checked the count against the capacity and the prompts.
   */
  create(prompts: ReadonlyMap<string, readonly number[]>): void {
    const slots = [...prompts].map(([key, prompt]) => {
      const slot = this.#free.pop() ?? this.#high++;
      this.#slots.set(key, { slot, promptLen: prompt.length });
      return { slot, prompt };
    });
    if (this.#high > this.#slotCap) this.#grow();
    const q = this.#ctx.device.queue;
    for (const { slot, prompt } of slots) {
      if (prompt.length > 0) {
        q.writeBuffer(this.#buffer, slot * this.slotWords * 4, Uint32Array.from(prompt));
      }
    }
  }

  /** A buffer for at least #high slots, holding the old one's contents (copied on the GPU). */
  #grow(): void {
    const ctx = this.#ctx;
    const cap = Math.min(this.capacity, Math.max(this.#high, 2 * this.#slotCap, MIN_SLOTS));
    const buffer = ctx.createBuffer("process.history", cap * this.slotWords * 4, STORAGE_RW);
    if (this.#slotCap > 0) {
      // Queue-ordered: after every step submitted so far (their appends included), before the
      // prompts written below and the next step.
      const encoder = ctx.device.createCommandEncoder({ label: "process.history grow" });
      encoder.copyBufferToBuffer(this.#buffer, 0, buffer, 0, this.#slotCap * this.slotWords * 4);
      ctx.device.queue.submit([encoder.finish()]);
    }
    // Steps already submitted keep the old buffer alive until they complete.
    this.#buffer.destroy();
    this.#buffer = buffer;
    this.#slotCap = cap;
  }

  destroy(): void {
    this.#buffer.destroy();
  }
}

/** A checked row: penalties, history key and lengths (penalised rows only), bias pairs. */
type CheckedRow =
  & Pick<LogitsProcessRecord, "repetition" | "presence" | "frequency" | "promptLen" | "outputLen">
  & { readonly key: string | null; readonly bias: readonly (readonly [number, number])[] };

/**
 * The op and what it is bound to: u32 `[tableWords]` hash-table scratch, `[biasCap]` (token u32,
 * bias f32) pairs (and their host mirror), the history buffer.
 */
interface ProcessBuffers {
  readonly table: GPUBuffer;
  readonly tableWords: number;
  readonly bias: GPUBuffer;
  readonly biasCap: number;
  readonly hostBias: Uint32Array<ArrayBuffer>;
  readonly hostBiasF32: Float32Array<ArrayBuffer>;
  readonly history: GPUBuffer;
  readonly op: LogitsProcessOp;
}

/** The logits-processing records, histories and scratch of one model runner (see the module doc). */
export class LogitsProcessLists {
  readonly ctx: GpuContext;
  /** The penalty histories, by key. */
  readonly histories: PenaltyHistories;
  readonly #arena: ParamArena;
  readonly #bufs: StepBuffers;
  readonly #kernel: LogitsProcess;
  /** The scratch and bias buffers and the op bound to them; null until a step needs them. */
  #current: ProcessBuffers | null = null;
  /** `[maxSeqs]` host records of LOGITS_PROCESS_PARAMS_BYTES bytes. */
  readonly #records: Uint32Array<ArrayBuffer>;

  /**
   * Compiles `logits_process`; its op (over `bufs.logits`, `bufs.processParams` and `bufs.ids`)
   * is bound on the first step that needs it.
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
    this.histories = new PenaltyHistories(ctx, limits.maxModelLen);
    this.#records = new Uint32Array(limits.maxSeqs * LOGITS_PROCESS_PARAMS_BYTES / 4);
  }

  /**
   * Checks the sampled rows' logits processing, creates the histories of keys seen for the first
   * time (uploading their prompts), and stages one record per row and the bias pairs into
   * `writes` (uploaded with the step's command buffer); returns the op to encode, or null when no
   * row has a penalty or a bias (the dispatch is skipped). Nothing is created, uploaded or staged
   * when a check fails.
   *
   * @throws {RangeError} on an invalid penalty, prompt or logit bias, a penalised row without a
   *   history or whose context is shorter than its prompt, or a step beyond the bounds of the
   *   module doc.
   */
  upload(rows: readonly ProcessRow[], writes: StagedWrites): LogitsProcessOp | null {
    const step = this.#check(rows);
    if (step.active === 0) return null;
    this.histories.create(step.fresh);
    const records: LogitsProcessRecord[] = [];
    let tableOffset = 0;
    let biasOffset = 0;
    step.rows.forEach((r, row) => {
      const at = r.key === null ? 0 : this.histories.get(r.key)!.slot * this.histories.slotWords;
      records.push({
        repetition: r.repetition,
        presence: r.presence,
        frequency: r.frequency,
        promptOffset: at,
        promptLen: r.promptLen,
        outputOffset: at + r.promptLen,
        outputLen: r.outputLen,
        biasOffset,
        biasLen: r.bias.length,
        tableOffset,
        append: r.outputLen >= 1 ? (FROM_SAMPLED | rows[row]!.lastIndex) >>> 0 : null,
      });
      tableOffset += tableWordsOf(r);
      biasOffset += r.bias.length;
    });
    packLogitsProcessRecords(records, this.#records);
    const l = this.#ensure(step.tableWords, step.numPairs);
    records.forEach((r, row) => {
      step.rows[row]!.bias.forEach(([token, bias], j) => {
        l.hostBias[2 * (r.biasOffset + j)] = token;
        l.hostBiasF32[2 * (r.biasOffset + j) + 1] = bias;
      });
    });
    const words = rows.length * LOGITS_PROCESS_PARAMS_BYTES / 4;
    writes.write(this.#bufs.processParams, this.#records, words);
    if (step.numPairs > 0) writes.write(l.bias, l.hostBias, 2 * step.numPairs);
    return l.op;
  }

  /**
   * Validates a step's rows (nothing changes; see {@linkcode upload}): each row checked, the
   * prompts of the keys that need a slot (`fresh`), the rows with a penalty or a bias
   * (`active`), the scratch words and bias pairs the step needs.
   */
  #check(rows: readonly ProcessRow[]) {
    const h = this.histories;
    const checked: CheckedRow[] = [];
    const fresh = new Map<string, readonly number[]>();
    let active = 0;
    rows.forEach(({ process: p, contextLen }, row) => {
      if (p !== null) checkLogitsProcessParams(p, row);
      const repetition = p?.repetitionPenalty ?? 1;
      const presence = p?.presencePenalty ?? 0;
      const frequency = p?.frequencyPenalty ?? 0;
      const bias = p?.logitBias ? [...p.logitBias] : [];
      const penalised = repetition !== 1 || presence !== 0 || frequency !== 0;
      const history = penalised ? p?.history ?? null : null;
      if (penalised && history === null) {
        throw new RangeError(`Cannot process logits: sampled row ${row} has penalties, no history`);
      }
      const promptLen = history === null
        ? 0
        : h.get(history.key)?.promptLen ?? history.promptTokens.length;
      if (history !== null && (contextLen < promptLen || contextLen > h.slotWords)) {
        throw new RangeError(
          `Cannot process logits: sampled row ${row} has a context of ${contextLen} tokens for a prompt of ${promptLen} (at most ${h.slotWords})`,
        );
      }
      if (history !== null && !h.has(history.key) && !fresh.has(history.key)) {
        // A new history holds the prompt only: its first row must sample the first output.
        checkPrompt(history.promptTokens, contextLen, row);
        fresh.set(history.key, history.promptTokens);
      }
      if (penalised || bias.length > 0) active++;
      const key = history?.key ?? null;
      const outputLen = history === null ? 0 : contextLen - promptLen;
      checked.push({ repetition, presence, frequency, key, promptLen, outputLen, bias });
    });
    const step = {
      rows: checked,
      fresh,
      active,
      tableWords: checked.reduce((n, r) => n + tableWordsOf(r), 0),
      numPairs: checked.reduce((n, r) => n + r.bias.length, 0),
    };
    const limits: [number, number, string][] = [
      [h.inUse + fresh.size, h.capacity, "penalty histories"],
      [step.tableWords, Math.floor(this.ctx.maxBindingBytes / 4), "words of hash-table scratch"],
      [step.numPairs, Math.floor(this.ctx.maxBindingBytes / 8), "logit-bias pairs"],
    ];
    for (const [need, max, what] of limits) {
      if (need > max) {
        throw new RangeError(
          `Cannot process logits: the step needs ${need} ${what}, at most ${max}`,
        );
      }
    }
    return step;
  }

  /** The scratch and bias buffers, created or grown to the given sizes, and the op bound. */
  #ensure(tableWords: number, numPairs: number): ProcessBuffers {
    const old = this.#current;
    const history = this.histories.buffer;
    if (
      old !== null && old.tableWords >= tableWords && old.biasCap >= numPairs &&
      old.history === history
    ) {
      return old;
    }
    const ctx = this.ctx;
    const grow = (need: number, cap: number, min: number, max: number) =>
      cap > 0 && need <= cap ? cap : Math.min(max, Math.max(2 * need, 4 * cap, min));
    const maxWords = Math.floor(ctx.maxBindingBytes / 4);
    const tableWordsCap = grow(tableWords, old?.tableWords ?? 0, MIN_TABLE_WORDS, maxWords);
    const biasCap = grow(numPairs, old?.biasCap ?? 0, MIN_BIAS_PAIRS, Math.floor(maxWords / 2));
    const table = old?.tableWords === tableWordsCap
      ? old.table
      : ctx.createBuffer("process.table", tableWordsCap * 4, STORAGE_RW);
    const bias = old?.biasCap === biasCap
      ? old.bias
      : ctx.createBuffer("process.bias", biasCap * 8, STORAGE_RW);
    const hostBias = old?.biasCap === biasCap ? old.hostBias : new Uint32Array(2 * biasCap);
    const b = (buffer: GPUBuffer) => ({ buffer });
    const bufs = this.#bufs;
    const next: ProcessBuffers = {
      table,
      tableWords: tableWordsCap,
      bias,
      biasCap,
      hostBias,
      hostBiasF32: new Float32Array(hostBias.buffer),
      history,
      op: this.#kernel.bind(this.#arena, {
        logits: b(bufs.logits),
        params: b(bufs.processParams),
        tokens: b(history),
        bias: b(bias),
        // The append reads the row's last fed token, as token_feed resolved it.
        sampled: b(bufs.ids),
        table: b(table),
      }),
    };
    // Steps already submitted keep their buffers alive until they complete.
    if (old !== null) {
      if (old.table !== table) old.table.destroy();
      if (old.bias !== bias) old.bias.destroy();
    }
    this.#current = next;
    return next;
  }

  /** Releases the histories and the scratch and bias buffers (the step buffers are the runner's). */
  destroy(): void {
    this.histories.destroy();
    const l = this.#current;
    if (l !== null) {
      l.table.destroy();
      l.bias.destroy();
    }
  }
}

/** u32 words of scratch a row's hash table takes (the kernel counts the prompt for repetition). */
function tableWordsOf(r: CheckedRow): number {
  return TABLE_WORDS_PER_TOKEN * ((r.repetition !== 1 ? r.promptLen : 0) + r.outputLen);
}

/**
 * Checks a new history's prompt: every token a u32 (its slot is written once, when created), and
 * the row sampling the first output token (the history would miss the earlier ones).
 */
function checkPrompt(prompt: readonly number[], contextLen: number, row: number): void {
  if (contextLen !== prompt.length) {
    throw new RangeError(
      `Cannot process logits: sampled row ${row} starts a penalty history at ${contextLen} tokens, past its prompt of ${prompt.length}`,
    );
  }
  for (const t of prompt) {
    if (!Number.isInteger(t) || t < 0 || t > 0xffffffff) {
      throw new RangeError(`Cannot process logits: sampled row ${row} has prompt token ${t}`);
    }
  }
}
