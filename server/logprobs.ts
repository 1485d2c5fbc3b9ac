/**
 * The engine's per-token log-probabilities in OpenAI's two response shapes: the legacy
 * completions shape (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) and the chat
 * shape (`content: [{token, logprob, bytes, top_logprobs}]`); and the prompt tokens'
 * log-probabilities in vLLM's `prompt_logprobs` shape, or echoed in the completions shape.
 *
 * With vLLM's `return_tokens_as_token_ids` (`asIds`), every token string of the two OpenAI
 * shapes is `token_id:<id>` ({@linkcode tokenIdString}), as vLLM writes it: the completions
 * `tokens` and `top_logprobs` keys, the chat `token`s. What vLLM keeps, this module keeps too: a
 * chat token's `bytes` are its decoded text's (its alternatives' are their `token_id:<id>`
 * strings'), and `prompt_logprobs` entries keep their `decoded_token` text (their keys are the
 * ids already). Unlike vLLM, whose `text_offset` then adds up the lengths of the `token_id:<id>`
 * strings, `text_offset` keeps counting the tokens' decoded texts, so it stays an offset into the
 * choice's `text` whichever way the tokens are written.
 *
 * @module
 */

import type { EngineClient, PromptLogprob, TokenLogprob } from "../engine/engine_api.ts";
import type { ChoiceRun } from "./choice_run.ts";
import type { Prepared } from "./prepare.ts";

const encoder = new TextEncoder();

/** `logprobs` of a `/v1/completions` choice. */
export interface CompletionLogprobs {
  /** Text of each token. */
  tokens: string[];
  /** Log-probability of each sampled token (echoed prompt: null for its first token). */
  token_logprobs: (number | null)[];
  /**
   * Per token: the top alternatives' texts -> log-probabilities (the token itself included);
   * null for an echoed prompt's first token.
   */
  top_logprobs: (Record<string, number> | null)[];
  /** Per token: its character offset in the choice's text. */
  text_offset: number[];
}

/** One token of a chat choice's `logprobs.content`. */
export interface ChatTokenLogprob {
  token: string;
  logprob: number;
  /** UTF-8 bytes of `token`. */
  bytes: number[];
}

/** `logprobs` of a `/v1/chat/completions` choice. */
export interface ChatLogprobs {
  content: (ChatTokenLogprob & { top_logprobs: ChatTokenLogprob[] })[];
}

/** vLLM's `return_tokens_as_token_ids` spelling of token `id`: `token_id:<id>`. */
export function tokenIdString(id: number): string {
  return `token_id:${id}`;
}

/**
 * Token text for logprobs (a lone piece of a multi-byte character decodes to U+FFFD; without a
 * tokenizer, `token_id:<id>`).
 */
export function tokenText(engine: EngineClient, id: number): string {
  return engine.tokenizer === null ? tokenIdString(id) : engine.tokenizer.decode([id]);
}

/** How token `id` is written in logprobs: its text, or `token_id:<id>` with `asIds`. */
function tokenLabel(engine: EngineClient, id: number, asIds: boolean): string {
  return asIds ? tokenIdString(id) : tokenText(engine, id);
}

/**
 * The completions-shaped logprobs of `lps`, whose text starts at character `offset` of the
 * choice's text (streamed chunks continue the offsets of earlier ones); with `asIds`, the tokens
 * are written `token_id:<id>` (the offsets still count their texts).
 */
export function completionLogprobs(
  engine: EngineClient,
  lps: readonly TokenLogprob[],
  offset: number,
  asIds = false,
): CompletionLogprobs {
  const tokens: string[] = [];
  const tokenLogprobs: number[] = [];
  const top: Record<string, number>[] = [];
  const textOffset: number[] = [];
  let pos = offset;
  for (const lp of lps) {
    const text = tokenText(engine, lp.tokenId);
    const t = asIds ? tokenIdString(lp.tokenId) : text;
    tokens.push(t);
    tokenLogprobs.push(lp.logprob);
    const entry: Record<string, number> = {};
    for (const alt of lp.top ?? []) entry[tokenLabel(engine, alt.tokenId, asIds)] = alt.logprob;
    entry[t] = lp.logprob;
    top.push(entry);
    textOffset.push(pos);
    pos += text.length;
  }
  return { tokens, token_logprobs: tokenLogprobs, top_logprobs: top, text_offset: textOffset };
}

/**
 * The chat-shaped logprobs of `lps`; with `asIds`, the tokens are written `token_id:<id>`, and,
 * as vLLM answers, each sampled token's `bytes` are still its text's while its alternatives'
 * are their `token_id:<id>` strings'.
 */
export function chatLogprobs(
  engine: EngineClient,
  lps: readonly TokenLogprob[],
  asIds = false,
): ChatLogprobs {
  const alternative = (id: number, logprob: number): ChatTokenLogprob => {
    const token = tokenLabel(engine, id, asIds);
    return { token, logprob, bytes: [...encoder.encode(token)] };
  };
  return {
    content: lps.map((lp) => {
      const text = tokenText(engine, lp.tokenId);
      return {
        token: asIds ? tokenIdString(lp.tokenId) : text,
        logprob: lp.logprob,
        bytes: [...encoder.encode(text)],
        top_logprobs: (lp.top ?? []).map((alt) => alternative(alt.tokenId, alt.logprob)),
      };
    }),
  };
}

/** One entry of a prompt token's `prompt_logprobs` dict (vLLM's `Logprob`). */
export interface PromptLogprobEntry {
  logprob: number;
  /** 1-based rank among the vocabulary at that position. */
  rank: number;
  decoded_token: string;
}

/** A prompt token's entry in vLLM's `prompt_logprobs`: token id (a string) -> entry. */
export type PromptLogprobsDict = Record<string, PromptLogprobEntry>;

/** A log-probability for JSON: -Infinity is -9999, as vLLM writes it (JSON has no infinity). */
function finite(logprob: number): number {
  return Math.max(logprob, -9999);
}

/**
 * vLLM's `prompt_logprobs` of a prompt: null for the first token (and any the engine did not
 * score), then per token a dict of its `count` most likely tokens (ranks 1..count, best first)
 * and the prompt token itself when it is not among them (with the engine's rank).
 */
export function promptLogprobsField(
  engine: EngineClient,
  lps: readonly (PromptLogprob | null)[],
  count: number,
): (PromptLogprobsDict | null)[] {
  const entry = (id: number, logprob: number, rank: number): PromptLogprobEntry => ({
    logprob: finite(logprob),
    rank,
    decoded_token: tokenText(engine, id),
  });
  return lps.map((lp) => {
    if (lp === null) return null;
    const dict: PromptLogprobsDict = {};
    lp.top.slice(0, count).forEach((alt, i) => {
      dict[String(alt.tokenId)] = entry(alt.tokenId, alt.logprob, i + 1);
    });
    const key = String(lp.tokenId);
    if (!Object.hasOwn(dict, key)) dict[key] = entry(lp.tokenId, lp.logprob, lp.rank);
    return dict;
  });
}

/**
 * The completions-shaped logprobs of an echoed prompt `ids` (`echo` with `logprobs` `count`):
 * its first token (and any the engine did not score) has null `token_logprobs` and
 * `top_logprobs`, every other token its log-probability and a dict of its `count` most likely
 * tokens' texts plus its own, like a generated token's; `text_offset` counts the tokens' texts
 * from 0 (with `asIds` too, where the tokens are written `token_id:<id>`).
 */
export function echoedLogprobs(
  engine: EngineClient,
  ids: readonly number[],
  lps: readonly (PromptLogprob | null)[],
  count: number,
  asIds = false,
): CompletionLogprobs {
  const out: CompletionLogprobs = {
    tokens: [],
    token_logprobs: [],
    top_logprobs: [],
    text_offset: [],
  };
  let pos = 0;
  ids.forEach((id, i) => {
    const text = tokenText(engine, id);
    const t = asIds ? tokenIdString(id) : text;
    const lp = lps[i] ?? null;
    out.tokens.push(t);
    out.text_offset.push(pos);
    pos += text.length;
    if (lp === null) {
      out.token_logprobs.push(null);
      out.top_logprobs.push(null);
      return;
    }
    const entry: Record<string, number> = {};
    for (const alt of lp.top.slice(0, count)) {
      entry[tokenLabel(engine, alt.tokenId, asIds)] = finite(alt.logprob);
    }
    entry[t] = finite(lp.logprob);
    out.token_logprobs.push(finite(lp.logprob));
    out.top_logprobs.push(entry);
  });
  return out;
}

/** `a`'s tokens followed by `b`'s (each keeps its own `text_offset`s). */
export function joinLogprobs(a: CompletionLogprobs, b: CompletionLogprobs): CompletionLogprobs {
  return {
    tokens: [...a.tokens, ...b.tokens],
    token_logprobs: [...a.token_logprobs, ...b.token_logprobs],
    top_logprobs: [...a.top_logprobs, ...b.top_logprobs],
    text_offset: [...a.text_offset, ...b.text_offset],
  };
}

/**
 * The `logprobs` of completion choice `r` for its generated tokens `lps`, the first of which
 * starts at character `offset` of the choice's text (after its `echo` text); with `withPrompt`
 * (the whole choice, or its first streamed chunk) and `echo` with `logprobs`, the echoed
 * prompt's tokens come first.
 */
export function completionChoiceLogprobs(
  engine: EngineClient,
  prep: Prepared,
  r: ChoiceRun,
  lps: readonly TokenLogprob[],
  offset: number,
  withPrompt: boolean,
): CompletionLogprobs {
  const generated = completionLogprobs(engine, lps, offset, prep.tokensAsIds);
  if (!withPrompt || prep.echoLogprobs === null) return generated;
  const ids = prep.prompts[Math.floor(r.index / prep.n)]!;
  const prompt = echoedLogprobs(
    engine,
    ids,
    r.promptLogprobs ?? [],
    prep.echoLogprobs,
    prep.tokensAsIds,
  );
  return joinLogprobs(prompt, generated);
}

/** The `prompt_logprobs` field of choice `r` (`{}` when the request did not ask for it). */
export function promptLogprobsOf(
  engine: EngineClient,
  prep: Prepared,
  r: ChoiceRun | undefined,
): { prompt_logprobs?: (PromptLogprobsDict | null)[] } {
  if (prep.promptLogprobs === null || r === undefined) return {};
  return {
    prompt_logprobs: promptLogprobsField(engine, r.promptLogprobs ?? [], prep.promptLogprobs),
  };
}
