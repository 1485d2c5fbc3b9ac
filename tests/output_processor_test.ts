import assert from "node:assert/strict";
import { makeModel } from "../tools/make_model.ts";
import { Tokenizer } from "../engine/tokenizer.ts";
import { IncrementalDetokenizer } from "../engine/detokenizer.ts";
import { RequestOutputState } from "../engine/output_processor.ts";
import type { FinishReason, RequestOutput, TokenLogprob } from "../engine/engine_api.ts";
import { type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import { Rng, testSeed } from "./support/random.ts";

let tokenizerPromise: Promise<Tokenizer> | undefined;
function tokenizer(): Promise<Tokenizer> {
  tokenizerPromise ??= (async () => {
    const dir = await Deno.makeTempDir({ prefix: "output_processor_" });
    try {
      await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "bf16" });
      return await Tokenizer.fromDir(dir);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  })();
  return tokenizerPromise;
}

const PROMPT = [1, 2, 3];

function encode(tok: Tokenizer, text: string): number[] {
  return tok.encode(text, { addSpecialTokens: false });
}

/** Full decode as the output processor defines its text. */
function fullDecode(tok: Tokenizer, ids: readonly number[]): string {
  return tok.decode(ids, { skipSpecialTokens: true, cleanUpTokenizationSpaces: false });
}

function lp(tokenId: number): TokenLogprob {
  return { tokenId, logprob: -tokenId / 1000 };
}

interface Run {
  outputs: RequestOutput[];
  /** Per push: the output it returned (or null). */
  pushed: (RequestOutput | null)[];
  text: string;
  tokenIds: number[];
  final: RequestOutput;
}

/**
 * Streams `ids` in `chunks` (sizes; default one token per push) and finishes like the engine:
 * with "stop" and the stop string when one matched, else with `end`.
 */
function run(
  tok: Tokenizer | null,
  ids: readonly number[],
  params: Partial<SamplingParams>,
  options: {
    chunks?: readonly number[] | Rng;
    end?: [FinishReason, number | string | null];
    emitTokenOnly?: boolean;
    context?: string;
  } = {},
): Run {
  const p = samplingParams(params);
  const state = new RequestOutputState(tok, {
    requestId: "r1",
    promptTokenIds: PROMPT,
    params: p,
  }, { emitTokenOnly: options.emitTokenOnly });
  const outputs: RequestOutput[] = [];
  const pushed: (RequestOutput | null)[] = [];
  let stop: string | null = null;
  let i = 0;
  let c = 0;
  while (i < ids.length && stop === null) {
    const chunks = options.chunks;
    const n = chunks === undefined
      ? 1
      : chunks instanceof Rng
      ? chunks.int(1, 4)
      : chunks[c++] ?? 1;
    const slice = ids.slice(i, i + n);
    i += n;
    const r = state.push(slice, p.logprobs === null ? null : slice.map(lp));
    pushed.push(r.output);
    if (r.output !== null) outputs.push(r.output);
    stop = r.stopString;
  }
  const [reason, stopReason] = stop !== null ? ["stop" as const, stop] : options.end ?? [
    "length" as const,
    null,
  ];
  const final = state.finish(reason, stopReason);
  outputs.push(final);
  checkStream(outputs, p, options.context ?? "");
  return {
    outputs,
    pushed,
    text: outputs.map((o) => o.text).join(""),
    tokenIds: outputs.flatMap((o) => [...o.tokenIds]),
    final,
  };
}

/** Invariants of every stream. */
function checkStream(outputs: readonly RequestOutput[], p: SamplingParams, ctx: string): void {
  let count = 0;
  outputs.forEach((o, i) => {
    const last = i === outputs.length - 1;
    assert.equal(o.finishReason !== null, last, `${ctx}: finishReason only on the last increment`);
    assert.equal(o.requestId, "r1", ctx);
    assert.equal(o.numPromptTokens, PROMPT.length, ctx);
    count += o.tokenIds.length;
    assert.equal(o.numOutputTokens, count, `${ctx}: numOutputTokens of increment ${i}`);
    assert(o.text.isWellFormed(), `${ctx}: lone surrogate in ${JSON.stringify(o.text)}`);
    if (!last) assert(o.text !== "" || o.tokenIds.length > 0, `${ctx}: empty increment ${i}`);
    if (p.logprobs === null) assert.equal(o.logprobs, null, ctx);
    else assert.deepEqual(o.logprobs, o.tokenIds.map(lp), `${ctx}: logprobs of increment ${i}`);
  });
}

const TEXTS = [
  "Hello world",
  "Hi\n\nUser: there",
  "The answer is STOP now",
  "中文和表情 😀🚀👍🏽 works; café, naïve.",
  "\tdef f(): return '世界'\n",
];

Deno.test("RequestOutputState streams the full decode when there is no stop string", async () => {
  const tok = await tokenizer();
  const { seed, rng } = testSeed("output_processor no stop");
  for (const text of TEXTS) {
    const ids = [...encode(tok, text), tok.eosTokenId!];
    for (const chunks of [undefined, rng, [ids.length]]) {
      const ctx = `seed ${seed} ${JSON.stringify(text)}`;
      // Empty stop strings are ignored.
      const r = run(tok, ids, { stop: [""] }, { chunks, end: ["stop", null], context: ctx });
      assert.equal(r.text, text, ctx);
      assert.equal(r.text, fullDecode(tok, ids), ctx);
      // The EOS token is in tokenIds but not in the text.
      assert.deepEqual(r.tokenIds, ids, ctx);
      assert.equal(r.final.finishReason, "stop", ctx);
      assert.equal(r.final.stopReason, null, ctx);
      for (const o of r.outputs) assert(!o.text.includes("\uFFFD"), `${ctx}: split character`);
    }
  }
});

Deno.test("RequestOutputState stops on a stop string inside one token", async () => {
  const tok = await tokenizer();
  const ids = encode(tok, " the the quick");
  assert.equal(tok.decode([ids[0]!]), " the", "tokenizer precondition: ' the' is one token");
  const r = run(tok, ids, { stop: ["he"] });
  assert.equal(r.text, " t");
  assert.deepEqual(r.tokenIds, [ids[0]]);
  assert.equal(r.final.finishReason, "stop");
  assert.equal(r.final.stopReason, "he");
  assert.equal(r.final.numOutputTokens, 1);
  // The matching push returns no increment: its text travels with the final one.
  assert.deepEqual(r.pushed, [null]);
  assert.equal(r.outputs.length, 1);
});

Deno.test("RequestOutputState holds back a stop string spanning four tokens", async () => {
  const tok = await tokenizer();
  const ids = encode(tok, "The answer is STOP now");
  const pieces = ids.map((id) => tok.decode([id]));
  const s = pieces.indexOf("S");
  assert.deepEqual(pieces.slice(s, s + 4), ["S", "T", "O", "P"], "tokenizer precondition");
  const r = run(tok, ids, { stop: ["STOP"] });
  assert.equal(r.text, "The answer is ");
  assert.deepEqual(r.tokenIds, ids.slice(0, s + 4));
  assert.equal(r.final.stopReason, "STOP");
  // "S", "T", "O" are held back (no increment), "P" completes the match.
  assert.deepEqual(r.pushed.slice(s), [null, null, null, null]);
  assert.equal(r.pushed.slice(0, s).map((o) => o?.text ?? "").join(""), "The answer is ");
  assert.equal(r.final.text, "");
  assert.deepEqual(r.final.tokenIds, ids.slice(s, s + 4));
  // Same in one push: the whole answer arrives with the final increment.
  const whole = run(tok, ids, { stop: ["STOP"] }, { chunks: [ids.length] });
  assert.equal(whole.outputs.length, 1);
  assert.equal(whole.final.text, "The answer is ");
});

Deno.test("RequestOutputState matches stop strings starting mid-token and at the very beginning", async () => {
  const tok = await tokenizer();
  const ids = encode(tok, "Hello world");
  assert.deepEqual(ids.slice(3, 5).map((id) => tok.decode([id])), ["lo", " w"], "precondition");
  const mid = run(tok, ids, { stop: ["o w"] });
  assert.equal(mid.text, "Hell");
  assert.deepEqual(mid.tokenIds, ids.slice(0, 5));
  assert.equal(mid.final.stopReason, "o w");
  // "lo" is emitted as "l" with "o" held back.
  assert.equal(mid.pushed[3]?.text, "l");

  const start = run(tok, ids, { stop: ["Hel"] });
  assert.equal(start.text, "");
  assert.equal(start.outputs.length, 1, "no text is ever emitted");
  assert.deepEqual(start.tokenIds, ids.slice(0, 3));
  assert.equal(start.final.stopReason, "Hel");
});

Deno.test("RequestOutputState: the first stop string completed wins", async () => {
  const tok = await tokenizer();
  const hi = encode(tok, "Hi\n\nUser: there");
  // A stop string that is a prefix of another completes first.
  for (const stop of [["User:", "User"], ["User", "User:"]]) {
    const r = run(tok, hi, { stop });
    assert.equal(r.text, "Hi\n\n", `stop ${JSON.stringify(stop)}`);
    assert.equal(r.final.stopReason, "User");
  }
  const longer = run(tok, hi, { stop: ["\n\nUser: there", "\n\nUser:"] });
  assert.equal(longer.text, "Hi");
  assert.equal(longer.final.stopReason, "\n\nUser:");

  // Within one token's text (" the"), the first completed wins, not the first starting.
  const the = encode(tok, " the");
  assert.equal(the.length, 1, "tokenizer precondition: ' the' is one token");
  const inToken = run(tok, the, { stop: ["the", "h"] });
  assert.equal(inToken.text, " t");
  assert.equal(inToken.final.stopReason, "h");

  const ans = encode(tok, "The answer is STOP now");
  for (const chunks of [undefined, [ans.length]]) {
    const ctx = chunks === undefined ? "token by token" : "one push";
    const r = run(tok, ans, { stop: ["now", "STOP", "is"] }, { chunks });
    assert.equal(r.text, "The answer ", ctx);
    assert.equal(r.final.stopReason, "is", ctx);
    const nested = run(tok, ans, { stop: ["answer is STOP", "is"] }, { chunks });
    assert.equal(nested.text, "The answer ", ctx);
    assert.equal(nested.final.stopReason, "is", ctx);
    // Same end: the one starting first (the longest) wins and is cut whole.
    const tie = run(tok, ans, { stop: ["OP", "STOP"] }, { chunks });
    assert.equal(tie.text, "The answer is ", ctx);
    assert.equal(tie.final.stopReason, "STOP", ctx);
  }
});

Deno.test("RequestOutputState holds back '\\n\\nUs' for stop '\\n\\nUser:' and releases it at finish", async () => {
  const tok = await tokenizer();
  const ids = encode(tok, "Hi\n\nUs");
  const r = run(tok, ids, { stop: ["\n\nUser:"] }, { end: ["length", null] });
  assert.deepEqual(r.pushed.map((o) => o?.text ?? null), ["H", "i", null, null, null]);
  assert.equal(r.final.text, "\n\nUs");
  assert.deepEqual(r.final.tokenIds, ids.slice(2));
  assert.equal(r.final.finishReason, "length");
  assert.equal(r.text, "Hi\n\nUs");

  const full = run(tok, encode(tok, "Hi\n\nUser: there"), { stop: ["\n\nUser:"] });
  assert.equal(full.text, "Hi");
  assert.equal(full.final.stopReason, "\n\nUser:");

  // Abort: the held text is flushed too (it is text the model produced, not a stop string).
  const aborted = run(tok, ids, { stop: ["\n\nUser:"] }, { end: ["abort", null] });
  assert.equal(aborted.final.text, "\n\nUs");
  assert.equal(aborted.final.finishReason, "abort");
  assert.equal(aborted.final.stopReason, null);
});

Deno.test("RequestOutputState keeps the stop string and holds nothing back with includeStopStrInOutput", async () => {
  const tok = await tokenizer();
  const ids = encode(tok, "The answer is STOP now");
  const s = ids.map((id) => tok.decode([id])).indexOf("S");
  const r = run(tok, ids, { stop: ["STOP"], includeStopStrInOutput: true });
  assert.equal(r.text, "The answer is STOP");
  assert.equal(r.final.stopReason, "STOP");
  assert.deepEqual(r.tokenIds, ids.slice(0, s + 4));
  // "S", "T", "O" stream as they come (no hold-back); "P" completes the match and finishes.
  assert.deepEqual(r.pushed.slice(s).map((o) => o?.text ?? null), ["S", "T", "O", null]);
  assert.equal(r.final.text, "P");
  // Text after the stop string in the same push is cut.
  const whole = run(tok, ids, { stop: ["STOP"], includeStopStrInOutput: true }, {
    chunks: [ids.length],
  });
  assert.equal(whole.final.text, "The answer is STOP");
  // A partial stop string is text like any other at the finish.
  const partial = run(tok, encode(tok, "Hi\n\nUs"), {
    stop: ["\n\nUser:"],
    includeStopStrInOutput: true,
  }, { end: ["length", null] });
  assert.equal(partial.text, "Hi\n\nUs");
  assert.ok(partial.pushed.every((o) => o !== null && o.text !== ""), "every token's text at once");
  assert.equal(partial.final.text, "");
});

Deno.test("RequestOutputState leaves out the text of the token that ended the request, unless includeStopStrInOutput", async () => {
  const tok = await tokenizer();
  const ids = encode(tok, "Hello world");
  const stopId = ids[ids.length - 1]!;
  for (const keep of [false, true]) {
    const state = new RequestOutputState(tok, {
      requestId: "r1",
      promptTokenIds: PROMPT,
      params: samplingParams({ stopTokenIds: [stopId], includeStopStrInOutput: keep }),
    });
    const first = state.push(ids.slice(0, -1), null);
    const last = state.push(ids.slice(-1), null, true);
    const final = state.finish("stop", stopId);
    const text = [first.output, last.output, final].map((o) => o?.text ?? "").join("");
    const tokens = [first.output, last.output, final].flatMap((o) => [...(o?.tokenIds ?? [])]);
    assert.equal(text, fullDecode(tok, keep ? ids : ids.slice(0, -1)), `keep ${keep}`);
    assert.deepEqual(tokens, ids, "the stop token is still an output token");
    assert.equal(final.numOutputTokens, ids.length);
  }
});

Deno.test("RequestOutputState keeps special tokens' text with skipSpecialTokens false", async () => {
  const tok = await tokenizer();
  const ids = [...encode(tok, "Hi"), 510, ...encode(tok, "there")];
  const skipped = run(tok, ids, {});
  const kept = run(tok, ids, { skipSpecialTokens: false });
  assert.equal(skipped.text, fullDecode(tok, ids));
  assert.equal(
    kept.text,
    tok.decode(ids, { skipSpecialTokens: false, cleanUpTokenizationSpaces: false }),
  );
  assert.ok(kept.text.length > skipped.text.length, `${kept.text} vs ${skipped.text}`);
});

Deno.test("RequestOutputState never splits Chinese or emoji and matches stop strings in them", async () => {
  const tok = await tokenizer();
  const text = "中文和表情 😀🚀👍🏽 works";
  const ids = encode(tok, text);
  const { seed, rng } = testSeed("output_processor cjk");
  for (
    const [stop, expected] of [["表情", "中文和"], ["🚀👍", "中文和表情 😀"], ["情 😀", "中文和表"]]
  ) {
    for (const chunks of [undefined, rng]) {
      const ctx = `seed ${seed} stop ${stop}`;
      const r = run(tok, ids, { stop: [stop!] }, { chunks, context: ctx });
      assert.equal(r.text, expected, ctx);
      assert.equal(r.final.stopReason, stop, ctx);
      for (const o of r.outputs) assert(!o.text.includes("\uFFFD"), `${ctx}: split character`);
    }
  }
});

Deno.test("RequestOutputState ignores stop strings completed before min_tokens", async () => {
  const tok = await tokenizer();
  const ids = encode(tok, "Hello Hello");
  // "el" completes with token 3 ("l") and again with token 8.
  assert.equal(run(tok, ids, { stop: ["el"], minTokens: 3 }).text, "H");
  const late = run(tok, ids, { stop: ["el"], minTokens: 4 });
  assert.equal(late.text, "Hello H");
  assert.deepEqual(late.tokenIds, ids.slice(0, 8));
  assert.equal(run(tok, ids, { stop: ["el"], minTokens: 9 }).text, "Hello Hello");
  // "ll" starts in token 3 ("l") and completes in token 4 ("lo"): it counts from min_tokens 4.
  const hello = encode(tok, "Hello");
  assert.equal(run(tok, hello, { stop: ["ll"], minTokens: 4 }).text, "He");
  assert.equal(run(tok, hello, { stop: ["ll"], minTokens: 5 }).text, "Hello");
});

Deno.test("RequestOutputState with a null tokenizer streams token ids only", () => {
  const ids = [5, 6, 7, 8, 9];
  const r = run(null, ids, { stop: ["x"], logprobs: 0 }, { chunks: [2, 1, 2], end: ["stop", 9] });
  assert.deepEqual(r.outputs.map((o) => [...o.tokenIds]), [[5, 6], [7], [8, 9], []]);
  assert(r.outputs.every((o) => o.text === ""));
  assert.equal(r.final.finishReason, "stop");
  assert.equal(r.final.stopReason, 9);
  assert.equal(r.final.numOutputTokens, 5);
});

Deno.test("RequestOutputState passes logprobs through and drops tokens after a stop string", async () => {
  const tok = await tokenizer();
  const ids = encode(tok, "Hello world");
  const r = run(tok, ids, { stop: ["lo"], logprobs: 2 }, { chunks: [2, 5] });
  // Token 4 ("lo") completes the match; tokens 5..7 in the same push are dropped.
  assert.deepEqual(r.tokenIds, ids.slice(0, 4));
  assert.equal(r.text, "Hel");
  assert.equal(r.final.numOutputTokens, 4);

  const p = samplingParams({ logprobs: 0, stop: ["lo"] });
  const s = new RequestOutputState(tok, { requestId: "x", promptTokenIds: PROMPT, params: p });
  assert.throws(() => s.push([ids[0]!], null), RangeError);
  assert.throws(() => s.push([ids[0]!, ids[1]!], [lp(ids[0]!)]), RangeError);
  assert.throws(() => s.push([ids[0]!], [lp(ids[1]!)]), /logprob 0 is for token/);
  assert.equal(s.push(ids.slice(0, 4), ids.slice(0, 4).map(lp)).stopString, "lo");
  // Tokens still in flight after the match are ignored.
  assert.deepEqual(s.push([ids[4]!], [lp(ids[4]!)]), { output: null, stopString: null });
  // The stop string wins over the scheduler's reason.
  const final = s.finish("length", null);
  assert.equal(final.finishReason, "stop");
  assert.equal(final.stopReason, "lo");
  assert.throws(() => s.finish("stop", null), RangeError);
  assert.throws(() => s.push([1], [lp(1)]), /finished/);
});

Deno.test("RequestOutputState options: emitTokenOnly, numCachedTokens, last tokens with finish()", async () => {
  const tok = await tokenizer();
  const ids = encode(tok, "Hi\n\nUs");
  const r = run(tok, ids, { stop: ["\n\nUser:"] }, { emitTokenOnly: true });
  assert.deepEqual(r.pushed.map((o) => o?.text ?? null), ["H", "i", "", "", ""]);
  assert.deepEqual(r.outputs.map((o) => o.tokenIds.length), [1, 1, 1, 1, 1, 0]);

  const p = samplingParams({ stop: ["\n\nUser:"] });
  const s = new RequestOutputState(tok, { requestId: "r", promptTokenIds: PROMPT, params: p }, {
    numCachedTokens: 16,
  });
  assert.equal(s.push(ids.slice(0, 3), null).output?.numCachedTokens, 16);
  s.numCachedTokens = 32;
  const done = s.finish("length", null, ids.slice(3));
  assert.equal(done.text, "\n\nUs");
  assert.deepEqual(done.tokenIds, ids.slice(3));
  assert.equal(done.numCachedTokens, 32);
  assert.equal(done.numOutputTokens, ids.length);

  // A stop string completed by finish()'s tokens makes the final increment a stop-string stop.
  const t = new RequestOutputState(tok, { requestId: "r", promptTokenIds: PROMPT, params: p });
  const full = encode(tok, "Hi\n\nUser: there");
  const last = t.finish("length", null, full);
  assert.equal(last.text, "Hi");
  assert.equal(last.finishReason, "stop");
  assert.equal(last.stopReason, "\n\nUser:");
});

/** Reference: the first stop string completed after offset `from` (smallest end, then start). */
function referenceMatch(
  text: string,
  stops: readonly string[],
  from: number,
): { start: number; end: number; stop: string } | null {
  let best: { start: number; end: number; stop: string } | null = null;
  for (const stop of stops) {
    const start = text.indexOf(stop, Math.max(0, from - stop.length + 1));
    if (start < 0) continue;
    const end = start + stop.length;
    if (best === null || end < best.end || (end === best.end && start < best.start)) {
      best = { start, end, stop };
    }
  }
  return best;
}

/** Reference hold-back: the longest suffix of `text` that is a proper prefix of a stop string. */
function referenceHold(text: string, stops: readonly string[]): number {
  let hold = 0;
  for (const stop of stops) {
    for (let k = 1; k < stop.length; k++) {
      if (text.endsWith(stop.slice(0, k))) hold = Math.max(hold, k);
    }
  }
  return hold;
}

const PIECES = [
  "Hello",
  " world",
  "\n\n",
  "User:",
  " the",
  "中文",
  "表情",
  "😀",
  "🚀",
  "👍🏽",
  "é",
  "ab",
  "a",
  "b",
  ".",
  " ",
];

Deno.test("RequestOutputState matches the indexOf reference on random texts, stops and chunks", async () => {
  const tok = await tokenizer();
  const { seed, rng } = testSeed("output_processor property");
  const pick = () => PIECES[rng.int(0, PIECES.length - 1)]!;
  let matched = 0;
  for (let c = 0; c < 1500; c++) {
    let text = "";
    for (let i = rng.int(1, 20); i > 0; i--) text += pick();
    const stops: string[] = [];
    for (let i = rng.int(1, 3); i > 0; i--) {
      let stop = "";
      if (rng.next() < 0.5) {
        for (let j = rng.int(1, 3); j > 0; j--) stop += pick();
      } else {
        // A substring of the text (often spanning pieces).
        const chars = [...text];
        const a = rng.int(0, chars.length - 1);
        stop = chars.slice(a, a + rng.int(1, 6)).join("");
      }
      stops.push(stop);
      if (rng.next() < 0.3) {
        const chars = [...text];
        const at = rng.int(0, chars.length);
        text = chars.slice(0, at).join("") + stop + chars.slice(at).join("");
      }
    }
    const ids = encode(tok, text);
    if (rng.next() < 0.3) ids.splice(rng.int(0, ids.length), 0, rng.int(509, 510)); // special
    if (rng.next() < 0.5) ids.push(tok.eosTokenId!);
    const minTokens = rng.next() < 0.3 ? rng.int(0, 6) : 0;
    const keep = rng.next() < 0.3;
    const ctx = `seed ${seed} case ${c}: text ${JSON.stringify(text)} stops ${
      JSON.stringify(stops)
    } minTokens ${minTokens} includeStopStrInOutput ${keep}`;

    // Streamed text after each token (the detokenizer's deltas), for the references.
    const detok = new IncrementalDetokenizer(tok, { skipSpecialTokens: true, promptIds: PROMPT });
    const streamedAt = [""];
    for (const id of ids) streamedAt.push(streamedAt[streamedAt.length - 1]! + detok.push(id));
    const full = fullDecode(tok, ids);
    assert.equal(streamedAt[ids.length]! + detok.finish(), full, ctx);
    const from = streamedAt[Math.max(0, Math.min(minTokens, ids.length + 1) - 1)]?.length ??
      full.length;
    const match = referenceMatch(full, stops, minTokens > ids.length ? full.length : from);
    const cut = match === null ? full.length : keep ? match.end : match.start;
    const expectedText = full.slice(0, cut);
    // The token that completed the match: the first whose streamed text reaches its end.
    let stopToken = ids.length;
    if (match !== null) {
      stopToken = streamedAt.findIndex((s) => s.length >= match.end);
      if (stopToken < 0) stopToken = ids.length; // completed by the final flush
    }

    const p = samplingParams({
      stop: stops,
      minTokens,
      logprobs: c % 2 === 0 ? null : 1,
      includeStopStrInOutput: keep,
    });
    const state = new RequestOutputState(tok, {
      requestId: "r1",
      promptTokenIds: PROMPT,
      params: p,
    });
    const outputs: RequestOutput[] = [];
    let emitted = "";
    let fed = 0;
    let stopString: string | null = null;
    while (fed < ids.length && stopString === null) {
      const chunk = ids.slice(fed, fed + rng.int(1, 4));
      fed += chunk.length;
      const r = state.push(chunk, p.logprobs === null ? null : chunk.map(lp));
      stopString = r.stopString;
      if (r.output !== null) {
        outputs.push(r.output);
        emitted += r.output.text;
      }
      if (stopString === null) {
        // Exactly the streamed text minus the longest possible start of a stop string (none
        // with includeStopStrInOutput: the stop string would be emitted anyway).
        const streamed = streamedAt[fed]!;
        const hold = keep ? 0 : referenceHold(streamed, stops);
        assert.equal(emitted, streamed.slice(0, streamed.length - hold), `${ctx} after ${fed}`);
      }
      if (match !== null) assert(emitted.length <= cut, `${ctx}: text past the cut emitted`);
    }
    const final = stopString !== null
      ? state.finish("stop", stopString)
      : state.finish("length", null);
    outputs.push(final);
    checkStream(outputs, p, ctx);
    assert.equal(outputs.map((o) => o.text).join(""), expectedText, ctx);
    assert.deepEqual(outputs.flatMap((o) => [...o.tokenIds]), ids.slice(0, stopToken), ctx);
    if (match !== null) {
      matched++;
      assert.equal(final.finishReason, "stop", ctx);
      assert.equal(final.stopReason, match.stop, ctx);
    } else {
      assert.equal(final.finishReason, "length", ctx);
    }
  }
  assert(matched > 400, `seed ${seed}: only ${matched} of 1500 cases matched a stop string`);
});
