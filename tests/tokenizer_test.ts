import assert from "node:assert/strict";
import { makeModel } from "../tools/make_model.ts";
import { Tokenizer } from "../engine/tokenizer.ts";
import { ChatTemplateError } from "../engine/chat_template.ts";
import { buildBpeTokenizer } from "../engine/model/bpe_tokenizer_builder.ts";
import { type Rng, testSeed } from "./support/random.ts";

/** Writes the preset's checkpoint files to a temp dir once and loads its tokenizer. */
const cache = new Map<string, Promise<Tokenizer>>();
function tokenizerOf(preset: string): Promise<Tokenizer> {
  let t = cache.get(preset);
  if (t === undefined) {
    t = (async () => {
      const dir = await Deno.makeTempDir({ prefix: `tok_${preset}_` });
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

const PRESETS = ["tiny-qwen3", "tiny-qwen2", "tiny-llama", "tiny-gpt2"];

const FIXED_TEXTS = [
  "",
  "Hello, world!",
  "The model's weights aren't random; they'll be checked.",
  "小型推理服务器先读取模型文件，然后一次生成一个词元。",
  "Emoji: 😀 🙂 🚀 ✨ 👍🏽 👨‍👩‍👧 🇫🇷 and 🎉!",
  "def f(x):\n\treturn x ** 2  # square\n\n\n",
  "   leading and trailing spaces   ",
  "Numbers 3.14159, 2048 and 151936; café, naïve, Ωμέγα, русский, عربى",
  "<|im_start|>user\nhi<|im_end|>\n",
  "\u0000\u0001\u007f control bytes \r\n end",
];

/** Random strings from a pool of NFC-stable pieces (ASCII, Latin-1, CJK, emoji, whitespace). */
function randomText(rng: Rng): string {
  const pool = [
    "a",
    "e",
    "the",
    " ",
    "  ",
    "\n",
    "\t",
    "'s",
    "'LL",
    "0",
    "42",
    "!",
    "?.",
    "{}",
    "é",
    "ß",
    "世",
    "界",
    "推理",
    "😀",
    "🚀",
    "👍🏽",
    "€",
    "\u00a0",
    "Ω",
    "<|endoftext|>",
  ];
  let s = "";
  const n = rng.int(0, 30);
  for (let i = 0; i < n; i++) s += pool[rng.int(0, pool.length - 1)];
  return s;
}

Deno.test("Tokenizer.decode(encode(text)) is the text for fixed and random strings", async () => {
  for (const preset of PRESETS) {
    const tok = await tokenizerOf(preset);
    const { seed, rng } = testSeed(`tokenizer round trip ${preset}`);
    const texts = [...FIXED_TEXTS];
    for (let i = 0; i < 300; i++) texts.push(randomText(rng));
    for (const text of texts) {
      const ids = tok.encode(text, { addSpecialTokens: false });
      assert(ids.every((id) => id >= 0 && id < tok.size), `${preset}: ids in range`);
      assert.deepEqual(
        tok.decode(ids),
        text,
        `${preset} seed ${seed}: round trip of ${JSON.stringify(text)}`,
      );
    }
  }
});

Deno.test("Tokenizer has the generated vocabulary, special tokens and BOS handling", async () => {
  const qwen = await tokenizerOf("tiny-qwen3");
  assert.deepEqual(qwen.size, 512);
  assert.deepEqual(qwen.encode("<|im_start|>"), [510]);
  assert.deepEqual(qwen.encode("<|im_end|><|endoftext|>"), [511, 509]);
  assert.deepEqual(qwen.eosTokenId, 511);
  assert.deepEqual(qwen.bosTokenId, undefined);
  assert.deepEqual([...qwen.specialIds].sort(), [509, 510, 511]);
  // Qwen adds nothing when encoding with special tokens.
  assert.deepEqual(qwen.encode("hi"), qwen.encode("hi", { addSpecialTokens: false }));

  const llama = await tokenizerOf("tiny-llama");
  assert.deepEqual(llama.bosTokenId, 509);
  assert(llama.addBosToken);
  const plain = llama.encode("hi there", { addSpecialTokens: false });
  assert.deepEqual(llama.encode("hi there"), [509, ...plain]);

  const gpt2 = await tokenizerOf("tiny-gpt2");
  assert.deepEqual(gpt2.size, 512);
  assert.deepEqual(gpt2.encode("<|endoftext|>"), [511]);
  assert.deepEqual(gpt2.bosTokenId, 511);
  assert.deepEqual(gpt2.eosTokenId, 511);
  // GPT-2 has only <|endoftext|>: ChatML markers are ordinary text.
  assert(gpt2.encode("<|im_start|>").length > 1);
});

Deno.test("Tokenizer.decode() drops ids beyond the vocabulary and can skip special tokens", async () => {
  const tok = await tokenizerOf("tiny-qwen3");
  const ids = tok.encode("<|im_start|>user\n你好 🚀<|im_end|>");
  // Ids of a padded vocabulary (151936 rows for 512 tokens) decode to nothing.
  assert.deepEqual(tok.decode([151935, ...ids, 512, 100000]), tok.decode(ids));
  assert.deepEqual(tok.decode([512]), "");
  assert.deepEqual(tok.decode([]), "");
  assert.deepEqual(tok.decode([-1, 1.5]), "");
  assert.deepEqual(tok.decode(ids), "<|im_start|>user\n你好 🚀<|im_end|>");
  assert.deepEqual(tok.decode(ids, { skipSpecialTokens: true }), "user\n你好 🚀");
});

Deno.test("applyChatTemplate() renders a 2-message conversation as ChatML", async () => {
  const messages = [
    { role: "system", content: "You are terse." },
    { role: "user", content: "Say 你好 👋" },
  ];
  const chatml = "<|im_start|>system\nYou are terse.<|im_end|>\n" +
    "<|im_start|>user\nSay 你好 👋<|im_end|>\n";
  for (const preset of ["tiny-qwen3", "tiny-qwen2"]) {
    const tok = await tokenizerOf(preset);
    assert(tok.hasChatTemplate);
    assert.deepEqual(tok.applyChatTemplate(messages), chatml, preset);
    assert.deepEqual(
      tok.applyChatTemplate(messages, { addGenerationPrompt: true }),
      chatml + "<|im_start|>assistant\n",
      preset,
    );
  }
  const llama = await tokenizerOf("tiny-llama");
  assert.deepEqual(
    llama.applyChatTemplate(messages, { addGenerationPrompt: true }),
    "<|endoftext|>" + chatml + "<|im_start|>assistant\n",
  );
  const gpt2 = await tokenizerOf("tiny-gpt2");
  assert.deepEqual(
    gpt2.applyChatTemplate(messages, { addGenerationPrompt: true }),
    "system: You are terse.\nuser: Say 你好 👋\nassistant:",
  );
  // The rendered prompt encodes to the special-token ids, not their spelling.
  const qwen = await tokenizerOf("tiny-qwen3");
  const ids = qwen.encode(qwen.applyChatTemplate(messages), { addSpecialTokens: false });
  assert.deepEqual(ids[0], 510);
  assert.deepEqual(ids.filter((id) => id === 511).length, 2);
});

Deno.test("applyChatTemplate() with continueFinalMessage leaves the final message open", async () => {
  const user = { role: "user", content: "Name a colour." };
  const open = "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nIt is ";
  for (const preset of ["tiny-qwen3", "tiny-qwen2"]) {
    const tok = await tokenizerOf(preset);
    // Trailing whitespace the template kept stays; the end of turn after it goes.
    assert.deepEqual(
      tok.applyChatTemplate([user, { role: "assistant", content: "It is " }], {
        continueFinalMessage: true,
      }),
      open,
      preset,
    );
  }
  const gpt2 = await tokenizerOf("tiny-gpt2");
  assert.deepEqual(
    gpt2.applyChatTemplate([user, { role: "assistant", content: "Blue, or" }], {
      continueFinalMessage: true,
    }),
    "user: Name a colour.\nassistant: Blue, or",
  );
  const qwen = await tokenizerOf("tiny-qwen3");
  for (const content of ["", "  "]) {
    assert.throws(
      () =>
        qwen.applyChatTemplate([user, { role: "assistant", content }], {
          continueFinalMessage: true,
        }),
      (e: unknown) => e instanceof ChatTemplateError && /final message with text/.test(e.message),
    );
  }
});

Deno.test("applyChatTemplate() without a template throws one clear line", () => {
  const built = buildBpeTokenizer({
    flavor: "qwen",
    vocabSize: 300,
    specialTokens: ["<|endoftext|>"],
  });
  const tok = Tokenizer.fromJson(built.json, { clean_up_tokenization_spaces: false }, "no-tmpl");
  assert(!tok.hasChatTemplate);
  assert.throws(
    () => tok.applyChatTemplate([{ role: "user", content: "hi" }]),
    (e: unknown) =>
      e instanceof ChatTemplateError && e.message.startsWith("no-tmpl has no chat template") &&
      !e.message.includes("\n"),
  );
  assert.deepEqual(tok.size, 300);
  assert.deepEqual(tok.decode(tok.encode("round trip 世界")), "round trip 世界");
});

Deno.test("Tokenizer.fromDir() reports a missing tokenizer.json with its path", async () => {
  const dir = await Deno.makeTempDir({ prefix: "tok_missing_" });
  try {
    let message = "";
    try {
      await Tokenizer.fromDir(dir);
    } catch (e) {
      message = e instanceof Error ? e.message : String(e);
    }
    assert(message.startsWith(`${dir}/tokenizer.json: cannot read`), message);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Tokenizer.fromDir() takes a given chat template over chat_template.jinja and the config's", async () => {
  const dir = await Deno.makeTempDir({ prefix: "tok_tmpl_" });
  try {
    await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "bf16" });
    const messages = [{ role: "user", content: "hi" }];
    const own = await Tokenizer.fromDir(dir);
    assert.match(own.applyChatTemplate(messages), /^<\|im_start\|>user\nhi<\|im_end\|>\n$/);
    await Deno.writeTextFile(`${dir}/chat_template.jinja`, "[jinja file]{{ messages[0].content }}");
    assert.equal((await Tokenizer.fromDir(dir)).applyChatTemplate(messages), "[jinja file]hi");
    const given = await Tokenizer.fromDir(dir, "[given]{{ messages[0].content }}{{ eos_token }}");
    assert.equal(given.applyChatTemplate(messages), `[given]hi${given.eosToken}`);
    assert.equal(given.chatTemplateSource, "[given]{{ messages[0].content }}{{ eos_token }}");
    await assert.rejects(() => Tokenizer.fromDir(dir, "{% for %}"), ChatTemplateError);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
