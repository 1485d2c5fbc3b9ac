/**
 * Small HTTP helpers of the server tests: a JSON POST, the JSON body of a 200 answer, the chunks
 * of an SSE answer, and choices in index order.
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
