/**
 * `logits_process`: the OpenAI / vLLM sampling parameters that change the logits before
 * `sample` — `logit_bias`, `repetition_penalty`, `presence_penalty`, `frequency_penalty` —
 * applied in place on the GPU, touching only the logits of the tokens each sequence lists. See
 * `logits_process.wgsl` for the exact rules, the deduplication, bindings and grid.
 *
 * Order within the engine's step: `top_logprobs` (raw logits) → `logits_process` → `sample`.
 *
 * Per-sequence records ({@linkcode LOGITS_PROCESS_PARAMS_BYTES} bytes each), packed on the host
 * with {@linkcode packLogitsProcess} (whole lists) or {@linkcode packLogitsProcessRecords}
 * (records only, for an engine that keeps the token lists in a persistent buffer: the engine's
 * penalty histories, engine/logits_process_lists.ts, which grow on the GPU by the append):
 *
 * | byte | field           | type | meaning                                               |
 * | ---- | --------------- | ---- | ----------------------------------------------------- |
 * | 0    | `repetition`    | f32  | repetition penalty; `1`: off; `> 0`                   |
 * | 4    | `presence`      | f32  | presence penalty; `0`: off                            |
 * | 8    | `frequency`     | f32  | frequency penalty; `0`: off                           |
 * | 12   | `prompt_offset` | u32  | first prompt token in the `tokens` buffer             |
 * | 16   | `prompt_len`    | u32  | prompt tokens                                         |
 * | 20   | `output_offset` | u32  | first output token in the `tokens` buffer             |
 * | 24   | `output_len`    | u32  | output tokens so far (ids or references)              |
 * | 28   | `bias_offset`   | u32  | first (token, bias) pair in the `bias` buffer         |
 * | 32   | `bias_len`      | u32  | bias pairs (distinct tokens)                          |
 * | 36   | `table_offset`  | u32  | hash-table region in `table`: 4 * (prompt_len +       |
 * |      |                 |      | output_len) u32 words, not shared with another row    |
 * | 40   | `append`        | u32  | entry (id or reference) written to the last output    |
 * |      |                 |      | token of the list, `tokens[output_offset + output_len |
 * |      |                 |      | - 1]`, before anything is counted                     |
 * | 44   | `append_len`    | u32  | 1: append (when `output_len >= 1`); 0: none           |
 *
 * A record with every penalty off and no bias costs one early return (after its append).
 *
 * @module
 */

import source from "./logits_process.wgsl" with { type: "text" };
import { logitRowSource } from "./logit_row.ts";
import type { GpuContext } from "../gpu/context.ts";
import type { ParamArena } from "../gpu/params.ts";
import { CallSite } from "./call_site.ts";

/** Bytes of one sequence's record in the `params` buffer (12 words). */
export const LOGITS_PROCESS_PARAMS_BYTES = 48;

/** u32 words of hash table per listed (prompt or output) token of a sequence. */
export const TABLE_WORDS_PER_TOKEN = 4;

/** Penalties and bias of one sequence (host side); every field is optional. */
export interface LogitsProcessParams {
  /** vLLM / HF repetition penalty over prompt and output tokens; `> 0`, default 1 = off. */
  repetitionPenalty?: number;
  /** Subtracted once from every token present in the output; default 0 = off. */
  presencePenalty?: number;
  /** Subtracted per occurrence of a token in the output; default 0 = off. */
  frequencyPenalty?: number;
  /** Prompt token ids (used by the repetition penalty only). */
  promptTokens?: ArrayLike<number>;
  /** Output token ids so far; an id may be a `sampledRef` (bit 31 set), resolved on the GPU. */
  outputTokens?: ArrayLike<number>;
  /** `logit_bias`: (token id, bias) pairs with distinct tokens, added before the penalties. */
  logitBias?: Iterable<readonly [number, number]>;
}

/** One sequence's record with explicit offsets (see the module doc). */
export interface LogitsProcessRecord {
  /** Repetition penalty, `> 0`; 1 = off. */
  repetition: number;
  /** Presence penalty; 0 = off. */
  presence: number;
  /** Frequency penalty; 0 = off. */
  frequency: number;
  /** Index of the first prompt token in the `tokens` buffer (u32 elements). */
  promptOffset: number;
  /** Prompt tokens (read only when `repetition != 1`). */
  promptLen: number;
  /** Index of the first output token in the `tokens` buffer (u32 elements). */
  outputOffset: number;
  /** Output tokens so far (read only when some penalty is on). */
  outputLen: number;
  /** Index of the first (token, bias) pair in the `bias` buffer (pairs). */
  biasOffset: number;
  /** Bias pairs; their tokens must be distinct. */
  biasLen: number;
  /** u32 word index of the sequence's hash table in `table`: 4 * (promptLen + outputLen) words. */
  tableOffset: number;
  /**
   * A list entry (token id, or reference into `sampled`) the kernel resolves and writes as the
   * last output token, `tokens[outputOffset + outputLen - 1]`, before counting (only when
   * `outputLen >= 1`); absent or null: the lists are only read.
   */
  append?: number | null;
}

/** The host arrays of one step, ready for upload (see {@linkcode packLogitsProcess}). */
export interface PackedLogitsProcess {
  /** `[numSeqs]` records for the `params` buffer (u32 view of f32/u32 words). */
  readonly params: Uint32Array<ArrayBuffer>;
  /** u32 `[total tokens]`: every sequence's prompt then output tokens (at least 1 word). */
  readonly tokens: Uint32Array<ArrayBuffer>;
  /** `[total pairs, 2]` words: token u32, then bias as f32 bits (at least 1 pair). */
  readonly bias: Uint32Array<ArrayBuffer>;
  /** u32 words the `table` scratch buffer needs (at least 1). */
  readonly tableWords: number;
  /** Sequences with some penalty or bias: when 0, the dispatch can be skipped. */
  readonly active: number;
}

function fail(what: string, s: number, value: unknown): never {
  throw new RangeError(`Cannot pack logits processing: sequence ${s} has ${what} ${value}`);
}

function checkU32(what: string, value: number, s: number): number {
  if (!Number.isInteger(value) || value < 0 || value > 0xffffffff) fail(what, s, value);
  return value;
}

/**
 * Throws a RangeError unless sequence `s`'s penalties and logit bias pack: a finite repetition
 * penalty `> 0`, finite presence and frequency penalties, bias tokens that are integers below
 * 2^31 listed once, finite biases. (Token lists are checked as they are copied.) The packers
 * apply it to every sequence; the WebGPU executor applies it to one request before a step, so
 * that a bad request fails alone.
 */
export function checkLogitsProcessParams(p: LogitsProcessParams, s = 0): void {
  const repetition = p.repetitionPenalty ?? 1;
  if (!(Number.isFinite(repetition) && repetition > 0)) fail("repetition penalty", s, repetition);
  const presence = p.presencePenalty ?? 0;
  if (!Number.isFinite(presence)) fail("presence penalty", s, presence);
  const frequency = p.frequencyPenalty ?? 0;
  if (!Number.isFinite(frequency)) fail("frequency penalty", s, frequency);
  const seen = new Set<number>();
  for (const [token, b] of p.logitBias ?? []) {
    if (!Number.isInteger(token) || token < 0 || token > 0x7fffffff) {
      fail("logit bias token", s, token);
    }
    if (seen.has(token)) fail("a logit bias listed twice for token", s, token);
    if (!Number.isFinite(b)) fail(`logit bias for token ${token}:`, s, b);
    seen.add(token);
  }
}

function isActive(r: { repetition: number; presence: number; frequency: number }, bias: number) {
  return r.repetition !== 1 || r.presence !== 0 || r.frequency !== 0 || bias > 0;
}

/**
 * Writes one record per sequence into `out` (or a new array).
 *
 * @throws {RangeError} on a penalty that is not finite (or a repetition penalty `<= 0`), or an
 *   offset / length that is not a u32.
 */
export function packLogitsProcessRecords(
  records: readonly LogitsProcessRecord[],
  out: Uint32Array<ArrayBuffer> = new Uint32Array(records.length * LOGITS_PROCESS_PARAMS_BYTES / 4),
): Uint32Array<ArrayBuffer> {
  const words = LOGITS_PROCESS_PARAMS_BYTES / 4;
  if (out.length < records.length * words) {
    throw new RangeError(
      `Cannot pack logits processing: ${records.length} sequences need ${
        records.length * words
      } words, the array has ${out.length}`,
    );
  }
  const f32 = new Float32Array(out.buffer, out.byteOffset, out.length);
  records.forEach((r, s) => {
    if (!(Number.isFinite(r.repetition) && r.repetition > 0)) {
      fail("repetition penalty", s, r.repetition);
    }
    if (!Number.isFinite(r.presence)) fail("presence penalty", s, r.presence);
    if (!Number.isFinite(r.frequency)) fail("frequency penalty", s, r.frequency);
    const w = s * words;
    f32[w] = r.repetition;
    f32[w + 1] = r.presence;
    f32[w + 2] = r.frequency;
    out[w + 3] = checkU32("promptOffset", r.promptOffset, s);
    out[w + 4] = checkU32("promptLen", r.promptLen, s);
    out[w + 5] = checkU32("outputOffset", r.outputOffset, s);
    out[w + 6] = checkU32("outputLen", r.outputLen, s);
    out[w + 7] = checkU32("biasOffset", r.biasOffset, s);
    out[w + 8] = checkU32("biasLen", r.biasLen, s);
    out[w + 9] = checkU32("tableOffset", r.tableOffset, s);
    const append = r.append ?? null;
    out[w + 10] = append === null ? 0 : checkU32("append", append, s);
    out[w + 11] = append === null ? 0 : 1;
  });
  return out;
}

/**
 * Packs every sequence's records, token lists and bias pairs. Sequences with everything off
 * contribute no tokens and no table space.
 *
 * @throws {RangeError} on an invalid penalty, a token id that is not a u32, a bias token with
 *   bit 31 set or listed twice, or a bias that is not finite.
 */
export function packLogitsProcess(params: readonly LogitsProcessParams[]): PackedLogitsProcess {
  const records: LogitsProcessRecord[] = [];
  const tokens: number[] = [];
  const bias: number[] = [];
  const f32 = new Float32Array(1);
  const bits = new Uint32Array(f32.buffer);
  let tableWords = 0;
  let active = 0;
  params.forEach((p, s) => {
    const repetition = p.repetitionPenalty ?? 1;
    const presence = p.presencePenalty ?? 0;
    const frequency = p.frequencyPenalty ?? 0;
    const biasOffset = bias.length / 2;
    checkLogitsProcessParams(p, s);
    for (const [token, b] of p.logitBias ?? []) {
      f32[0] = b;
      bias.push(token, bits[0]!);
    }
    const biasLen = bias.length / 2 - biasOffset;
    const penalties = { repetition, presence, frequency };
    const useRep = repetition !== 1;
    const useOut = isActive(penalties, 0);
    const prompt = useRep ? p.promptTokens ?? [] : [];
    const output = useOut ? p.outputTokens ?? [] : [];
    const promptOffset = tokens.length;
    for (let i = 0; i < prompt.length; i++) tokens.push(checkU32("prompt token", prompt[i]!, s));
    const outputOffset = tokens.length;
    for (let i = 0; i < output.length; i++) tokens.push(checkU32("output token", output[i]!, s));
    records.push({
      ...penalties,
      promptOffset,
      promptLen: prompt.length,
      outputOffset,
      outputLen: output.length,
      biasOffset,
      biasLen,
      tableOffset: tableWords,
    });
    tableWords += TABLE_WORDS_PER_TOKEN * (prompt.length + output.length);
    if (isActive(penalties, biasLen)) active++;
  });
  return {
    params: packLogitsProcessRecords(records),
    // Never empty: a binding needs at least 4 bytes (and empty uploads are awkward).
    tokens: Uint32Array.from(tokens.length > 0 ? tokens : [0]),
    bias: Uint32Array.from(bias.length > 0 ? bias : [0, 0]),
    tableWords: Math.max(tableWords, 1),
    active,
  };
}

/** Buffers of one `logits_process` call site; fixed for the op's lifetime. */
export interface LogitsProcessBuffers {
  /** f32 `[numSeqs, vocab]` (row stride `vocab`): the logits, updated in place. */
  readonly logits: GPUBufferBinding;
  /** `[numSeqs]` records of {@linkcode LOGITS_PROCESS_PARAMS_BYTES} bytes. */
  readonly params: GPUBufferBinding;
  /**
   * u32 `[total tokens]`: prompt and output token lists (ids, or references into `sampled`);
   * the kernel writes a record's `append` into it.
   */
  readonly tokens: GPUBufferBinding;
  /** `[total pairs]` of (token u32, bias f32): the logit bias pairs. */
  readonly bias: GPUBufferBinding;
  /**
   * u32 `[numSampled]`: the ids that references (entries with bit 31 set) point into, e.g.
   * recently sampled ids; the engine binds the step's resolved input ids.
   */
  readonly sampled: GPUBufferBinding;
  /** u32 `[tableWords]`: scratch hash tables (contents need not be initialised). */
  readonly table: GPUBufferBinding;
}

/** The compiled `logits_process` pipeline; {@linkcode LogitsProcess.bind} makes call sites. */
export class LogitsProcess {
  readonly #ctx: GpuContext;
  readonly #pipeline: GPUComputePipeline;

  constructor(ctx: GpuContext) {
    this.#ctx = ctx;
    this.#pipeline = ctx.pipeline("logits_process", () => logitRowSource(source));
  }

  /** Creates a call site: its bind group and parameter slot are made once, here. */
  bind(arena: ParamArena, buffers: LogitsProcessBuffers): LogitsProcessOp {
    return new LogitsProcessOp(
      new CallSite(this.#ctx, arena, this.#pipeline, "logits_process", [
        buffers.logits,
        buffers.params,
        buffers.tokens,
        buffers.bias,
        buffers.sampled,
        buffers.table,
      ]),
    );
  }
}

/** One `logits_process` call site. */
export class LogitsProcessOp {
  constructor(private readonly site: CallSite) {}

  /**
   * Encodes the processing of `numSeqs` rows of `vocab` logits (one workgroup per row).
   *
   * @throws {RangeError} when `vocab` is 0 or `numSeqs * vocab` exceeds 2^32 elements.
   */
  encode(pass: GPUComputePassEncoder, numSeqs: number, vocab: number): void {
    if (!Number.isInteger(vocab) || vocab < 1 || numSeqs * vocab > 0xffffffff) {
      throw new RangeError(`Cannot process ${numSeqs} rows of ${vocab} logits`);
    }
    this.site.slot.setU32(0, numSeqs, vocab);
    this.site.dispatch(pass, numSeqs);
  }
}
