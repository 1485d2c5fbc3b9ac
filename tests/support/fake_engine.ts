/**
 * A deterministic fake {@linkcode EngineClient} for the HTTP server tests, and a helper that
 * loads a real tokenizer from a tiny generated checkpoint.
 *
 * Output tokens: with `temperature` 0 the fake echoes the prompt cyclically (token k is prompt
 * token k mod prompt length), or the tokens of its `reply` option when it has one; otherwise token k is drawn from a hash of (seed, prompt, k), the
 * seed being `params.seed` or a fresh random one. It finishes with `length` after `maxTokens`
 * tokens, with `stop` on the tokenizer's EOS (unless `ignoreEos`, and only after `minTokens`),
 * on a `stopTokenIds` token (kept in the output), or on a stop string (matched on the decoded
 * text, held back while it could still be the start of one, never emitted). Special tokens are
 * left out of the text. One token per increment, `stepMs` apart.
 *
 * Prompt logprobs: with `params.promptLogprobs` not null, the first increment carries
 * {@linkcode fakePromptLogprobs}: null for prompt position 0, then for position k the prompt token
 * with logprob -(k + 1) / 10 and rank k % 5 + 1, and `promptLogprobs` top entries, best first,
 * entry j with logprob -(k + 1) / 10 - (j - rank + 1) / 100; entry rank - 1 (when there is one)
 * is the prompt token itself, the others ids (prompt token + 1 + j) mod the vocabulary size.
 *
 * `generate` throws synchronously, like the real engine: RangeError for an empty, too long or
 * out-of-vocabulary prompt or a duplicate id, EngineOverloadedError when `maxActive` requests
 * are already active, EngineDeadError after {@linkcode FakeEngine.kill} or `shutdown`.
 *
 * @module
 */

import {
  type EngineClient,
  EngineDeadError,
  EngineOverloadedError,
  type EngineStats,
  type GenerateRequest,
  type ModelInfo,
  type PromptLogprob,
  type RequestOutput,
  type TokenLogprob,
} from "../../engine/engine_api.ts";
import { Tokenizer } from "../../engine/tokenizer.ts";
import type { SamplingParams } from "../../scheduler/sampling_params.ts";
import { makeModel } from "../../tools/make_model.ts";
import { type RunningServer, startServer, type StartServerOptions } from "../../server/server.ts";

/** Options of {@linkcode FakeEngine}. */
export interface FakeEngineOptions {
  /** Model name (default "fake-model"). */
  name?: string;
  /** Default 256. */
  maxModelLen?: number;
  /** Default: the tokenizer's size, or 512. */
  vocabSize?: number;
  /** Delay before each increment in ms (default 2). */
  stepMs?: number;
  /** Most requests active at once; one more throws EngineOverloadedError (default Infinity). */
  maxActive?: number;
  /** With `temperature` 0, answer this text's tokens (cyclically) instead of the prompt's. */
  reply?: string;
  /** The model's sampling defaults (engine/generation_defaults.ts; default none). */
  generationDefaults?: Partial<SamplingParams>;
}

const REPLACEMENT = "\uFFFD";

function mix(a: number, b: number): number {
  let h = Math.imul(a ^ 0x9e3779b9, 0x85ebca6b) ^ b;
  h = Math.imul(h ^ (h >>> 15), 0xc2b2ae35);
  h ^= h >>> 13;
  return h >>> 0;
}

/**
 * The prompt logprobs {@linkcode FakeEngine} answers for `prompt` with `promptLogprobs` `count`
 * (see the module doc) on a vocabulary of `vocabSize` ids.
 */
export function fakePromptLogprobs(
  prompt: readonly number[],
  count: number,
  vocabSize: number,
): (PromptLogprob | null)[] {
  return prompt.map((tokenId, k) => {
    if (k === 0) return null;
    const logprob = -(k + 1) / 10;
    const rank = k % 5 + 1;
    const top = [];
    for (let j = 0; j < count; j++) {
      top.push({
        tokenId: j === rank - 1 ? tokenId : (tokenId + 1 + j) % vocabSize,
        logprob: logprob - (j - rank + 1) / 100,
      });
    }
    return { tokenId, logprob, rank, top };
  });
}

/** A fake engine (see the module doc). */
export class FakeEngine implements EngineClient {
  readonly model: ModelInfo;
  readonly tokenizer: Tokenizer | null;
  readonly generationDefaults: Partial<SamplingParams>;
  readonly #reply: number[] | null;
  readonly stepMs: number;
  maxActive: number;
  /** Every request received by `generate` (also the rejected ones), in order. */
  readonly requests: GenerateRequest[] = [];
  /** Ids of requests that ended by an abort (signal, `abort()`, iteration stopped early). */
  readonly aborted: string[] = [];
  /**
   * Makes a coming `generate` call fail with `error`: thrown by the call itself ("sync") or by
   * the first `next()` of its stream ("async"), after letting `after` calls (default 0) pass.
   */
  failNext: { error: Error; mode: "sync" | "async"; after?: number } | null = null;
  /** Waiting-requests gauge reported by `stats()` (settable by tests). */
  numWaiting = 0;
  #error: Error | null = null;
  #closed = false;
  readonly #active = new Map<string, { abort: () => void; tokens: number }>();
  readonly #ordinary: number[];
  #promptTokens = 0;
  #generationTokens = 0;
  #steps = 0;
  readonly #idle = new Set<() => void>();

  constructor(tokenizer: Tokenizer | null, options: FakeEngineOptions = {}) {
    this.tokenizer = tokenizer;
    this.generationDefaults = options.generationDefaults ?? {};
    this.stepMs = options.stepMs ?? 2;
    this.#reply = options.reply === undefined || tokenizer === null
      ? null
      : tokenizer.encode(options.reply, { addSpecialTokens: false });
    this.maxActive = options.maxActive ?? Infinity;
    const vocabSize = options.vocabSize ?? tokenizer?.size ?? 512;
    this.model = {
      name: options.name ?? "fake-model",
      architecture: "mock",
      maxModelLen: options.maxModelLen ?? 256,
      vocabSize,
      dtype: "none",
    };
    // Sampled tokens avoid special ids and ids the tokenizer does not know.
    this.#ordinary = [];
    for (let id = 0; id < vocabSize; id++) {
      if (
        tokenizer === null ||
        (!tokenizer.specialIds.has(id) && tokenizer.idToToken(id) !== undefined)
      ) {
        this.#ordinary.push(id);
      }
    }
  }

  /** Whether `shutdown` was called. */
  get isShutDown(): boolean {
    return this.#closed;
  }

  /** Requests currently active. */
  get active(): number {
    return this.#active.size;
  }

  get error(): Error | null {
    return this.#error;
  }

  /** Simulates a fatal error: `error` is set and every active request is aborted. */
  kill(error = new Error("device lost")): void {
    this.#error = error;
    for (const r of this.#active.values()) r.abort();
  }

  /** Resolves once no request is active. */
  whenIdle(): Promise<void> {
    if (this.#active.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idle.add(resolve));
  }

  generate(request: GenerateRequest, signal?: AbortSignal): AsyncIterable<RequestOutput> {
    this.requests.push(request);
    const fail = this.failNext;
    if (fail !== null) {
      if (fail.after !== undefined && fail.after > 0) {
        fail.after--;
      } else {
        this.failNext = null;
        if (fail.mode === "sync") throw fail.error;
        const rejecting: AsyncIterator<RequestOutput> = {
          next: () => Promise.reject(fail.error),
        };
        return { [Symbol.asyncIterator]: () => rejecting };
      }
    }
    if (this.#error !== null || this.#closed) {
      throw new EngineDeadError(this.#error?.message ?? "the engine was shut down");
    }
    const ids = request.promptTokenIds;
    if (ids.length === 0) throw new RangeError("Cannot generate: the prompt is empty");
    if (ids.length >= this.model.maxModelLen) {
      throw new RangeError(
        `Cannot generate: prompt of ${ids.length} tokens exceeds max_model_len ${this.model.maxModelLen}`,
      );
    }
    if (ids.some((id) => !Number.isInteger(id) || id < 0 || id >= this.model.vocabSize)) {
      throw new RangeError("Cannot generate: prompt token id out of the vocabulary");
    }
    if (this.#active.has(request.requestId)) {
      throw new RangeError(`Cannot generate: duplicate request id ${request.requestId}`);
    }
    if (this.#active.size >= this.maxActive) {
      throw new EngineOverloadedError(`${this.#active.size} requests already active`);
    }
    const controller = new AbortController();
    const onSignal = () => controller.abort();
    signal?.addEventListener("abort", onSignal, { once: true });
    if (signal?.aborted) controller.abort();
    const entry = { abort: () => controller.abort(), tokens: ids.length };
    this.#active.set(request.requestId, entry);
    this.#promptTokens += ids.length;
    let released = false;
    const release = (aborted: boolean) => {
      if (released) return;
      released = true;
      signal?.removeEventListener("abort", onSignal);
      this.#active.delete(request.requestId);
      if (aborted) this.aborted.push(request.requestId);
      if (this.#active.size === 0) {
        for (const f of this.#idle) f();
        this.#idle.clear();
      }
    };
    const inner = this.#run(request, controller.signal, entry);
    let finished = false;
    const iterator: AsyncIterator<RequestOutput> = {
      next: async () => {
        if (released) return { done: true, value: undefined };
        try {
          const r = await inner.next();
          if (r.done) {
            release(!finished);
          } else if (r.value.finishReason !== null) {
            finished = r.value.finishReason !== "abort";
            release(!finished);
          }
          return r;
        } catch (e) {
          release(true);
          throw e;
        }
      },
      return: async () => {
        controller.abort();
        release(!finished);
        await inner.return(undefined);
        return { done: true, value: undefined };
      },
    };
    return { [Symbol.asyncIterator]: () => iterator };
  }

  #sleep(ms: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const t = setTimeout(() => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      }, ms);
      const onAbort = () => {
        clearTimeout(t);
        resolve();
      };
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  #decode(ids: readonly number[]): string {
    if (this.tokenizer === null) return ids.map((id) => `<${id}>`).join("");
    return this.tokenizer.decode(ids, {
      skipSpecialTokens: true,
      cleanUpTokenizationSpaces: false,
    });
  }

  #token(request: GenerateRequest, seed: number, k: number): number {
    const p = request.params;
    const prompt = request.promptTokenIds;
    if (p.temperature === 0 && this.#reply !== null) return this.#reply[k % this.#reply.length]!;
    if (p.temperature === 0) return prompt[k % prompt.length]!;
    let h = mix(seed, k);
    for (const id of prompt) h = mix(h, id);
    return this.#ordinary[h % this.#ordinary.length]!;
  }

  #logprob(id: number, k: number): number {
    return -((mix(id, k) % 1000) + 1) / 1000;
  }

  async *#run(
    request: GenerateRequest,
    signal: AbortSignal,
    entry: { tokens: number },
  ): AsyncGenerator<RequestOutput, void, undefined> {
    const p = request.params;
    const numPrompt = request.promptTokenIds.length;
    const maxTokens = p.maxTokens ?? this.model.maxModelLen - numPrompt;
    const seed = p.seed ?? Math.floor(Math.random() * 2 ** 32);
    const eos = this.tokenizer?.eosTokenId;
    const out: number[] = [];
    let sent = 0;
    const base = {
      requestId: request.requestId,
      numPromptTokens: numPrompt,
      numCachedTokens: 0,
    };
    // Prompt logprobs ride on the first increment only.
    let prompt = p.promptLogprobs === null ? {} : {
      promptLogprobs: fakePromptLogprobs(
        request.promptTokenIds,
        p.promptLogprobs,
        this.model.vocabSize,
      ),
    };
    for (let k = 0; k < maxTokens; k++) {
      await this.#sleep(this.stepMs, signal);
      if (signal.aborted) {
        yield {
          ...base,
          ...prompt,
          tokenIds: [],
          text: "",
          logprobs: p.logprobs === null ? null : [],
          finishReason: "abort",
          stopReason: null,
          numOutputTokens: out.length,
        };
        return;
      }
      this.#steps++;
      const id = this.#token(request, seed, k);
      out.push(id);
      entry.tokens++;
      this.#generationTokens++;
      let finish: "stop" | "length" | null = null;
      let stopReason: number | string | null = null;
      const canStop = out.length >= p.minTokens;
      if (canStop && !p.ignoreEos && id === eos) {
        finish = "stop";
      } else if (canStop && p.stopTokenIds.includes(id)) {
        finish = "stop";
        stopReason = id;
      }
      let text = this.#decode(out);
      // Stop strings: the earliest match ends the text.
      let cut = -1;
      for (const s of p.stop) {
        const at = text.indexOf(s);
        if (at >= 0 && (cut < 0 || at < cut)) {
          cut = at;
          stopReason = s;
        }
      }
      if (cut >= 0) {
        text = text.slice(0, cut);
        finish = "stop";
      }
      if (finish === null && out.length >= maxTokens) finish = "length";
      let visible = text.length;
      if (finish === null) {
        // Hold back a possible stop-string start and an unfinished character.
        for (const s of p.stop) {
          for (let n = Math.min(s.length - 1, text.length); n > 0; n--) {
            if (text.endsWith(s.slice(0, n))) {
              visible = Math.min(visible, text.length - n);
              break;
            }
          }
        }
        while (visible > 0 && text[visible - 1] === REPLACEMENT) visible--;
      }
      const delta = visible > sent ? text.slice(sent, visible) : "";
      sent = Math.max(sent, visible);
      let logprobs: TokenLogprob[] | null = null;
      if (p.logprobs !== null) {
        const top = [];
        for (let j = 0; j < p.logprobs; j++) {
          const alt = j === 0 ? id : this.#ordinary[(id + j * 13) % this.#ordinary.length]!;
          top.push({ tokenId: alt, logprob: this.#logprob(alt, k) - j });
        }
        logprobs = [{ tokenId: id, logprob: this.#logprob(id, k), top }];
      }
      yield {
        ...base,
        ...prompt,
        tokenIds: [id],
        text: delta,
        logprobs,
        finishReason: finish,
        stopReason: finish === null ? null : stopReason,
        numOutputTokens: out.length,
      };
      prompt = {};
      if (finish !== null) return;
    }
  }

  abort(requestId: string): void {
    this.#active.get(requestId)?.abort();
  }

  stats(): EngineStats {
    let blocks = 0;
    for (const r of this.#active.values()) blocks += Math.ceil(r.tokens / 16);
    const total = 1024;
    return {
      numRunning: this.#active.size,
      numWaiting: this.numWaiting,
      kvCacheUsage: blocks / total,
      kvBlocksUsed: blocks,
      kvBlocksTotal: total,
      promptTokensTotal: this.#promptTokens,
      generationTokensTotal: this.#generationTokens,
      prefixCacheQueries: this.#promptTokens,
      prefixCacheHits: 0,
      numPreemptions: 0,
      steps: this.#steps,
    };
  }

  async shutdown(graceMs = 0): Promise<void> {
    this.#closed = true;
    if (this.#active.size > 0) {
      await Promise.race([
        this.whenIdle(),
        new Promise<void>((resolve) => {
          const t = setTimeout(resolve, graceMs);
          void this.whenIdle().then(() => clearTimeout(t));
        }),
      ]);
    }
    for (const r of this.#active.values()) r.abort();
    await this.whenIdle();
  }
}

let tokenizerPromise: Promise<Tokenizer> | null = null;

/** The tokenizer of a generated tiny-qwen3 checkpoint (ChatML template, EOS `<|im_end|>`). */
export function tinyTokenizer(): Promise<Tokenizer> {
  tokenizerPromise ??= (async () => {
    const dir = await Deno.makeTempDir({ prefix: "server_tok_" });
    try {
      await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f16" });
      return await Tokenizer.fromDir(dir);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  })();
  return tokenizerPromise;
}

/**
 * Runs `fn` against a server on 127.0.0.1 (a free port) serving `engine`, then shuts the server
 * down (grace 0).
 */
export async function withServer(
  engine: EngineClient,
  options: StartServerOptions,
  fn: (url: string, server: RunningServer) => Promise<void>,
): Promise<void> {
  const server = startServer(engine, {
    port: 0,
    onError: () => {},
    onWarning: () => {},
    ...options,
  });
  try {
    await fn(server.url, server);
  } finally {
    await server.shutdown(0);
  }
}
