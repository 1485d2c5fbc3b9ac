/**
 * Structured outputs in the engine: one xgrammar matcher per constrained request, kept in a
 * grammar worker (grammar_worker.ts) off the engine's thread. Each token read back for a
 * constrained request is sent to its matcher ({@linkcode StructuredOutputs.accept}), which
 * replies with the request's next allowed-token bitmask while the engine goes on (with the
 * GPU's step); the engine applies the masks of the constrained requests that sample in a step
 * (the GPU sampler masks those rows only, before logits processing and sampling:
 * kernels/token_mask.ts). The scheduler runs a constrained request only once its previous token
 * is known and its next mask is back ({@linkcode StructuredOutputs.ready}), so its mask always
 * follows every token it has.
 *
 * Grammars are compiled on admission, in the worker, against the model's vocabulary over the
 * whole logits width (ids past the tokenizer's vocabulary, padding, are never allowed), and
 * cached by their specification. A compile that runs longer than the time limit is a 400: the
 * worker is terminated and a new one rebuilds the other requests' matchers (their grammars
 * compiled again, their tokens replayed). A JSON schema keyword the engine does not enforce is
 * refused with a 400 naming it (json_schema_check.ts).
 *
 * @module
 */

import type { StructuredOutputSpec } from "../../scheduler/sampling_params.ts";
import type { SchedulerOutput } from "../../scheduler/scheduler_output.ts";
import { InvalidParameterError } from "../input_processor.ts";
import { DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S } from "../engine_config.ts";
import type { Tokenizer } from "../tokenizer.ts";
import type { FromGrammarWorker, ToGrammarWorker } from "./grammar_protocol.ts";
import { checkJsonSchema } from "./json_schema_check.ts";

/** Options of {@linkcode StructuredOutputs}. */
export interface StructuredOutputsOptions {
  /** Time limit of one grammar compile in seconds (default 10); past it, admission fails. */
  readonly compileTimeoutS?: number;
}

/** One constrained request, on the engine's side. */
interface Entry {
  readonly spec: StructuredOutputSpec;
  readonly key: string;
  /** The text the grammar waits for (e.g. `</think>`); null once it applies. */
  waitingFor: string | null;
  /** The end of the output decoded so far, while waiting (to find the text across tokens). */
  tail: string;
  /** Tokens the grammar accepted (replayed into a new worker's matcher). */
  readonly history: number[];
  /** The next token's mask once it is back from the worker; null while it is computed. */
  mask: Uint32Array | null;
  /** Whether a mask was asked for and is not back yet. */
  asked: boolean;
  /** While the grammar compiles: settles the admission. */
  opening: {
    readonly param: string;
    readonly resolve: () => void;
    readonly reject: (error: Error) => void;
    timer: ReturnType<typeof setTimeout> | undefined;
  } | null;
}

/** The structured-output state of one engine (see the module documentation). */
export class StructuredOutputs {
  readonly #tokenizer: Tokenizer | null;
  readonly #vocabSize: number;
  readonly #stopTokenIds: readonly number[];
  readonly #timeoutMs: number;
  #onReady: () => void = () => {};
  #onError: (requestId: string, error: Error) => void = () => {};
  #worker: Worker | null = null;
  readonly #entries = new Map<string, Entry>();
  /** Waiters for the masks being computed ({@linkcode StructuredOutputs.settled}). */
  #waiters: (() => void)[] = [];

  /**
   * @param tokenizer the model's tokenizer (structured outputs need one).
   * @param vocabSize the logits width (the model's `vocab_size`).
   * @param stopTokenIds the model's end-of-sequence ids (allowed once the grammar is complete).
   */
  constructor(
    tokenizer: Tokenizer | null,
    vocabSize: number,
    stopTokenIds: readonly number[],
    options: StructuredOutputsOptions = {},
  ) {
    this.#tokenizer = tokenizer;
    this.#vocabSize = vocabSize;
    this.#stopTokenIds = stopTokenIds;
    this.#timeoutMs = 1000 * (options.compileTimeoutS ?? DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S);
  }

  /**
   * Sets what happens when a request's next mask arrives (`onReady`: it may run now) and when a
   * running request's grammar fails (`onError`: it refused a token it was fed, a bug, or the
   * worker died); the request is released first.
   */
  listen(onReady: () => void, onError: (requestId: string, error: Error) => void): void {
    this.#onReady = onReady;
    this.#onError = onError;
  }

  /** Whether some request is constrained now. */
  get active(): boolean {
    return this.#entries.size > 0;
  }

  /**
   * Compiles (or reuses) `spec`'s grammar and starts `requestId`'s matcher; with `after`, the
   * grammar applies once that text is out (e.g. `</think>`).
   *
   * @throws {InvalidParameterError} when the model has no tokenizer, the grammar is invalid,
   *   uses what the engine cannot enforce, or takes longer than the time limit to compile.
   */
  admit(
    requestId: string,
    spec: StructuredOutputSpec,
    param: string,
    after: string | null = null,
  ): Promise<void> {
    if (this.#tokenizer === null) {
      throw new InvalidParameterError(
        param,
        "Structured outputs need the model's tokenizer; this model has none",
      );
    }
    if (spec.kind === "json_schema") checkJsonSchema(spec.schema, param);
    if (spec.kind === "tool_calls") {
      spec.tools.forEach((t, i) =>
        checkJsonSchema(t.parameters, `tools.${i}.function.parameters`, "parameters")
      );
    }
    if (this.#entries.has(requestId)) {
      throw new Error(`Request "${requestId}" is constrained twice`);
    }
    return new Promise<void>((resolve, reject) => {
      const entry: Entry = {
        spec,
        key: JSON.stringify(spec),
        waitingFor: after,
        tail: "",
        history: [],
        mask: null,
        asked: false,
        opening: { param, resolve, reject, timer: undefined },
      };
      this.#entries.set(requestId, entry);
      this.#open(requestId, entry);
    });
  }

  /**
   * Whether `requestId` can run now: unconstrained, its grammar not applying yet, or its next
   * mask back from the worker.
   */
  ready(requestId: string): boolean {
    const entry = this.#entries.get(requestId);
    return entry === undefined || entry.waitingFor !== null || entry.mask !== null;
  }

  /**
   * Resolves once every mask asked for is back, or at once when the worker has a grammar to
   * compile first (the requests waiting for those masks sit out the next step instead).
   */
  settled(): Promise<void> {
    if (this.#compiling() || this.#pending() === 0) return Promise.resolve();
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  /**
   * The allowed-token bitmasks of the constrained requests that sample in `output` (request id
   * -> `ceil(vocabSize / 32)` words), or undefined when none does.
   *
   * @throws {Error} when one of them is not {@linkcode StructuredOutputs.ready} (a bug).
   */
  masks(output: SchedulerOutput): Map<string, Uint32Array> | undefined {
    let masks: Map<string, Uint32Array> | undefined;
    for (const r of output.scheduled) {
      if (!r.samplesToken) continue;
      const entry = this.#entries.get(r.requestId);
      if (entry === undefined || entry.waitingFor !== null) continue;
      if (entry.mask === null) {
        throw new Error(`Request "${r.requestId}" was scheduled before its next mask was known`);
      }
      (masks ??= new Map()).set(r.requestId, entry.mask);
    }
    return masks;
  }

  /**
   * Feeds tokens read back for `requestId` to its matcher (a no-op for unconstrained ones) and
   * asks for its next mask. A token the grammar refuses (a bug: the mask allowed it) is
   * reported through `onError`.
   */
  accept(requestId: string, tokenIds: readonly number[]): void {
    const entry = this.#entries.get(requestId);
    if (entry === undefined || entry.opening !== null) return;
    const fed: number[] = [];
    let started = false;
    for (const t of tokenIds) {
      if (entry.waitingFor !== null) {
        // Until the text is out, tokens are free (not the grammar's); it applies after them.
        const marker = entry.waitingFor;
        entry.tail = (entry.tail + this.#tokenizer!.decode([t])).slice(-4 * marker.length);
        if (entry.tail.includes(marker)) {
          entry.waitingFor = null;
          started = true;
        }
        continue;
      }
      fed.push(t);
    }
    if (fed.length === 0 && !started) return;
    entry.history.push(...fed);
    entry.mask = null;
    entry.asked = !this.terminated(requestId);
    this.#post({ type: "accept", id: requestId, tokens: fed, mask: entry.asked });
  }

  /** Whether `requestId`'s grammar is complete (its stop token accepted). */
  terminated(requestId: string): boolean {
    const entry = this.#entries.get(requestId);
    if (entry === undefined || entry.waitingFor !== null) return false;
    const last = entry.history.at(-1);
    // The mask allows a stop token only where the grammar may end.
    return last !== undefined && this.#stopTokenIds.includes(last);
  }

  /** Ends `requestId`'s matcher (an admission still compiling is rejected). */
  release(requestId: string): void {
    this.#drop(
      requestId,
      new RangeError(`Request "${requestId}" ended while its grammar compiled`),
    );
  }

  /** Stops the worker (matchers and compiled grammars with it; admissions are rejected). */
  close(): void {
    for (const [id, entry] of this.#entries) {
      if (entry.opening === null) continue;
      clearTimeout(entry.opening.timer);
      entry.opening.reject(new RangeError(`Request "${id}": structured outputs were stopped`));
    }
    this.#entries.clear();
    this.#stopWorker();
    this.#wakeWaiters();
  }

  /**
   * Forgets `id` and closes its matcher; returns true when it was still being admitted (its
   * admission is then rejected with `error`).
   */
  #drop(id: string, error: Error): boolean {
    const entry = this.#entries.get(id);
    if (entry === undefined) return false;
    this.#entries.delete(id);
    this.#post({ type: "close", id });
    this.#wakeWaiters();
    if (entry.opening === null) return false;
    clearTimeout(entry.opening.timer);
    entry.opening.reject(error);
    return true;
  }

  /** Sends `id`'s grammar to the worker (again, in a new worker). */
  #open(id: string, entry: Entry): void {
    if (entry.opening !== null) clearTimeout(entry.opening.timer);
    const mask = entry.waitingFor === null && !this.terminated(id);
    entry.mask = null;
    entry.asked = entry.opening === null && mask;
    this.#post({ type: "open", id, key: entry.key, spec: entry.spec, replay: entry.history, mask });
  }

  #timedOut(id: string): void {
    const entry = this.#entries.get(id);
    if (entry?.opening == null) return;
    const { param, reject } = entry.opening;
    this.#entries.delete(id);
    reject(
      new InvalidParameterError(
        param,
        `Compiling the ${entry.spec.kind} grammar took longer than ${
          this.#timeoutMs / 1000
        } s (--grammar-compile-timeout-s)`,
      ),
    );
    // The worker is stuck in that compile: a new one takes over every other request.
    this.#stopWorker();
    for (const [other, e] of this.#entries) this.#open(other, e);
  }

  #post(message: ToGrammarWorker): void {
    if (this.#worker === null) {
      if (message.type === "close") return;
      this.#worker = this.#startWorker();
    }
    this.#worker.postMessage(message);
  }

  #startWorker(): Worker {
    const worker = new Worker(new URL("./grammar_worker.ts", import.meta.url).href, {
      type: "module",
    });
    worker.onmessage = (event: MessageEvent<FromGrammarWorker>) => this.#receive(event.data);
    worker.onerror = (event) => {
      event.preventDefault();
      this.#crashed(new Error(`The grammar worker failed: ${event.message}`));
    };
    const v = this.#tokenizer!.grammarVocab;
    worker.postMessage(
      {
        type: "init",
        vocab: { encoded: v.encoded, vocabType: v.vocabType, prependSpace: v.prependSpace },
        vocabSize: this.#vocabSize,
        stopTokenIds: this.#stopTokenIds,
      } satisfies ToGrammarWorker,
    );
    return worker;
  }

  #stopWorker(): void {
    if (this.#worker === null) return;
    this.#worker.onmessage = null;
    this.#worker.onerror = null;
    this.#worker.terminate();
    this.#worker = null;
  }

  #receive(m: FromGrammarWorker): void {
    const entry = this.#entries.get(m.id);
    if (entry === undefined) return; // released meanwhile
    if (m.type === "compiling") {
      // The time limit counts the compile only, not the wait behind others.
      if (entry.opening !== null) {
        entry.opening.timer = setTimeout(() => this.#timedOut(m.id), this.#timeoutMs);
      }
      return;
    }
    if (m.type === "rejected") {
      const error = new Error(`The grammar rejected sampled token ${m.token}`);
      if (!this.#drop(m.id, error)) this.#onError(m.id, error);
      return;
    }
    if (m.type === "opened" && entry.opening !== null) {
      const { param, resolve, timer } = entry.opening;
      if (m.error !== null) {
        const why = `Invalid ${entry.spec.kind} for structured outputs: ${m.error}`;
        this.#drop(m.id, new InvalidParameterError(param, why));
        return;
      }
      clearTimeout(timer);
      entry.opening = null;
      entry.mask = m.mask;
      entry.asked = false;
      resolve();
    } else if (m.type === "opened") {
      // A matcher rebuilt in a new worker (its grammar compiled before: no error expected).
      if (m.error !== null) {
        const error = new Error(`The grammar could not be rebuilt: ${m.error}`);
        this.#drop(m.id, error);
        this.#onError(m.id, error);
        return;
      }
      entry.mask = m.mask;
      entry.asked = false;
    } else {
      entry.mask = m.mask;
      entry.asked = false;
    }
    this.#onReady();
    this.#wakeWaiters();
  }

  /** The worker died: every constrained request fails (admissions with a 400-free error). */
  #crashed(error: Error): void {
    this.#stopWorker();
    for (const id of [...this.#entries.keys()]) {
      if (!this.#drop(id, error)) this.#onError(id, error);
    }
  }

  /** Whether some admission's grammar is still with the worker (masks may queue behind it). */
  #compiling(): boolean {
    for (const e of this.#entries.values()) if (e.opening !== null) return true;
    return false;
  }

  /** Masks asked for and not back yet. */
  #pending(): number {
    let n = 0;
    for (const e of this.#entries.values()) if (e.asked) n++;
    return n;
  }

  #wakeWaiters(): void {
    if (this.#waiters.length === 0) return;
    if (!this.#compiling() && this.#pending() > 0) return;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w();
  }
}
