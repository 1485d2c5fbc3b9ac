import assertModule, { deepStrictEqual as assertEquals, ok as assert } from "node:assert/strict";
import { ContinuousScheduler, type ContinuousSchedulerConfig } from "../scheduler/scheduler.ts";
import { StaticScheduler } from "../scheduler/static_scheduler.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import type { Scheduler } from "../scheduler/scheduler_api.ts";
import type { SchedulerOutput } from "../scheduler/scheduler_output.ts";
import { Sequence } from "../scheduler/sequence.ts";
import { fitRows, samplerRows } from "../scheduler/step_commit.ts";

/** Prompt tokens 100, 101, ... */
const prompt = (n: number, base = 100) => Array.from({ length: n }, (_, i) => base + i);

function continuous(config: Partial<ContinuousSchedulerConfig> = {}): ContinuousScheduler {
  return new ContinuousScheduler({
    maxNumBatchedTokens: 64,
    maxNumSeqs: 4,
    maxModelLen: 64,
    blockSize: 4,
    numGpuBlocks: 64,
    ...config,
  });
}

/** Per scheduled request: id, tokens, first scored token, targets, samples. */
function rows(out: SchedulerOutput): [string, number, number | null, number[], boolean][] {
  return out.scheduled.map((r) => [
    r.requestId,
    r.numTokens,
    r.promptLogprobs?.first ?? null,
    [...(r.promptLogprobs?.targets ?? [])],
    r.samplesToken,
  ]);
}

/** Sampler rows of a step: one per sampled token, one per scored prompt position. */
function stepRows(out: SchedulerOutput): number {
  let n = 0;
  for (const r of out.scheduled) {
    n += (r.samplesToken ? 1 : 0) + (r.promptLogprobs?.targets.length ?? 0);
  }
  return n;
}

/** Applies a step as if every sampling request drew token 7. */
function apply(s: Scheduler, out: SchedulerOutput): void {
  const sampled = new Map<string, number>();
  for (const r of out.scheduled) if (r.samplesToken) sampled.set(r.requestId, 7);
  s.updateFromOutput(out, sampled);
}

Deno.test("samplerRows() counts a sampled token and each scored prompt position", () => {
  const params = samplingParams({ promptLogprobs: 2 });
  const seq = new Sequence("a", prompt(10), params, 4, 0, 0, 0);
  // Positions 0..8 score the token after them; position 9 (the last) samples.
  assertEquals(samplerRows(seq, 0, 4), 4);
  assertEquals(samplerRows(seq, 0, 10), 10);
  assertEquals(samplerRows(seq, 8, 2), 2);
  const plain = new Sequence("b", prompt(10), samplingParams(), 4, 0, 0, 1);
  assertEquals(samplerRows(plain, 0, 4), 0);
  assertEquals(samplerRows(plain, 0, 10), 1);
  // Positions already scored (a recompute after a preemption) take no row again.
  seq.promptLogprobsUntil = 9;
  assertEquals(samplerRows(seq, 0, 9), 0);
  assertEquals(samplerRows(seq, 0, 10), 1);
});

Deno.test("fitRows() cuts a chunk of scored prompt positions to the rows left", () => {
  const seq = new Sequence("a", prompt(10), samplingParams({ promptLogprobs: 0 }), 4, 0, 0, 0);
  assertEquals(fitRows(seq, 0, 10, 10), 10);
  assertEquals(fitRows(seq, 0, 10, 9), 9); // 9 rows of positions 0..8, no sample yet
  assertEquals(fitRows(seq, 0, 10, 3), 3);
  assertEquals(fitRows(seq, 0, 10, 0), 0);
  assertEquals(fitRows(seq, 6, 4, 1), 1);
  const plain = new Sequence("b", prompt(10), samplingParams(), 4, 0, 0, 1);
  assertEquals(fitRows(plain, 0, 10, 1), 10);
  assertEquals(fitRows(plain, 0, 10, 0), 0);
  assertEquals(fitRows(plain, 0, 9, 0), 9); // mid-prompt: no row
  // Already scored up to position 9: a recompute of 0..8 needs no row.
  seq.promptLogprobsUntil = 9;
  assertEquals(fitRows(seq, 0, 10, 0), 9);
  assertEquals(fitRows(seq, 0, 10, 1), 10);
});

Deno.test(
  "ContinuousScheduler scores a prompt in chunks of the sampler rows when prompt_logprobs is set",
  () => {
    const s = continuous();
    s.addRequest({
      requestId: "a",
      promptTokenIds: prompt(10),
      params: samplingParams({ promptLogprobs: 3, maxTokens: 2 }),
    });
    const s1 = s.schedule();
    assertEquals(rows(s1), [["a", 4, 0, [101, 102, 103, 104], false]]);
    apply(s, s1);
    const s2 = s.schedule();
    assertEquals(rows(s2), [["a", 4, 0, [105, 106, 107, 108], false]]);
    assertEquals(s2.scheduled[0]!.positionStart, 4);
    assertEquals(s2.scheduled[0]!.promptLogprobs!.topLogprobs, 3);
    apply(s, s2);
    // Position 8 scores token 109; position 9 samples.
    const s3 = s.schedule();
    assertEquals(rows(s3), [["a", 2, 0, [109], true]]);
    apply(s, s3);
    const s4 = s.schedule();
    assertEquals(rows(s4), [["a", 1, null, [], true]]);
  },
);

Deno.test(
  "ContinuousScheduler leaves a sampler row to every running request behind a scored prompt",
  () => {
    const s = continuous();
    // Two requests decoding, then one scoring its prompt: 4 rows, 2 taken by the decodes.
    for (const id of ["x", "y"]) {
      s.addRequest({ requestId: id, promptTokenIds: prompt(3, 10), params: samplingParams() });
    }
    apply(s, s.schedule());
    s.addRequest({
      requestId: "a",
      promptTokenIds: prompt(9),
      params: samplingParams({ promptLogprobs: 1 }),
    });
    const out = s.schedule();
    assertEquals(rows(out), [
      ["x", 1, null, [], true],
      ["y", 1, null, [], true],
      ["a", 2, 0, [101, 102], false],
    ]);
    apply(s, out);
    // Running order x, y, a: each later step keeps a row for x and y while "a" scores 2
    // positions at a time.
    for (let step = 0; step < 4; step++) {
      const o = s.schedule();
      assert(stepRows(o) <= 4, `step rows ${stepRows(o)}`);
      assertEquals(o.scheduled.map((r) => r.requestId), ["x", "y", "a"]);
      apply(s, o);
    }
    // Every position of "a" but the last was scored exactly once, in order.
    const a = s.getRequest("a")!;
    assertEquals(a.promptLogprobsUntil, 8);
  },
);

Deno.test(
  "ContinuousScheduler keeps a row for a running request admitted behind a prompt being scored",
  () => {
    const s = continuous({ maxModelLen: 256, numGpuBlocks: 128 });
    s.addRequest({
      requestId: "a",
      promptTokenIds: prompt(20),
      params: samplingParams({ promptLogprobs: 0 }),
    });
    // "x" prefills mid-prompt chunks, which take no row, with the budget "a" leaves.
    s.addRequest({ requestId: "x", promptTokenIds: prompt(100, 1000), params: samplingParams() });
    const s1 = s.schedule();
    assertEquals(rows(s1).map((r) => r.slice(0, 2)), [["a", 4], ["x", 60]]);
    apply(s, s1);
    // "x" finishes its prompt and samples: "a" scores 3 positions, not 4.
    const s2 = s.schedule();
    assertEquals(rows(s2).map((r) => [...r.slice(0, 2), r[3].length, r[4]]), [
      ["a", 3, 3, false],
      ["x", 40, 0, true],
    ]);
  },
);

Deno.test(
  "ContinuousScheduler reads no cached prefix for a request with prompt_logprobs",
  () => {
    const s = continuous({ maxNumSeqs: 16 });
    const p = prompt(13);
    s.addRequest({
      requestId: "warm",
      promptTokenIds: p,
      params: samplingParams({ maxTokens: 1 }),
    });
    apply(s, s.schedule());
    s.schedule(); // the finished request leaves; its full blocks stay cached
    s.addRequest({ requestId: "plain", promptTokenIds: p, params: samplingParams() });
    s.addRequest({
      requestId: "scored",
      promptTokenIds: p,
      params: samplingParams({ promptLogprobs: 0 }),
    });
    const out = s.schedule();
    const by = new Map(out.scheduled.map((r) => [r.requestId, r]));
    assertEquals(by.get("plain")!.numCachedTokens, 12);
    assertEquals(by.get("plain")!.positionStart, 12);
    assertEquals(by.get("scored")!.numCachedTokens, 0);
    assertEquals(by.get("scored")!.positionStart, 0);
    assertEquals(by.get("scored")!.promptLogprobs!.targets, p.slice(1, 13));
  },
);

Deno.test(
  "ContinuousScheduler does not score a prompt again when it recomputes a preempted request",
  () => {
    // 5 blocks of 4 tokens: "b" and then "a" (8-token prompt, scored) grow until "a", the
    // latest arrival, is preempted.
    const s = continuous({ numGpuBlocks: 5, maxNumSeqs: 8 });
    s.addRequest({
      requestId: "b",
      promptTokenIds: prompt(8, 200),
      params: samplingParams({ maxTokens: 8, ignoreEos: true }),
    });
    s.addRequest({
      requestId: "a",
      promptTokenIds: prompt(8),
      params: samplingParams({ promptLogprobs: 0, maxTokens: 8, ignoreEos: true }),
    });
    const scored = new Map<number, number>();
    let preempted = false;
    for (let step = 0; step < 60 && s.hasUnfinishedRequests(); step++) {
      const out = s.schedule();
      if (out.preempted.includes("a")) preempted = true;
      for (const r of out.scheduled) {
        if (r.requestId !== "a" || !r.promptLogprobs) continue;
        r.promptLogprobs.targets.forEach((_, j) => {
          const p = r.positionStart + r.promptLogprobs!.first + j;
          scored.set(p, (scored.get(p) ?? 0) + 1);
        });
      }
      apply(s, out);
    }
    assert(preempted, "the test needs 'a' preempted");
    assertEquals([...scored.keys()].sort((x, y) => x - y), [0, 1, 2, 3, 4, 5, 6]);
    assert([...scored.values()].every((n) => n === 1), `scored twice: ${[...scored]}`);
    assertEquals(s.getRequest("a"), undefined);
  },
);

Deno.test("StaticScheduler keeps a batch's sampler rows within its batch size", () => {
  const s = new StaticScheduler({
    batchSize: 3,
    maxModelLen: 32,
    blockSize: 4,
    numGpuBlocks: 24,
    maxNumBatchedTokens: 64,
  });
  s.addRequest({
    requestId: "a",
    promptTokenIds: prompt(7),
    params: samplingParams({ promptLogprobs: 2, maxTokens: 2 }),
  });
  s.addRequest({ requestId: "b", promptTokenIds: prompt(5, 10), params: samplingParams() });
  s.addRequest({ requestId: "c", promptTokenIds: prompt(5, 20), params: samplingParams() });
  const s1 = s.schedule();
  // "a" may take 3 rows less one for each member after it.
  assertEquals(rows(s1), [
    ["a", 1, 0, [101], false],
    ["b", 5, null, [], true],
    ["c", 5, null, [], true],
  ]);
  apply(s, s1);
  const s2 = s.schedule();
  assertEquals(rows(s2)[0], ["a", 1, 0, [102], false]);
  let steps = 2;
  for (let out = s2; s.hasUnfinishedRequests() && steps < 40; steps++) {
    assert(stepRows(out) <= 3, `step rows ${stepRows(out)}`);
    apply(s, out);
    out = s.schedule();
  }
  assert(!s.hasUnfinishedRequests());
});

Deno.test(
  "ContinuousScheduler scores a prompt in chunks of maxSamplerRows when it exceeds maxNumSeqs",
  () => {
    // The runner's sampler holds 9 rows per step (sub-batches of the 4 logits rows).
    const s = continuous({ maxSamplerRows: 9 });
    s.addRequest({ requestId: "x", promptTokenIds: prompt(3, 10), params: samplingParams() });
    apply(s, s.schedule());
    s.addRequest({
      requestId: "a",
      promptTokenIds: prompt(12),
      params: samplingParams({ promptLogprobs: 1, maxTokens: 2 }),
    });
    // x decodes (one row), then "a" scores 8 positions: 9 rows.
    const s1 = s.schedule();
    assertEquals(rows(s1), [
      ["x", 1, null, [], true],
      ["a", 8, 0, [101, 102, 103, 104, 105, 106, 107, 108], false],
    ]);
    assertEquals(stepRows(s1), 9);
    apply(s, s1);
    // Positions 8..10 score 109..111, position 11 samples: 4 rows and x's.
    const s2 = s.schedule();
    assertEquals(rows(s2), [
      ["x", 1, null, [], true],
      ["a", 4, 0, [109, 110, 111], true],
    ]);
    apply(s, s2);
  },
);

Deno.test("ContinuousScheduler and StaticScheduler refuse fewer sampler rows than sequences", () => {
  assertModule.throws(() => continuous({ maxSamplerRows: 3 }), RangeError);
  assertModule.throws(
    () =>
      new StaticScheduler({
        batchSize: 3,
        maxModelLen: 32,
        blockSize: 4,
        numGpuBlocks: 24,
        maxNumBatchedTokens: 64,
        maxSamplerRows: 2,
      }),
    RangeError,
  );
});

Deno.test("StaticScheduler scores a prompt in chunks of maxSamplerRows", () => {
  const s = new StaticScheduler({
    batchSize: 2,
    maxModelLen: 32,
    blockSize: 4,
    numGpuBlocks: 16,
    maxNumBatchedTokens: 64,
    maxSamplerRows: 6,
  });
  s.addRequest({
    requestId: "a",
    promptTokenIds: prompt(9),
    params: samplingParams({ promptLogprobs: 0, maxTokens: 1 }),
  });
  s.addRequest({ requestId: "b", promptTokenIds: prompt(5, 10), params: samplingParams() });
  // "a" takes 6 rows less one for "b" after it.
  const s1 = s.schedule();
  assertEquals(rows(s1), [
    ["a", 5, 0, [101, 102, 103, 104, 105], false],
    ["b", 5, null, [], true],
  ]);
  apply(s, s1);
  const s2 = s.schedule();
  assertEquals(rows(s2)[0], ["a", 4, 0, [106, 107, 108], true]);
});
