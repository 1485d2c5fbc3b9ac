/**
 * The engine's per-token log-probabilities in OpenAI's two response shapes: the legacy
 * completions shape (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) and the chat
 * shape (`content: [{token, logprob, bytes, top_logprobs}]`).
 *
 * @module
 */

import type { EngineClient, TokenLogprob } from "../engine/engine_api.ts";

const encoder = new TextEncoder();

/** `logprobs` of a `/v1/completions` choice. */
export interface CompletionLogprobs {
  /** Text of each token. */
  tokens: string[];
  /** Log-probability of each sampled token. */
  token_logprobs: number[];
  /** Per token: the top alternatives' texts -> log-probabilities (the sampled token included). */
  top_logprobs: Record<string, number>[];
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

/** Token text for logprobs (a lone piece of a multi-byte character decodes to U+FFFD). */
export function tokenText(engine: EngineClient, id: number): string {
  return engine.tokenizer === null ? `token_id:${id}` : engine.tokenizer.decode([id]);
}

/**
 * The completions-shaped logprobs of `lps`, whose text starts at character `offset` of the
 * choice's text (streamed chunks continue the offsets of earlier ones).
 */
export function completionLogprobs(
  engine: EngineClient,
  lps: readonly TokenLogprob[],
  offset: number,
): CompletionLogprobs {
  const tokens: string[] = [];
  const tokenLogprobs: number[] = [];
  const top: Record<string, number>[] = [];
  const textOffset: number[] = [];
  let pos = offset;
  for (const lp of lps) {
    const t = tokenText(engine, lp.tokenId);
    tokens.push(t);
    tokenLogprobs.push(lp.logprob);
    const entry: Record<string, number> = {};
    for (const alt of lp.top ?? []) entry[tokenText(engine, alt.tokenId)] = alt.logprob;
    entry[t] = lp.logprob;
    top.push(entry);
    textOffset.push(pos);
    pos += t.length;
  }
  return { tokens, token_logprobs: tokenLogprobs, top_logprobs: top, text_offset: textOffset };
}

/** The chat-shaped logprobs of `lps`. */
export function chatLogprobs(engine: EngineClient, lps: readonly TokenLogprob[]): ChatLogprobs {
  const item = (id: number, logprob: number): ChatTokenLogprob => {
    const token = tokenText(engine, id);
    return { token, logprob, bytes: [...encoder.encode(token)] };
  };
  return {
    content: lps.map((lp) => ({
      ...item(lp.tokenId, lp.logprob),
      top_logprobs: (lp.top ?? []).map((alt) => item(alt.tokenId, alt.logprob)),
    })),
  };
}
