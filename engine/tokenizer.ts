/**
 * Text <-> token ids for a Hugging Face model directory: `tokenizer.json` is run by
 * `@huggingface/tokenizers`, `tokenizer_config.json` supplies the special tokens, `add_bos_token`
 * and the chat template (rendered by {@linkcode ChatTemplate}).
 *
 * Vocabularies may be padded: a model's `vocab_size` (rows of its embedding and LM head) can
 * exceed the tokenizer's size. Ids beyond the tokenizer's vocabulary decode to nothing.
 *
 * @module
 */

import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import {
  type ChatMessage,
  ChatTemplate,
  ChatTemplateError,
  type ChatTemplateOptions,
} from "./chat_template.ts";

export type { ChatMessage, ChatTemplateOptions };

/** Thrown when a tokenizer's files are missing or malformed. */
export class TokenizerError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "TokenizerError";
  }
}

/** Options of {@linkcode Tokenizer.encode}. */
export interface EncodeOptions {
  /**
   * Add the model's special tokens (its post-processor's template, plus BOS when
   * `add_bos_token` is set and the post-processor did not add it). Default true. Pass false for
   * prompts rendered by a chat template, which already contain them.
   */
  addSpecialTokens?: boolean;
}

/** Options of {@linkcode Tokenizer.decode}. */
export interface DecodeOptions {
  /** Leave special tokens (BOS, EOS, `<|im_end|>`, ...) out of the text. Default false. */
  skipSpecialTokens?: boolean;
  /**
   * Apply `clean_up_tokenization_spaces` (" ." -> ".", " 's" -> "'s", ...). Default: the value in
   * tokenizer_config.json; false when absent, as in `transformers` since 4.45 (checked against
   * 4.57 and 5.18 in `tests/hf_checkpoint_test.ts`).
   */
  cleanUpTokenizationSpaces?: boolean;
}

type Json = Record<string, unknown>;

function isRecord(x: unknown): x is Json {
  return typeof x === "object" && x !== null && !Array.isArray(x);
}

/** See {@linkcode Tokenizer.grammarVocab}. */
export interface GrammarVocab {
  /** Token strings by id, as stored in tokenizer.json ("" for undefined ids). */
  readonly encoded: readonly string[];
  /** `byte_level` (GPT-2's byte-to-unicode map), `byte_fallback` (`<0x0A>` tokens) or `raw`. */
  readonly vocabType: "byte_level" | "byte_fallback" | "raw";
  /** Whether encoding prepends a space to the text (SentencePiece "▁" prefix). */
  readonly prependSpace: boolean;
}

/** The grammar vocabulary of a tokenizer.json (xgrammar's `from_huggingface` detection rules). */
function grammarVocabOf(
  json: Json,
  added: Map<number, { content: string }>,
  size: number,
): GrammarVocab {
  const encoded = new Array<string>(size).fill("");
  const model = json.model;
  if (isRecord(model) && isRecord(model.vocab)) {
    for (const [token, id] of Object.entries(model.vocab)) {
      if (typeof id === "number" && id < size) encoded[id] = token;
    }
  }
  for (const [id, token] of added) if (id < size) encoded[id] = token.content;
  const text = JSON.stringify([json.decoder ?? null, json.pre_tokenizer ?? null]);
  const vocabType = /"ByteLevel"/.test(text)
    ? "byte_level"
    : /"ByteFallback"/.test(text) || (isRecord(model) && model.byte_fallback === true)
    ? "byte_fallback"
    : "raw";
  const normalizer = JSON.stringify(json.normalizer ?? null);
  const prependSpace = /"Prepend","prepend":"▁"/.test(normalizer) ||
    /"Metaspace"[^}]*"prepend_scheme":"(first|always)"/.test(
      JSON.stringify(json.pre_tokenizer ?? null),
    );
  return { encoded, vocabType, prependSpace };
}

/** A special token in tokenizer_config.json: a string, `{ content }`, or null. */
function tokenContent(x: unknown): string | undefined {
  if (typeof x === "string") return x;
  if (isRecord(x) && typeof x.content === "string") return x.content;
  return undefined;
}

async function readJson(path: string): Promise<unknown> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    throw new TokenizerError(`${path}: cannot read (${e instanceof Error ? e.message : e})`, {
      cause: e,
    });
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new TokenizerError(`${path}: invalid JSON (${e instanceof Error ? e.message : e})`, {
      cause: e,
    });
  }
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

/** The template named "default" (or the only one) from a string or `[{name, template}]` list. */
function pickTemplate(x: unknown): string | undefined {
  if (typeof x === "string") return x;
  if (!Array.isArray(x)) return undefined;
  const entries = x.filter(isRecord);
  const chosen = entries.find((e) => e.name === "default") ?? entries[0];
  return chosen !== undefined && typeof chosen.template === "string" ? chosen.template : undefined;
}

/** A model's tokenizer: encoding, decoding and chat templates. */
export class Tokenizer {
  /** Number of ids the tokenizer knows (max id + 1); ids at or beyond it decode to nothing. */
  readonly size: number;
  /** BOS token text and id, when the model has one. */
  readonly bosToken?: string;
  readonly bosTokenId?: number;
  /** EOS token text and id (from tokenizer_config.json), when the model has one. */
  readonly eosToken?: string;
  readonly eosTokenId?: number;
  /** Whether encoding with special tokens starts with BOS (`add_bos_token`). */
  readonly addBosToken: boolean;
  /** Whether encoding with special tokens ends with EOS (`add_eos_token`). */
  readonly addEosToken: boolean;
  /** The chat template source, if the model has one. */
  readonly chatTemplateSource?: string;
  /** Ids of all special added tokens. */
  readonly specialIds: ReadonlySet<number>;
  /**
   * What a grammar engine (xgrammar) needs of the vocabulary: every token's string as
   * tokenizer.json stores it ("" for ids it does not define), how those strings encode bytes,
   * and whether encoding prepends a space (SentencePiece's "▁").
   */
  readonly grammarVocab: GrammarVocab;

  readonly #hf: HfTokenizer;
  readonly #cleanUp: boolean;
  readonly #template?: ChatTemplate;
  readonly #specialStrings: Record<string, string>;
  readonly #name: string;

  private constructor(tokenizerJson: Json, config: Json, name: string, template?: string) {
    this.#name = name;
    try {
      this.#hf = new HfTokenizer(tokenizerJson, config);
    } catch (e) {
      throw new TokenizerError(
        `${name}: cannot build the tokenizer (${e instanceof Error ? e.message : e})`,
        { cause: e },
      );
    }
    let size = 0;
    const model = tokenizerJson.model;
    if (isRecord(model) && isRecord(model.vocab)) {
      for (const v of Object.values(model.vocab)) {
        if (typeof v === "number") size = Math.max(size, v + 1);
      }
    }
    const special = new Set<number>();
    for (const [id, token] of this.#hf.get_added_tokens_decoder()) {
      size = Math.max(size, id + 1);
      if (token.special) special.add(id);
    }
    this.size = size;
    this.specialIds = special;
    this.grammarVocab = grammarVocabOf(tokenizerJson, this.#hf.get_added_tokens_decoder(), size);
    this.#cleanUp = config.clean_up_tokenization_spaces === true;

    const specials: Record<string, string> = {};
    for (const key of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
      const content = tokenContent(config[key]);
      if (content !== undefined) specials[key] = content;
    }
    this.#specialStrings = specials;
    this.bosToken = specials.bos_token;
    this.eosToken = specials.eos_token;
    this.bosTokenId = this.bosToken === undefined ? undefined : this.#hf.token_to_id(this.bosToken);
    this.eosTokenId = this.eosToken === undefined ? undefined : this.#hf.token_to_id(this.eosToken);
    this.addBosToken = config.add_bos_token === true && this.bosTokenId !== undefined;
    this.addEosToken = config.add_eos_token === true && this.eosTokenId !== undefined;

    this.chatTemplateSource = template ?? pickTemplate(config.chat_template);
    if (this.chatTemplateSource !== undefined) {
      this.#template = new ChatTemplate(this.chatTemplateSource, specials);
    }
  }

  /**
   * Loads `dir/tokenizer.json` and (when present) `dir/tokenizer_config.json`; a
   * `dir/chat_template.jinja` file, when present, overrides the config's `chat_template`, and
   * `chatTemplate` (the template's source, e.g. from `--chat-template`) overrides both.
   *
   * @throws {TokenizerError} when tokenizer.json is missing or malformed.
   * @throws {ChatTemplateError} when the chat template does not parse.
   */
  static async fromDir(dir: string, chatTemplate?: string): Promise<Tokenizer> {
    const tokenizerJson = await readJson(`${dir}/tokenizer.json`);
    if (!isRecord(tokenizerJson)) {
      throw new TokenizerError(`${dir}/tokenizer.json: expected a JSON object`);
    }
    const configPath = `${dir}/tokenizer_config.json`;
    const config = (await exists(configPath)) ? await readJson(configPath) : {};
    if (!isRecord(config)) throw new TokenizerError(`${configPath}: expected a JSON object`);
    const jinjaPath = `${dir}/chat_template.jinja`;
    const template = chatTemplate ??
      ((await exists(jinjaPath)) ? await Deno.readTextFile(jinjaPath) : undefined);
    return new Tokenizer(tokenizerJson, config, dir, template);
  }

  /**
   * Builds a tokenizer from already parsed `tokenizer.json` and `tokenizer_config.json`
   * contents.
   */
  static fromJson(tokenizerJson: Json, config: Json = {}, name = "tokenizer"): Tokenizer {
    return new Tokenizer(tokenizerJson, config, name);
  }

  /** Token ids of `text` (see {@linkcode EncodeOptions}). */
  encode(text: string, options: EncodeOptions = {}): number[] {
    const add = options.addSpecialTokens ?? true;
    const ids = this.#hf.encode(text, { add_special_tokens: add }).ids;
    if (add && this.addBosToken && ids[0] !== this.bosTokenId) ids.unshift(this.bosTokenId!);
    if (add && this.addEosToken && ids[ids.length - 1] !== this.eosTokenId) {
      ids.push(this.eosTokenId!);
    }
    return ids;
  }

  /**
   * Text of `ids`. Ids outside the tokenizer's vocabulary (negative, non-integer, or at or beyond
   * {@linkcode size}, e.g. from a padded LM head) are dropped.
   */
  decode(ids: readonly number[], options: DecodeOptions = {}): string {
    const known: number[] = [];
    for (const id of ids) {
      if (
        Number.isInteger(id) && id >= 0 && id < this.size && this.#hf.id_to_token(id) !== undefined
      ) {
        known.push(id);
      }
    }
    if (known.length === 0) return "";
    return this.#hf.decode(known, {
      skip_special_tokens: options.skipSpecialTokens ?? false,
      clean_up_tokenization_spaces: options.cleanUpTokenizationSpaces ?? this.#cleanUp,
    });
  }

  /** The token string of `id` (byte-level form, e.g. `Ġworld`), or undefined if unknown. */
  idToToken(id: number): string | undefined {
    return Number.isInteger(id) && id >= 0 ? this.#hf.id_to_token(id) : undefined;
  }

  /** The id of token string `token`, or undefined if unknown. */
  tokenToId(token: string): number | undefined {
    return this.#hf.token_to_id(token);
  }

  /** Whether the model has a chat template. */
  get hasChatTemplate(): boolean {
    return this.#template !== undefined;
  }

  /**
   * Renders `messages` with the model's chat template (variables: `messages`,
   * `add_generation_prompt`, `bos_token`, `eos_token`, ...). Encode the result with
   * `{ addSpecialTokens: false }`.
   *
   * @throws {ChatTemplateError} when the model has no chat template or rendering fails.
   */
  applyChatTemplate(messages: readonly ChatMessage[], options: ChatTemplateOptions = {}): string {
    if (this.#template === undefined) {
      throw new ChatTemplateError(
        `${this.#name} has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja): start the server with --chat-template, or use a completion request`,
      );
    }
    return this.#template.render(messages, options);
  }

  /** The special-token strings (`bos_token`, `eos_token`, ...) from tokenizer_config.json. */
  get specialTokens(): Readonly<Record<string, string>> {
    return this.#specialStrings;
  }
}
