import assert from "node:assert/strict";
import { makeModel } from "../tools/make_model.ts";
import { type DecodeOptions, Tokenizer } from "../engine/tokenizer.ts";
import { IncrementalDetokenizer, MAX_PENDING } from "../engine/detokenizer.ts";
import { BYTE_TO_CHAR } from "../engine/model/bpe_tokenizer_builder.ts";
import { type Rng, testSeed } from "./support/random.ts";

const cache = new Map<string, Promise<Tokenizer>>();
function tokenizerOf(preset: string): Promise<Tokenizer> {
  let t = cache.get(preset);
  if (t === undefined) {
    t = (async () => {
      const dir = await Deno.makeTempDir({ prefix: `detok_${preset}_` });
      try {
        await makeModel({ out: dir, preset, dtype: "bf16" });
        return await Tokenizer.fromDir(dir);
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    })();
    cache.set(preset, t);
  }
  return t;
}

/** Streams `ids` through a detokenizer; returns the deltas (the last one from finish()). */
function stream(
  tok: Pick<Tokenizer, "decode">,
  ids: readonly number[],
  skipSpecialTokens: boolean,
  promptIds?: number[],
): string[] {
  const d = new IncrementalDetokenizer(tok, { skipSpecialTokens, promptIds });
  const deltas = ids.map((id) => d.push(id));
  deltas.push(d.finish());
  return deltas;
}

const TEXT = "Streaming 中文和表情 😀🚀👍🏽 works; café, naïve.\n\tdef f(): return '世界'\n";

/**
 * Random id sequences that often split characters: uniform ids, byte tokens only, pieces of
 * real Chinese/emoji encodings, special tokens and padded ids beyond the vocabulary.
 */
function randomIds(rng: Rng, tok: Tokenizer, textIds: readonly number[]): number[] {
  const n = rng.int(1, 40);
  const ids: number[] = [];
  const mode = rng.int(0, 3);
  while (ids.length < n) {
    const r = rng.next();
    if (mode === 0 || r < 0.1) ids.push(rng.int(0, tok.size - 1));
    else if (mode === 1 || r < 0.5) ids.push(rng.int(0, 255));
    else if (r < 0.9) {
      const start = rng.int(0, textIds.length - 1);
      ids.push(...textIds.slice(start, start + rng.int(1, 6)));
    } else if (r < 0.97) ids.push(rng.int(tok.size - 3, tok.size - 1));
    else ids.push(rng.int(tok.size, tok.size + 1000));
  }
  return ids;
}

Deno.test("IncrementalDetokenizer deltas concatenate to the full decode of random id sequences", async () => {
  for (const preset of ["tiny-qwen3", "tiny-gpt2"]) {
    const tok = await tokenizerOf(preset);
    const textIds = tok.encode(TEXT, { addSpecialTokens: false });
    const { seed, rng } = testSeed(`detokenizer property ${preset}`);
    for (let c = 0; c < 1500; c++) {
      const ids = randomIds(rng, tok, textIds);
      const skip = c % 2 === 1;
      const options: DecodeOptions = { skipSpecialTokens: skip, cleanUpTokenizationSpaces: false };
      const deltas = stream(tok, ids, skip);
      assert.equal(
        deltas.join(""),
        tok.decode(ids, options),
        `${preset} seed ${seed} case ${c} skip=${skip}: ids [${ids.join(", ")}]`,
      );
    }
  }
});

Deno.test("IncrementalDetokenizer is exact on long runs of broken and valid UTF-8 bytes", async () => {
  // One token per byte: valid 2-4 byte characters mixed with stray lead and continuation bytes,
  // so the text keeps ending in U+FFFD and the detokenizer must find real boundaries.
  const tok = await tokenizerOf("tiny-qwen3");
  const byteId = (b: number) => tok.tokenToId(BYTE_TO_CHAR[b]!)!;
  const { seed, rng } = testSeed("detokenizer broken utf-8");
  const chars = ["中", "😀", "é", "€", "🚀"].map((c) => [...new TextEncoder().encode(c)]);
  for (let c = 0; c < 200; c++) {
    const bytes: number[] = [];
    while (bytes.length < 120) {
      const r = rng.next();
      if (r < 0.4) bytes.push(...chars[rng.int(0, chars.length - 1)]!);
      else if (r < 0.7) bytes.push(rng.int(0x80, 0xbf));
      else if (r < 0.9) bytes.push(rng.int(0xc2, 0xf4));
      else bytes.push(rng.int(0x20, 0x7e));
    }
    const ids = bytes.map(byteId);
    assert.equal(stream(tok, ids, false).join(""), tok.decode(ids), `seed ${seed} case ${c}`);
  }
});

Deno.test("IncrementalDetokenizer does not close a character at tokens that decode to nothing", async () => {
  // Stray bytes hold the window; then an emoji's first three bytes, a skipped special token (or an
  // id beyond the vocabulary) and its last byte. With 5 stray bytes the window first exceeds
  // MAX_PENDING at the silent token and looks for a boundary there. It is none: the emoji must
  // come out whole, never as U+FFFD or half a surrogate pair.
  const tok = await tokenizerOf("tiny-qwen3");
  const byteId = (b: number) => tok.tokenToId(BYTE_TO_CHAR[b]!)!;
  const special = [...tok.specialIds][0]!;
  for (const silent of [special, tok.size + 7]) {
    for (let stray = 0; stray <= 2 * MAX_PENDING; stray++) {
      const ids = [
        ...Array.from({ length: stray }, () => byteId(0x80)),
        ...[0xf0, 0x9f, 0x9a].map(byteId),
        silent,
        byteId(0x8d),
        byteId(0x41),
      ];
      const deltas = stream(tok, ids, true);
      const context = `silent id ${silent}, ${stray} stray bytes`;
      assert.equal(deltas.join(""), "\uFFFD".repeat(stray) + "\u{1F68D}A", context);
      for (const d of deltas) assert.ok(d.isWellFormed(), `${context}: delta ${JSON.stringify(d)}`);
    }
  }
});

Deno.test("IncrementalDetokenizer never splits a character of valid text", async () => {
  const tok = await tokenizerOf("tiny-qwen3");
  const { seed, rng } = testSeed("detokenizer valid text");
  const pieces = ["中", "文", "😀", "🚀", "👍🏽", "é", " ", "ab", "\n", "表情", "€"];
  for (let c = 0; c < 300; c++) {
    let text = "";
    for (let i = rng.int(1, 20); i > 0; i--) text += pieces[rng.int(0, pieces.length - 1)];
    const ids = tok.encode(text, { addSpecialTokens: false });
    const deltas = stream(tok, ids, false);
    assert.equal(deltas.join(""), text, `seed ${seed} case ${c}`);
    for (const d of deltas) {
      assert(!d.includes("\uFFFD"), `seed ${seed} case ${c}: delta ${JSON.stringify(d)}`);
      assert(d.isWellFormed(), `seed ${seed} case ${c}: lone surrogate in ${JSON.stringify(d)}`);
    }
  }
});

Deno.test("IncrementalDetokenizer decodes an O(1) window per token", async () => {
  const tok = await tokenizerOf("tiny-qwen3");
  let longest = 0;
  let calls = 0;
  const spy = {
    decode(ids: readonly number[], options?: DecodeOptions): string {
      calls++;
      longest = Math.max(longest, ids.length);
      return tok.decode(ids, options);
    },
  };
  // Long valid text, then a long run of real U+FFFD characters (each decodes to a text that
  // ends in U+FFFD, so it is held back until the window finds a boundary), then more text.
  const text = TEXT.repeat(40) + "\uFFFD".repeat(200) + TEXT.repeat(5);
  const ids = tok.encode(text, { addSpecialTokens: false });
  const d = new IncrementalDetokenizer(spy);
  let streamed = "";
  let maxLag = 0;
  for (let i = 0; i < ids.length; i++) {
    streamed += d.push(ids[i]!);
    maxLag = Math.max(maxLag, tok.decode(ids.slice(0, i + 1)).length - streamed.length);
  }
  streamed += d.finish();
  assert.equal(streamed, text);
  assert(ids.length > 1500, `${ids.length} tokens`);
  assert(longest <= 24, `longest decoded window ${longest} ids`);
  assert(calls <= 4 * ids.length, `${calls} decode calls for ${ids.length} tokens`);
  assert(maxLag <= 16, `text held back up to ${maxLag} characters`);
});

Deno.test("IncrementalDetokenizer with prompt context streams only the generated text", async () => {
  const tok = await tokenizerOf("tiny-llama");
  const prompt = tok.encode("Question: 你好?");
  const generated = tok.encode(" Answer: 世界 🚀 <|im_end|>", { addSpecialTokens: false });
  const withContext = stream(tok, generated, false, prompt).join("");
  assert.equal(withContext, " Answer: 世界 🚀 <|im_end|>");
  assert.equal(stream(tok, generated, true, prompt).join(""), " Answer: 世界 🚀 ");
  // A prompt ending mid-character gives no context and no stray replacement character.
  const partial = tok.encode("表", { addSpecialTokens: false }).slice(0, 1);
  assert.equal(stream(tok, generated, false, partial).join(""), " Answer: 世界 🚀 <|im_end|>");
});

Deno.test("IncrementalDetokenizer.finish() flushes held bytes and refuses push() afterwards", async () => {
  const tok = await tokenizerOf("tiny-qwen3");
  const d = new IncrementalDetokenizer(tok);
  assert.equal(d.push(tok.encode("a")[0]!), "a");
  // The first byte of a 3-byte character is held back; finish() gives what a full decode gives.
  const lead = tok.tokenToId("\u00e4")!; // byte 0xE4, lead byte of U+4E00..U+4FFF
  assert.equal(d.push(lead), "");
  assert.equal(d.finish(), "\uFFFD");
  assert.equal(d.finish(), "");
  assert.throws(() => d.push(1), RangeError);
});
