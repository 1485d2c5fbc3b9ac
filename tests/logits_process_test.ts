import { AssertionError } from "node:assert";
import { throws as assertThrows } from "node:assert/strict";
import {
  LogitsProcess,
  type LogitsProcessParams,
  packLogitsProcess,
} from "../kernels/logits_process.ts";
import { sampledRef } from "../kernels/token_feed.ts";
import type { GpuContext } from "../gpu/context.ts";
import { assertClose } from "./support/assert_close.ts";
import {
  GPU_TEST,
  ParamArena,
  poisonedU32,
  readF32,
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
