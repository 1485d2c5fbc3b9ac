/**
 * Reading a request body as JSON with a size limit enforced while reading (413), so an
 * oversized body is never buffered whole, and a time limit (408), so a client that sends its
 * body slowly cannot hold a connection for as long as it likes.
 *
 * @module
 */

import { ApiError } from "./protocol.ts";

/**
 * Reads the body as JSON, refusing more than `max` bytes while reading (413) and a body that has
 * not fully arrived `timeoutMs` after the call (408, `request_timeout`; 0 = no limit). A missing
 * body, invalid UTF-8 or malformed JSON is a 400 with code `invalid_json`.
 */
export async function readJson(req: Request, max: number, timeoutMs = 0): Promise<unknown> {
  const tooLarge = () =>
    new ApiError(413, `Request body exceeds the limit of ${max} bytes`, {
      code: "request_too_large",
    });
  const declared = req.headers.get("content-length");
  if (declared !== null && Number(declared) > max) {
    await req.body?.cancel().catch(() => {});
    throw tooLarge();
  }
  if (req.body === null) throw new ApiError(400, "Missing request body", { code: "invalid_json" });
  const reader = req.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = timeoutMs > 0
    ? new Promise<"late">((resolve) => (timer = setTimeout(() => resolve("late"), timeoutMs)))
    : null;
  try {
    for (;;) {
      const next = late === null ? await reader.read() : await Promise.race([reader.read(), late]);
      if (next === "late") {
        await reader.cancel().catch(() => {});
        throw new ApiError(
          408,
          `The request body did not arrive within ${timeoutMs / 1000} s`,
          { code: "request_timeout" },
        );
      }
      if (next.done) break;
      total += next.value.byteLength;
      if (total > max) {
        await reader.cancel().catch(() => {});
        throw tooLarge();
      }
      chunks.push(next.value);
    }
  } finally {
    clearTimeout(timer);
  }
  const bytes = new Uint8Array(total);
  let off = 0;
  for (const c of chunks) {
    bytes.set(c, off);
    off += c.byteLength;
  }
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new ApiError(400, "Request body is not valid UTF-8", { code: "invalid_json" });
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ApiError(400, `Malformed JSON body: ${e instanceof Error ? e.message : String(e)}`, {
      code: "invalid_json",
    });
  }
}
