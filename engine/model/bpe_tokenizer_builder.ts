/**
 * Builds small byte-level BPE tokenizers (the GPT-2 / Qwen / Llama 3 family) for generated test
 * checkpoints: a `tokenizer.json` in the Hugging Face `tokenizers` format with the 256 byte
 * tokens, merges learned from a small built-in English / Chinese / code corpus, and added
 * special tokens at the end of the vocabulary.
 *
 * Every string round-trips exactly (byte-level BPE can spell any byte sequence), including
 * Chinese and emoji; a `Qwen` flavour also NFC-normalises its input like the real Qwen
 * tokenizer, so round-trips are exact for NFC text.
 *
 * @module
 */

/** Which real tokenizer family the generated `tokenizer.json` imitates. */
export type TokenizerFlavor = "qwen" | "llama" | "gpt2";

/** Options for {@linkcode buildBpeTokenizer}. */
export interface BpeTokenizerOptions {
  /** Pre-tokenizer / post-processor layout to imitate. */
  flavor: TokenizerFlavor;
  /** Total vocabulary size including the 256 byte tokens, merged tokens and special tokens. */
  vocabSize: number;
  /** Added special tokens, appended after the BPE vocabulary in this order. */
  specialTokens: readonly string[];
  /**
   * For `llama`: the special token a `TemplateProcessing` post-processor prepends when
   * encoding with special tokens (like `<|begin_of_text|>` in Llama 3). Ignored otherwise.
   */
  bosToken?: string;
  /** Training text; defaults to {@linkcode TRAINING_CORPUS}. */
  corpus?: string;
}

/** A built tokenizer: the `tokenizer.json` object and the ids of its special tokens. */
export interface BuiltTokenizer {
  /** The `tokenizer.json` contents (serialise with `JSON.stringify`). */
  json: Record<string, unknown>;
  /** Total number of ids (`vocabSize`). */
  size: number;
  /** Id of every special token, by content. */
  specialIds: Map<string, number>;
}

/**
 * The built-in training text: a few paragraphs of English, Chinese and code, written for this
 * project. Repetition is intentional: it gives the BPE trainer frequent pairs to merge.
 */
export const TRAINING_CORPUS = `
The little inference server reads a checkpoint, copies the weights to the graphics card and
then answers requests one token at a time. Each request carries a prompt; the prompt is split
into tokens, the tokens are turned into vectors, and the vectors pass through every layer of
the model. At the end of the last layer the model gives a score to every word in the
vocabulary, and the sampler picks the next token. The server repeats this until the model
writes the end token or the request reaches its length limit.

When many people send requests at the same time, the scheduler puts them together in one
batch. A batch of sixteen short requests costs almost the same as one request, because the
weights are read from memory only once for the whole batch. This is why a good server keeps
the batch full: it starts new requests as soon as old ones finish, and it stores the keys and
values of every request in small pages so that memory is never wasted.

Testing matters as much as speed. We compare every kernel with a slow reference written in
plain code, we try shapes that are not multiples of the tile size, and we check that a broken
kernel really makes the test fail. The weights in these test models are random, so the text
they write is nonsense, but the numbers can still be checked exactly.

The weather was cold this morning, so I walked to the station with a hot cup of tea. The
train was late again, and the people waiting on the platform were reading, talking, or
looking at their phones. When it finally came, I found a seat by the window and watched the
fields, the rivers and the small towns go by.

小型推理服务器先读取模型文件，把权重复制到显卡上，然后一次生成一个词元来回答请求。
每个请求都带着一段提示；提示被切分成词元，词元被变成向量，向量再经过模型的每一层。
当很多人同时发送请求时，调度器会把它们放进同一个批次里。批次越满，显卡的效率就越高。
我们用简单的参考代码检查每一个计算核心，也检查不是整块大小倍数的形状。
今天早上天气很冷，我拿着一杯热茶走到车站。火车又晚点了，站台上的人们在看书、聊天或者看手机。
我们的模型很小，但是测试很认真。中文、英文和代码都可以被正确地切分和还原。

function softmax(values) {
  const max = Math.max(...values);
  const exps = values.map((v) => Math.exp(v - max));
  const sum = exps.reduce((a, b) => a + b, 0);
  return exps.map((e) => e / sum);
}

def rms_norm(x, weight, eps=1e-6):
    variance = sum(v * v for v in x) / len(x)
    scale = 1.0 / math.sqrt(variance + eps)
    return [v * scale * w for v, w in zip(x, weight)]

for (let i = 0; i < tokens.length; i++) {
  const token = tokens[i];
  if (token === endToken) break;
  output.push(decode(token));
}

Numbers like 3.14159, 2048, 151936 and 0.02 appear in code and in text. Symbols such as
{}, [], (), <>, ==, !=, +=, -> and => appear in code. Emoji appear in chat: 😀 🙂 🚀 ✨ 👍 🎉.
`;

/** GPT-2's reversible map from bytes to printable characters, and the id order of the bytes. */
function byteTables(): { toChar: string[]; order: number[] } {
  const order: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) order.push(b);
  for (let b = 0xa1; b <= 0xac; b++) order.push(b);
  for (let b = 0xae; b <= 0xff; b++) order.push(b);
  const toChar: string[] = new Array(256);
  for (const b of order) toChar[b] = String.fromCodePoint(b);
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    if (toChar[b] === undefined) {
      toChar[b] = String.fromCodePoint(256 + extra++);
      order.push(b);
    }
  }
  return { toChar, order };
}

const BYTE_TABLES = byteTables();

/**
 * `BYTE_TO_CHAR[b]` is the printable character standing for byte `b` in byte-level tokens
 * (printable ASCII and Latin-1 stand for themselves, the other bytes map to U+0100 onwards).
 */
export const BYTE_TO_CHAR: readonly string[] = BYTE_TABLES.toChar;

/** Bytes in the order GPT-2 gives them ids 0..255 (printable first). */
const BYTE_ORDER: readonly number[] = BYTE_TABLES.order;

/** Pre-tokenization regexes (`tokenizers` syntax) of the real tokenizers, by flavour. */
const SPLIT_PATTERNS: Record<TokenizerFlavor, string> = {
  qwen:
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  llama:
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  gpt2: "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
};

/** The same patterns as JavaScript regexes, used to split the training corpus. */
const JS_SPLIT: Record<TokenizerFlavor, RegExp> = {
  qwen:
    /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu,
  llama:
    /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu,
  gpt2: /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu,
};

function toByteLevel(piece: string): string[] {
  const bytes = new TextEncoder().encode(piece);
  return Array.from(bytes, (b) => BYTE_TO_CHAR[b]!);
}

/**
 * Learns BPE merges from `corpus` until they have produced `count` distinct new tokens:
 * repeatedly merges the most frequent adjacent pair (ties broken by the pair's text, so the
 * result is deterministic). Two merges can spell the same token (`ab c`, `a bc`); both are kept.
 *
 * @throws {RangeError} when the corpus runs out of pairs first.
 */
export function learnMerges(corpus: string, flavor: TokenizerFlavor, count: number): string[][] {
  const wordCounts = new Map<string, number>();
  for (const m of corpus.normalize("NFC").matchAll(JS_SPLIT[flavor])) {
    wordCounts.set(m[0], (wordCounts.get(m[0]) ?? 0) + 1);
  }
  const words: { symbols: string[]; count: number }[] = [];
  for (const [w, c] of wordCounts) words.push({ symbols: toByteLevel(w), count: c });

  const merges: string[][] = [];
  const produced = new Set<string>();
  while (produced.size < count) {
    const pairCounts = new Map<string, number>();
    for (const { symbols, count: c } of words) {
      for (let i = 0; i + 1 < symbols.length; i++) {
        const key = symbols[i] + " " + symbols[i + 1];
        pairCounts.set(key, (pairCounts.get(key) ?? 0) + c);
      }
    }
    let best: string | undefined;
    let bestCount = 0;
    for (const [key, c] of pairCounts) {
      if (c > bestCount || (c === bestCount && best !== undefined && key < best)) {
        best = key;
        bestCount = c;
      }
    }
    if (best === undefined) {
      throw new RangeError(
        `Cannot learn ${count} tokens: the corpus has no pairs left after ${produced.size}`,
      );
    }
    const [a, b] = best.split(" ") as [string, string];
    merges.push([a, b]);
    const merged = a + b;
    produced.add(merged);
    for (const word of words) {
      const s = word.symbols;
      if (s.length < 2) continue;
      const out: string[] = [];
      for (let i = 0; i < s.length; i++) {
        if (i + 1 < s.length && s[i] === a && s[i + 1] === b) {
          out.push(merged);
          i++;
        } else {
          out.push(s[i]!);
        }
      }
      word.symbols = out;
    }
  }
  return merges;
}

function addedToken(id: number, content: string): Record<string, unknown> {
  return {
    id,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  };
}

/**
 * Builds a byte-level BPE `tokenizer.json` of exactly `vocabSize` ids: ids 0..255 are the byte
 * tokens (in GPT-2's order), then merged tokens, then `specialTokens`. The layout of the
 * normalizer, pre-tokenizer, post-processor and decoder imitates the chosen flavour's real
 * tokenizer.
 *
 * @throws {RangeError} when `vocabSize` is too small for the bytes and special tokens, or the
 * corpus cannot supply enough merges.
 */
export function buildBpeTokenizer(options: BpeTokenizerOptions): BuiltTokenizer {
  const { flavor, vocabSize, specialTokens } = options;
  const corpus = options.corpus ?? TRAINING_CORPUS;
  const newTokens = vocabSize - 256 - specialTokens.length;
  if (!Number.isSafeInteger(vocabSize) || newTokens < 0) {
    throw new RangeError(
      `Cannot build a tokenizer of ${vocabSize} ids: 256 byte tokens and ${specialTokens.length} special tokens need at least ${
        256 + specialTokens.length
      }`,
    );
  }

  const vocab: Record<string, number> = {};
  let next = 0;
  for (const b of BYTE_ORDER) vocab[BYTE_TO_CHAR[b]!] = next++;

  const merges = learnMerges(corpus, flavor, newTokens);
  for (const [a, b] of merges) {
    const t = a! + b!;
    if (!Object.hasOwn(vocab, t)) vocab[t] = next++;
  }

  const specialIds = new Map<string, number>();
  const added = specialTokens.map((content) => {
    const id = next++;
    specialIds.set(content, id);
    return addedToken(id, content);
  });
  // GPT-2 also lists its special token in the model vocabulary; Qwen and Llama 3 do not.
  if (flavor === "gpt2") { for (const [content, id] of specialIds) vocab[content] = id; }

  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    ...pipelineOf(flavor, specialIds, options.bosToken),
    decoder: byteLevel(true, true, true),
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: flavor === "llama" ? null : "",
      end_of_word_suffix: flavor === "llama" ? null : "",
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: flavor === "llama",
      vocab,
      merges: merges.map(([a, b]) => `${a} ${b}`),
    },
  };
  return { json, size: next, specialIds };
}

/** A `ByteLevel` pre-tokenizer, post-processor or decoder. */
function byteLevel(addPrefixSpace: boolean, trimOffsets: boolean, useRegex: boolean) {
  return {
    type: "ByteLevel",
    add_prefix_space: addPrefixSpace,
    trim_offsets: trimOffsets,
    use_regex: useRegex,
  };
}

/**
 * The `normalizer`, `pre_tokenizer` and `post_processor` of the flavour's real tokenizer (Llama
 * 3's prepends `bosToken` when given).
 *
 * @throws {RangeError} when `bosToken` is not one of `specialIds`.
 */
function pipelineOf(
  flavor: TokenizerFlavor,
  specialIds: ReadonlyMap<string, number>,
  bosToken: string | undefined,
): { normalizer: unknown; pre_tokenizer: unknown; post_processor: unknown } {
  const split = {
    type: "Split",
    pattern: { Regex: SPLIT_PATTERNS[flavor] },
    behavior: "Isolated",
    invert: false,
  };
  if (flavor === "gpt2") {
    return {
      normalizer: null,
      pre_tokenizer: byteLevel(false, true, true),
      post_processor: byteLevel(true, false, true),
    };
  }
  if (flavor === "qwen") {
    return {
      normalizer: { type: "NFC" },
      pre_tokenizer: { type: "Sequence", pretokenizers: [split, byteLevel(false, false, false)] },
      post_processor: byteLevel(false, false, false),
    };
  }
  const bosId = bosToken === undefined ? undefined : specialIds.get(bosToken);
  if (bosToken !== undefined && bosId === undefined) {
    throw new RangeError(`Cannot build a tokenizer: bosToken ${bosToken} is not a special token`);
  }
  return {
    normalizer: null,
    pre_tokenizer: { type: "Sequence", pretokenizers: [split, byteLevel(false, true, false)] },
    post_processor: bosToken === undefined || bosId === undefined ? byteLevel(true, false, true) : {
      type: "Sequence",
      processors: [byteLevel(true, false, true), bosTemplate(bosToken, bosId)],
    },
  };
}

/** Llama 3's `TemplateProcessing`: `bos` (id `bosId`) before each sequence. */
function bosTemplate(bos: string, bosId: number) {
  return {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
    pair: [
      { SpecialToken: { id: bos, type_id: 0 } },
      { Sequence: { id: "A", type_id: 0 } },
      { SpecialToken: { id: bos, type_id: 1 } },
      { Sequence: { id: "B", type_id: 1 } },
    ],
    special_tokens: { [bos]: { id: bos, ids: [bosId], tokens: [bos] } },
  };
}
