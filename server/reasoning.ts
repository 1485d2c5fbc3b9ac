/**
 * Reasoning output (`--reasoning-parser qwen3`, as vLLM's): a chat answer that opens with
 * `<think>` has its reasoning, up to `</think>`, returned as `reasoning_content` and the rest as
 * `content`, in the message and in stream deltas. Without the opening tag the whole answer is
 * content; with it but no closing tag (thinking cut short by `max_tokens`) the whole answer is
 * reasoning. One newline after each tag is dropped, and the blank line Qwen3 writes between
 * `</think>` and the answer.
 *
 * @module
 */

/** The reasoning parsers `--reasoning-parser` accepts. */
export const REASONING_PARSERS = ["qwen3"] as const;

/** A reasoning parser's name. */
export type ReasoningParserName = (typeof REASONING_PARSERS)[number];

const OPEN = "<think>";
const CLOSE = "</think>";

/** An answer split into reasoning and content (null: none). */
export interface ReasoningSplit {
  readonly reasoning: string | null;
  readonly content: string | null;
}

/** Splits a whole answer (non-streaming responses). */
export function splitReasoning(text: string): ReasoningSplit {
  const stream = new ReasoningStream();
  const a = stream.push(text);
  const b = stream.finish();
  const reasoning = a.reasoning + b.reasoning;
  const content = a.content + b.content;
  return {
    reasoning: stream.sawReasoning ? reasoning : null,
    content: content === "" && stream.sawReasoning ? null : content,
  };
}

/** The longest suffix of `text` that is a proper prefix of `tag` (held back: it may grow). */
function partialTag(text: string, tag: string): number {
  for (let n = Math.min(tag.length - 1, text.length); n > 0; n--) {
    if (text.endsWith(tag.slice(0, n))) return n;
  }
  return 0;
}

/** Splits an answer arriving in pieces (stream deltas); see the module documentation. */
export class ReasoningStream {
  #state: "start" | "opened" | "thinking" | "after" | "content" = "start";
  #held = "";
  /** Whether the answer opened with `<think>`. */
  sawReasoning = false;

  /** The reasoning and content that `text` (the next piece) makes certain. */
  push(text: string): { reasoning: string; content: string } {
    let reasoning = "";
    let content = "";
    let rest = this.#held + text;
    this.#held = "";
    while (rest !== "") {
      if (this.#state === "start") {
        const trimmed = rest.replace(/^\s+/, "");
        if (trimmed.startsWith(OPEN)) {
          this.#state = "opened";
          this.sawReasoning = true;
          rest = trimmed.slice(OPEN.length);
        } else if (OPEN.startsWith(trimmed)) {
          this.#held = rest;
          return { reasoning, content };
        } else {
          this.#state = "content";
        }
      } else if (this.#state === "opened") {
        // The newline after the opening tag, whenever it arrives.
        rest = rest.replace(/^\n/, "");
        this.#state = "thinking";
      } else if (this.#state === "thinking") {
        const at = rest.indexOf(CLOSE);
        if (at >= 0) {
          reasoning += rest.slice(0, at).replace(/\n$/, "");
          this.#state = "after";
          rest = rest.slice(at + CLOSE.length);
        } else {
          // A possible start of the closing tag is held back, and the newline before it (it
          // would be dropped).
          let keep = partialTag(rest, CLOSE);
          if (rest[rest.length - keep - 1] === "\n") keep++;
          reasoning += rest.slice(0, rest.length - keep);
          this.#held = rest.slice(rest.length - keep);
          return { reasoning, content };
        }
      } else if (this.#state === "after") {
        const trimmed = rest.replace(/^\n{1,2}/, "");
        if (trimmed === "" && rest.length < 2) {
          this.#held = rest;
          return { reasoning, content };
        }
        this.#state = "content";
        rest = trimmed;
      } else {
        content += rest;
        rest = "";
      }
    }
    return { reasoning, content };
  }

  /** What is still held back, once the answer is complete. */
  finish(): { reasoning: string; content: string } {
    const held = this.#held;
    this.#held = "";
    if (this.#state === "thinking") return { reasoning: held, content: "" };
    if (this.#state === "after") return { reasoning: "", content: held.replace(/^\n{1,2}/, "") };
    return { reasoning: "", content: held };
  }
}
