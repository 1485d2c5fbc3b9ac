/**
 * Small HTTP helpers of the server tests: a JSON POST, the JSON body of a 200 answer, the chunks
 * of an SSE answer, choices in index order, and the wire shape of a completion choice.
 *
 * @module
 */

import assert from "node:assert/strict";

/** POSTs `body` to `url + path` as JSON (a string is sent as it is, e.g. malformed JSON). */
export function post(url: string, path: string, body: unknown): Promise<Response> {
  return fetch(`${url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

/** The JSON body of a 200 answer (fails the test otherwise). */
export async function ok<T = Record<string, unknown>>(res: Response): Promise<T> {
  const text = await res.text();
  assert.equal(res.status, 200, text);
  return JSON.parse(text);
}

/** The chunks of an SSE answer, `[DONE]` checked and left out (fails the test unless 200). */
export async function chunks<T = Record<string, unknown>>(res: Response): Promise<T[]> {
  const text = await res.text();
  assert.equal(res.status, 200, text);
  const events = text.split("\n\n").filter((e) => e !== "").map((e) => e.replace(/^data: /, ""));
  assert.equal(events.pop(), "[DONE]");
  return events.map((e) => JSON.parse(e));
}

/** Sorted by `index`. */
export function byIndex<T extends { index: number }>(choices: T[]): T[] {
  return [...choices].sort((a, b) => a.index - b.index);
}

/** One entry of vLLM's `prompt_logprobs`: per token id (a string), its logprob, rank and text. */
export type PromptLogprobDict = Record<
  string,
  { logprob: number; rank: number; decoded_token: string }
>;

/** A completion choice's `logprobs` (OpenAI's legacy completions shape). */
export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: (number | null)[];
  top_logprobs: (Record<string, number> | null)[];
  text_offset: number[];
}

/** A completion choice as the server writes it, vLLM's optional fields included. */
export interface CompletionChoice {
  index: number;
  text: string;
  logprobs: CompletionLogprobs | null;
  finish_reason: string | null;
  token_ids?: number[];
  prompt_token_ids?: number[];
  prompt_logprobs?: (PromptLogprobDict | null)[];
}
