/**
 * Chat templates: the Jinja template a model ships in `tokenizer_config.json` (`chat_template`),
 * rendered with `@huggingface/jinja` the way `transformers`' `apply_chat_template` does.
 *
 * @module
 */

import { Template } from "@huggingface/jinja";

/** One chat message. Extra fields (e.g. `name`) are passed to the template unchanged. */
export interface ChatMessage {
  /** `system`, `user`, `assistant`, ... */
  role: string;
  /** Message text. */
  content: string;
  [extra: string]: unknown;
}

/** Options of {@linkcode ChatTemplate.render}. */
export interface ChatTemplateOptions {
  /** Append the prompt that starts the assistant's turn (e.g. `<|im_start|>assistant\n`). */
  addGenerationPrompt?: boolean;
  /** Further template variables (e.g. `enable_thinking`, `tools`). */
  extra?: Record<string, unknown>;
  /**
   * Leave the final message open, cut after its content (no end-of-turn after it), so the model
   * continues it: a "prefilled" answer (transformers' and vLLM's `continue_final_message`).
   */
  continueFinalMessage?: boolean;
}

/** Thrown when a model has no chat template or its template fails to parse or render. */
export class ChatTemplateError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ChatTemplateError";
  }
}

/** A parsed chat template plus the special-token strings templates refer to. */
export class ChatTemplate {
  readonly source: string;
  readonly #template: Template;
  readonly #specials: Record<string, string>;

  /**
   * Parses `source`.
   *
   * @param specials `bos_token`, `eos_token`, ... strings made available to the template.
   * @throws {ChatTemplateError} when the template does not parse.
   */
  constructor(source: string, specials: Record<string, string> = {}) {
    this.source = source;
    this.#specials = { ...specials };
    try {
      this.#template = new Template(source);
    } catch (e) {
      throw new ChatTemplateError(
        `Cannot parse the chat template: ${e instanceof Error ? e.message : e}`,
        { cause: e },
      );
    }
  }

  /**
   * Renders `messages` to the prompt string (not tokenized: encode it WITHOUT adding special
   * tokens, as templates already contain them).
   *
   * @throws {ChatTemplateError} when rendering fails (e.g. the template's `raise_exception`).
   */
  render(messages: readonly ChatMessage[], options: ChatTemplateOptions = {}): string {
    let rendered: string;
    try {
      rendered = this.#template.render({
        ...this.#specials,
        ...options.extra,
        messages: messages.map((m) => ({ ...m })),
        add_generation_prompt: options.addGenerationPrompt ?? false,
      });
    } catch (e) {
      throw new ChatTemplateError(
        `Cannot render the chat template: ${e instanceof Error ? e.message : e}`,
        { cause: e },
      );
    }
    return options.continueFinalMessage ? openFinalMessage(rendered, messages) : rendered;
  }
}

/**
 * `rendered` cut right after the final message's content, transformers' rule for
 * `continue_final_message`: the last occurrence of the content (trimmed) in the rendered chat;
 * trailing whitespace of the content is kept where the template kept it.
 *
 * @throws {ChatTemplateError} when the final message has no text, or the template changed it so
 *   that it does not appear in the rendered chat.
 */
function openFinalMessage(rendered: string, messages: readonly ChatMessage[]): string {
  const content = messages.at(-1)?.content ?? "";
  const text = typeof content === "string" ? content : "";
  if (text.trim() === "") {
    throw new ChatTemplateError("continue_final_message needs a final message with text");
  }
  const at = rendered.lastIndexOf(text.trim());
  if (at < 0) {
    throw new ChatTemplateError(
      "continue_final_message is set but the final message does not appear in the chat after " +
        "applying the chat template (the template changes it)",
    );
  }
  const kept = text.trimStart();
  return rendered.slice(at, at + kept.length) === text
    ? rendered.slice(0, at + kept.length)
    : rendered.slice(0, at + text.trim().length);
}
