import { AssertionError } from "node:assert";
import assert, { throws as assertThrows } from "node:assert/strict";
import {
  LogitsProcess,
  type LogitsProcessParams,
  type LogitsProcessRecord,
  packLogitsProcess,
  packLogitsProcessRecords,
} from "../kernels/logits_process.ts";
import { sampledRef } from "../kernels/token_feed.ts";
import type { GpuContext } from "../gpu/context.ts";
import { assertClose } from "./support/assert_close.ts";
import {
  GPU_TEST,
  ParamArena,
  poisonedU32,
  readF32,
  readU32,
  runPass,
  testContext,
  upload,
  whole,
} from "./support/gpu.ts";
import { type Rng, testSeed } from "./support/random.ts";
import { logitsProcessRef, type LogitsProcessRefSeq } from "./reference/logits_process.ts";

const QWEN_VOCAB = 151936;
/** f32 arithmetic on a handful of values per logit: normwise relative error. */
const TOL = 1e-6;

/** Runs `logits_process` in place on a copy of `logits`; the scratch table starts poisoned. */
async function runProcess(
  ctx: GpuContext,
  logits: Float32Array,
  vocab: number,
  params: readonly LogitsProcessParams[],
  sampled: Uint32Array,
): Promise<Float32Array> {
  const packed = packLogitsProcess(params);
  const arena = new ParamArena(ctx, 2);
  const buffers = [
    upload(ctx, logits, "logits"),
    upload(ctx, packed.params, "params"),
    upload(ctx, packed.tokens, "tokens"),
    upload(ctx, packed.bias, "bias"),
    upload(ctx, sampled, "sampled"),
    poisonedU32(ctx, packed.tableWords, "table"),
  ] as const;
  try {
    const [logitsBuf, paramsBuf, tokensBuf, biasBuf, sampledBuf, tableBuf] = buffers;
    const op = new LogitsProcess(ctx).bind(arena, {
      logits: whole(logitsBuf),
      params: whole(paramsBuf),
      tokens: whole(tokensBuf),
      bias: whole(biasBuf),
      sampled: whole(sampledBuf),
      table: whole(tableBuf),
    });
    await runPass(ctx, arena, (pass) => op.encode(pass, params.length, vocab));
    return await readF32(ctx, logitsBuf, logits.length);
  } finally {
    for (const b of buffers) b.destroy();
    arena.destroy();
  }
}

/** The reference view of `p`: sampled references resolved (past the end: token 0). */
function refSeq(p: LogitsProcessParams, sampled: Uint32Array): LogitsProcessRefSeq {
  const resolve = (t: number) => t >= 0x80000000 ? (sampled[t - 0x80000000] ?? 0) : t;
  return {
    repetition: p.repetitionPenalty ?? 1,
    presence: p.presencePenalty ?? 0,
    frequency: p.frequencyPenalty ?? 0,
    prompt: Array.from(p.promptTokens ?? [], resolve),
    output: Array.from(p.outputTokens ?? [], resolve),
    bias: [...(p.logitBias ?? [])],
  };
}

/**
 * `n` token ids drawn from a small pool (so there are many duplicates), a share of them written
 * as references to `sampled` entries.
 */
function tokenList(rng: Rng, n: number, pool: readonly number[], sampled: Uint32Array): number[] {
  return Array.from({ length: n }, () => {
    if (rng.next() < 0.25) return sampledRef(rng.int(0, sampled.length - 1));
    return pool[rng.int(0, pool.length - 1)]!;
  });
}

/** Checks `got` against the reference: normwise, and bit-identical where nothing applies. */
function check(
  got: Float32Array,
  logits: Float32Array,
  want: Float64Array,
  context: string,
): void {
  assertClose(got, want, TOL, context);
  for (let i = 0; i < got.length; i++) {
    if (want[i] === logits[i] && got[i] !== logits[i]) {
      throw new AssertionError({
        message: `${context}: untouched logit [${i}] changed from ${logits[i]} to ${got[i]}`,
      });
    }
  }
}

/** A batch covering each feature alone, combined, and off, over `vocab` tokens. */
function makeBatch(rng: Rng, vocab: number, sampled: Uint32Array): LogitsProcessParams[] {
  const pool = (n: number) => Array.from({ length: n }, () => rng.int(0, vocab - 1));
  const small = pool(40);
  const list = (n: number, p = small) => tokenList(rng, n, p, sampled);
  const bias = (n: number): [number, number][] =>
    [...new Set(pool(n))].map((t) => [t, rng.uniform(-10, 10)]);
  return [
    {}, // everything off
    { promptTokens: list(50), outputTokens: list(30) }, // lists but every penalty off
    { logitBias: bias(20) },
    { repetitionPenalty: 1.3, promptTokens: list(200), outputTokens: list(60) },
    { repetitionPenalty: 0.75, promptTokens: list(17) },
    { presencePenalty: rng.uniform(0.2, 1.5), promptTokens: list(100), outputTokens: list(90) },
    { frequencyPenalty: rng.uniform(0.1, 1), outputTokens: list(300) },
    { frequencyPenalty: -0.5, presencePenalty: -0.25, outputTokens: list(33) }, // negative: boost
    {
      repetitionPenalty: 1.2,
      presencePenalty: 0.6,
      frequencyPenalty: 0.4,
      promptTokens: list(700, pool(300)),
      outputTokens: list(256, pool(120)),
      logitBias: bias(10).concat(small.slice(0, 3).map((t) => [t, 2.5])).filter(
        (e, i, a) => a.findIndex((f) => f[0] === e[0]) === i,
      ),
    },
    // One token repeated many times, plus ids past the vocabulary (ignored).
    {
      repetitionPenalty: 1.5,
      presencePenalty: 0.5,
      frequencyPenalty: 0.25,
      promptTokens: [vocab + 5, ...Array(64).fill(small[0]!)],
      outputTokens: [...Array(129).fill(small[0]!), vocab, 0x7fffffff, small[1]!],
      logitBias: [[vocab + 1, 100]],
    },
    // A long prompt of distinct tokens and a sampled reference past the end of `sampled`.
    {
      repetitionPenalty: 1.1,
      frequencyPenalty: 0.3,
      promptTokens: pool(3000),
      outputTokens: [...list(100), sampledRef(sampled.length + 7)],
    },
    { repetitionPenalty: 1.4, presencePenalty: 1, frequencyPenalty: 1 }, // penalties, no tokens
  ];
}

for (const vocab of [1000, QWEN_VOCAB]) {
  Deno.test(
    `logits_process() matches the float64 reference for each penalty alone and combined, vocab ${vocab}`,
    GPU_TEST,
    async () => {
      const ctx = await testContext();
      const { seed, rng } = testSeed(`logits_process ${vocab}`);
      const sampled = Uint32Array.from({ length: 64 }, () => rng.int(0, vocab - 1));
      const params = makeBatch(rng, vocab, sampled);
      const logits = rng.normals(params.length * vocab, 3);
      const got = await runProcess(ctx, logits, vocab, params, sampled);
      const want = logitsProcessRef(logits, vocab, params.map((p) => refSeq(p, sampled)));
      for (let s = 0; s < params.length; s++) {
        const rows = [s * vocab, (s + 1) * vocab] as const;
        check(
          got.subarray(...rows),
          logits.subarray(...rows),
          want.subarray(...rows),
          `seed ${seed} vocab ${vocab} row ${s} ${JSON.stringify(params[s]).slice(0, 120)}`,
        );
      }
      // Rows 0 and 1 (everything off) are bit-identical as a whole.
      for (let i = 0; i < 2 * vocab; i++) {
        if (got[i] !== logits[i]) {
          throw new AssertionError({ message: `seed ${seed}: row with all off changed at ${i}` });
        }
      }
    },
  );
}

Deno.test(
  "logits_process() counts duplicates across ids and sampled references exactly",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("logits_process duplicates");
    const vocab = 50;
    const sampled = Uint32Array.of(7, 7, 9, 3);
    // Token 7: once in the prompt, 3 times in the output (1 id, 2 references) -> count 3.
    // Token 9: only in the output through a reference -> count 1. Token 3: prompt only.
    const params: LogitsProcessParams[] = [{
      repetitionPenalty: 2,
      presencePenalty: 1,
      frequencyPenalty: 0.5,
      promptTokens: [7, 3, 3, sampledRef(3)],
      outputTokens: [sampledRef(0), 7, sampledRef(1), sampledRef(2)],
    }];
    const logits = rng.array(vocab, 1, 2); // positive: the penalty divides
    logits[3] = -1.5; // negative: the penalty multiplies
    const got = await runProcess(ctx, logits, vocab, params, sampled);
    const expect = Float64Array.from(logits);
    expect[7] = logits[7]! / 2 - 0.5 * 3 - 1;
    expect[9] = logits[9]! / 2 - 0.5 - 1;
    expect[3] = -3;
    check(got, logits, expect, `seed ${seed}`);
  },
);

/** One row of the multi-step append test: its penalties, bias and whole token history. */
interface HistoryRow {
  readonly repetition: number;
  readonly presence: number;
  readonly frequency: number;
  readonly bias: [number, number][];
  readonly prompt: number[];
  /** Every output token the row will have by the last step. */
  readonly output: number[];
  /** Output tokens at step 0; appending rows gain one per step (by the append). */
  readonly outputLen0: number;
  readonly appends: boolean;
}

/** Rows with and without penalties, bias, history and append, over `vocab` tokens. */
function historyRows(rng: Rng, vocab: number, steps: number): HistoryRow[] {
  const small = Array.from({ length: 24 }, () => rng.int(0, vocab - 1));
  const pick = () => small[rng.int(0, small.length - 1)]!;
  const list = (n: number) => Array.from({ length: n }, pick);
  const bias = (n: number): [number, number][] =>
    [...new Set(list(n))].map((t) => [t, rng.uniform(-10, 10)]);
  const off = { repetition: 1, presence: 0, frequency: 0 };
  const row = (r: Partial<HistoryRow> & { outputLen0: number; appends: boolean }) => ({
    ...off,
    bias: [],
    prompt: [],
    output: list(r.outputLen0 + (r.appends ? steps : 0)),
    ...r,
  });
  return [
    row({ outputLen0: 0, appends: false }), // everything off
    row({ bias: bias(12), outputLen0: 0, appends: false }),
    // A prefill step first (no output yet: nothing appended), then one append per step.
    row({ repetition: 1.3, prompt: list(40), outputLen0: 0, appends: true }),
    row({ repetition: 0.8, frequency: 0.4, prompt: list(9), outputLen0: 1, appends: true }),
    // Repetition off: the prompt is kept but not counted.
    row({
      presence: rng.uniform(0.2, 1.5),
      frequency: rng.uniform(0.1, 1),
      prompt: list(70),
      outputLen0: 30,
      appends: true,
      bias: bias(5),
    }),
    { // an output token past the vocabulary (kept, ignored)
      ...off,
      repetition: 1.5,
      presence: 0.5,
      frequency: 0.25,
      bias: [],
      prompt: [vocab + 5, ...list(20)],
      output: [...list(12), vocab + 2, ...list(steps - 1)],
      outputLen0: 13,
      appends: true,
    },
    // Penalties off with a history: the append still happens, nothing changes.
    row({ prompt: list(8), outputLen0: 3, appends: true }),
    // Penalties, no append (a list written by the host).
    row({ frequency: 0.7, prompt: list(15), outputLen0: 25, appends: false }),
  ];
}

Deno.test(
  "logits_process() appends each row's newest output token from the input ids and matches the float64 reference step after step",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("logits_process append");
    const vocab = 997; // odd
    const steps = 4;
    const cap = 256; // history words per row
    const numIds = 64;
    const rows = historyRows(rng, vocab, steps);
    // The host's view of the history buffer: prompt, then the outputs before the first append;
    // everything else poisoned.
    const history = new Uint32Array(rows.length * cap).fill(0xdeadbeef);
    rows.forEach((r, i) => {
      const known = r.appends ? Math.max(0, r.outputLen0 - 1) : r.outputLen0;
      history.set([...r.prompt, ...r.output.slice(0, known)], i * cap);
    });
    const arena = new ParamArena(ctx, 2 * steps);
    const tokens = upload(ctx, history, "history");
    const table = poisonedU32(ctx, rows.length * 4 * cap, "table");
    const own: GPUBuffer[] = [tokens, table];
    try {
      for (let step = 0; step < steps; step++) {
        const context = `seed ${seed} step ${step}`;
        // The step's input ids: noise, and each appending row's newest output at its last index.
        const ids = Uint32Array.from({ length: numIds }, () => rng.int(0, vocab + 20));
        const at = rng.permutation(numIds);
        const records: LogitsProcessRecord[] = [];
        const bias: number[] = [];
        const f32 = new Float32Array(1);
        const bits = new Uint32Array(f32.buffer);
        let tableOffset = 0;
        rows.forEach((r, i) => {
          const outputLen = r.outputLen0 + (r.appends ? step : 0);
          const append = r.appends && outputLen >= 1;
          if (append) {
            ids[at[i]!] = r.output[outputLen - 1]!;
            history[i * cap + r.prompt.length + outputLen - 1] = r.output[outputLen - 1]!;
          }
          records.push({
            repetition: r.repetition,
            presence: r.presence,
            frequency: r.frequency,
            promptOffset: i * cap,
            promptLen: r.prompt.length,
            outputOffset: i * cap + r.prompt.length,
            outputLen,
            biasOffset: bias.length / 2,
            biasLen: r.bias.length,
            tableOffset,
            append: append ? sampledRef(at[i]!) : null,
          });
          for (const [t, b] of r.bias) {
            f32[0] = b;
            bias.push(t, bits[0]!);
          }
          tableOffset += 4 * (r.prompt.length + outputLen);
        });
        const logits = rng.normals(rows.length * vocab, 3);
        const bufs = [
          upload(ctx, logits, "logits"),
          upload(ctx, packLogitsProcessRecords(records), "params"),
          upload(ctx, Uint32Array.from(bias.length > 0 ? bias : [0, 0]), "bias"),
          upload(ctx, ids, "ids"),
        ] as const;
        own.push(...bufs);
        const op = new LogitsProcess(ctx).bind(arena, {
          logits: whole(bufs[0]),
          params: whole(bufs[1]),
          tokens: whole(tokens),
          bias: whole(bufs[2]),
          sampled: whole(bufs[3]),
          table: whole(table),
        });
        await runPass(ctx, arena, (pass) => op.encode(pass, rows.length, vocab));
        const got = await readF32(ctx, bufs[0], logits.length);
        const want = logitsProcessRef(
          logits,
          vocab,
          rows.map((r, i) => ({
            ...r,
            output: r.output.slice(0, records[i]!.outputLen),
            bias: r.bias,
          })),
        );
        for (let i = 0; i < rows.length; i++) {
          const span = [i * vocab, (i + 1) * vocab] as const;
          const row = `${context} row ${i}`;
          check(got.subarray(...span), logits.subarray(...span), want.subarray(...span), row);
        }
        // The appended tokens landed, and nothing else of the history changed.
        assert.deepEqual(await readU32(ctx, tokens, history.length), history, context);
      }
    } finally {
      for (const b of own) b.destroy();
      arena.destroy();
    }
  },
);

Deno.test("packLogitsProcess() rejects invalid parameters", () => {
  const bad: LogitsProcessParams[] = [
    { repetitionPenalty: 0 },
    { repetitionPenalty: NaN },
    { presencePenalty: Infinity },
    { frequencyPenalty: NaN },
    { logitBias: [[5, 1], [5, 2]] },
    { logitBias: [[5, NaN]] },
    { logitBias: [[0x80000000, 1]] },
    { repetitionPenalty: 1.1, promptTokens: [1.5] },
    { presencePenalty: 1, outputTokens: [-1] },
  ];
  for (const p of bad) assertThrows(() => packLogitsProcess([p]), RangeError, JSON.stringify(p));
  const packed = packLogitsProcess([{}, { logitBias: [[1, 1]] }, { promptTokens: [1, 2] }]);
  if (packed.active !== 1 || packed.tokens.length !== 1 || packed.tableWords !== 1) {
    throw new AssertionError({ message: `unexpected packing ${JSON.stringify(packed)}` });
  }
});
