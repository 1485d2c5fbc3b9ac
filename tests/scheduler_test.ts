import { deepStrictEqual as assertEquals, ok as assert, throws } from "node:assert/strict";
import { ContinuousScheduler, type ContinuousSchedulerConfig } from "../scheduler/scheduler.ts";
import { DynamicScheduler } from "../scheduler/dynamic_scheduler.ts";
import { StaticScheduler } from "../scheduler/static_scheduler.ts";
import { driveToCompletion, MockExecutor, mockTokenAt } from "../engine/executors/mock_executor.ts";
import { type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import type { Scheduler } from "../scheduler/scheduler_api.ts";
import { SAMPLED_TOKEN, type SchedulerOutput } from "../scheduler/scheduler_output.ts";
import type { Sequence } from "../scheduler/sequence.ts";

/** Asserts that `fn` throws an `type` whose message contains `text`. */
function assertThrows(fn: () => unknown, type: ErrorConstructor, text: string): void {
  throws(fn, (e: unknown) => e instanceof type && e.message.includes(text));
}

/** The fake model: the token sampled for request `id` at sequence position `p`. */
const tokenAt = (id: string, p: number): number => mockTokenAt(id, p);

/** Outputs of request `id` run alone: the fake model's tokens until a stop condition. */
function aloneOutputs(id: string, promptLen: number, p: SamplingParams, eos: number[]): number[] {
  const out: number[] = [];
  for (;;) {
    const t = tokenAt(id, promptLen + out.length);
    out.push(t);
    const stopOk = out.length >= p.minTokens;
    if (stopOk && !p.ignoreEos && eos.includes(t)) return out;
    if (stopOk && p.stopTokenIds.includes(t)) return out;
    if (out.length >= (p.maxTokens ?? Infinity)) return out;
  }
}

/** A scheduler and a checking mock executor over the same pool, plus the prompts. */
class Harness<S extends Scheduler> {
  readonly prompts = new Map<string, number[]>();
  readonly params = new Map<string, SamplingParams>();
  readonly exec: MockExecutor;
  constructor(
    readonly sched: S,
    numBlocks: number,
    blockSize: number,
    numSwapBlocks = 0,
    readonly eos: number[] = [],
  ) {
    this.exec = new MockExecutor({
      tokenAt,
      kv: {
        numBlocks,
        blockSize,
        numSwapBlocks,
        truth: (id, p) => {
          const prompt = this.prompts.get(id)!;
          return p < prompt.length ? prompt[p]! : tokenAt(id, p);
        },
      },
    });
  }

  add(id: string, prompt: number[], params: Partial<SamplingParams> = {}, priority = 0): Sequence {
    this.prompts.set(id, prompt);
    this.params.set(id, samplingParams(params));
    return this.sched.addRequest({ requestId: id, promptTokenIds: prompt, params, priority });
  }

  /** One synchronous step: schedule, execute, update. */
  step(): SchedulerOutput {
    const out = this.sched.schedule();
    this.sched.updateFromOutput(out, this.exec.run(out));
    return out;
  }

  /** Runs to completion; checks every finished request's outputs against running alone. */
  finish(async = true, onStep?: (o: SchedulerOutput) => void): Map<string, number[]> {
    const outputs = new Map<string, number[]>();
    for (const id of this.prompts.keys()) {
      const s = this.sched.getRequest(id);
      if (s !== undefined) outputs.set(id, [...s.outputTokenIds]);
    }
    for (const u of driveToCompletion(this.sched, this.exec, { async, onStep, maxSteps: 10_000 })) {
      outputs.get(u.requestId)!.push(...u.newTokenIds);
    }
    for (const [id, got] of outputs) {
      const want = aloneOutputs(id, this.prompts.get(id)!.length, this.params.get(id)!, this.eos);
      assertEquals(got, want, `request ${id}: outputs differ from running alone`);
    }
    return outputs;
  }
}

function range(lo: number, n: number): number[] {
  return Array.from({ length: n }, (_, i) => lo + i);
}

function summary(out: SchedulerOutput): [string, number, number, boolean][] {
  return out.scheduled.map((r) => [r.requestId, r.numTokens, r.positionStart, r.samplesToken]);
}

function continuous(config: Partial<ContinuousSchedulerConfig> = {}): ContinuousScheduler {
  return new ContinuousScheduler({
    maxNumBatchedTokens: 64,
    maxNumSeqs: 8,
    maxModelLen: 64,
    blockSize: 4,
    numGpuBlocks: 64,
    ...config,
  });
}

Deno.test("schedule() runs decodes first, then chunks a prompt larger than the budget", () => {
  const h = new Harness(continuous({ maxNumBatchedTokens: 8 }), 64, 4);
  h.add("a", range(1, 3), { maxTokens: 4 });
  h.add("b", range(10, 20), { maxTokens: 2 });
  assertEquals(summary(h.step()), [["a", 3, 0, true], ["b", 5, 0, false]]);
  const s2 = h.step();
  assertEquals(summary(s2), [["a", 1, 3, true], ["b", 7, 5, false]]);
  assertEquals(s2.scheduled[0]!.tokenIds, [tokenAt("a", 3)]);
  assertEquals(s2.scheduled[1]!.slotMapping, [9, 10, 11, 12, 13, 14, 15]);
  const s3 = h.step();
  assertEquals(summary(s3), [["a", 1, 4, true], ["b", 7, 12, false]]);
  assertEquals(s3.scheduled.map((r) => r.blockTable), [[0, 4], [1, 2, 3, 5, 6]]);
  assertEquals(s3.totalTokens, 8);
  assertEquals(summary(h.step()), [["a", 1, 5, true], ["b", 1, 19, true]]);
  const s5 = h.step();
  assertEquals(s5.finished, ["a"]);
  assertEquals(summary(s5), [["b", 1, 20, true]]);
  h.finish();
});

Deno.test("schedule() keeps at most maxNumSeqs running and admits in arrival order", () => {
  const h = new Harness(continuous({ maxNumSeqs: 2 }), 64, 4);
  for (const id of ["a", "b", "c"]) h.add(id, range(1, 4), { maxTokens: id === "a" ? 2 : 5 });
  assertEquals(summary(h.step()).map((r) => r[0]), ["a", "b"]);
  let cStart = -1;
  let aDone = -1;
  h.finish(false, (o) => {
    assert(o.scheduled.length <= 2, `step ${o.step}: ${o.scheduled.length} scheduled`);
    if (o.finished.includes("a")) aDone = o.step;
    if (cStart < 0 && o.scheduled.some((r) => r.requestId === "c")) cStart = o.step;
  });
  assert(aDone > 0 && cStart === aDone, `c starts at step ${cStart}, a reported at ${aDone}`);
});

Deno.test("without chunked prefill a prompt waits for a step with room for all of it", () => {
  assertThrows(
    () => continuous({ enableChunkedPrefill: false, maxNumBatchedTokens: 16, maxModelLen: 32 }),
    RangeError,
    "maxNumBatchedTokens (16) must be >= maxModelLen (32)",
  );
  const cfg = { enableChunkedPrefill: false, maxNumBatchedTokens: 16, maxModelLen: 16 };
  const h = new Harness(continuous(cfg), 64, 4);
  h.add("a", range(1, 10), { maxTokens: 3 });
  h.add("b", range(20, 10), { maxTokens: 3 });
  assertEquals(summary(h.step()), [["a", 10, 0, true]]);
  assertEquals(summary(h.step()), [["a", 1, 10, true], ["b", 10, 0, true]]);
  h.finish();
});

/** Three 3-token prompts filling a 6-block pool of 2-token blocks: decode 3 needs a block. */
function tightPool(config: Partial<ContinuousSchedulerConfig>, priorities = [0, 0, 0]) {
  const h = new Harness(
    continuous({ blockSize: 2, numGpuBlocks: 6, maxModelLen: 12, ...config }),
    6,
    2,
    config.numSwapBlocks ?? 0,
  );
  ["a", "b", "c"].forEach((id, i) =>
    h.add(id, range(10 * i + 1, 3), { maxTokens: 6 }, priorities[i])
  );
  h.step();
  h.step();
  return h;
}

Deno.test("running out of blocks preempts the latest arrival by recompute; it still completes", () => {
  const h = tightPool({});
  const s3 = h.step();
  assertEquals(s3.preempted, ["c"]);
  assertEquals(summary(s3), [["a", 1, 4, true], ["b", 1, 4, true]]);
  assertEquals(s3.scheduled.map((r) => r.blockTable), [[0, 1, 5], [2, 3, 4]]);
  const c = h.sched.getRequest("c")!;
  assertEquals([c.status, c.numComputedTokens, c.outputTokenIds.length], ["preempted", 0, 2]);
  assertEquals(h.sched.waiting[0], c);
  const outs = h.finish();
  assertEquals([...outs.values()].map((o) => o.length), [6, 6, 6]);
  assertEquals(h.sched.blockManager.numFreeBlocks, 6);
});

Deno.test("in swap mode the preempted request is swapped out, swapped back in, and completes", () => {
  const h = tightPool({ preemptionMode: "swap", numSwapBlocks: 4 });
  const s3 = h.step();
  assertEquals(s3.preempted, []);
  assertEquals(s3.swappedOut, [{
    requestId: "c",
    copies: [{ gpuBlock: 4, hostSlot: 0 }, { gpuBlock: 5, hostSlot: 1 }],
  }]);
  assertEquals(h.sched.swapped.map((s) => s.requestId), ["c"]);
  let swappedIn: SchedulerOutput["swappedIn"] = [];
  h.finish(true, (o) => {
    if (o.swappedIn.length > 0) swappedIn = o.swappedIn;
  });
  assertEquals(swappedIn.map((s) => [s.requestId, s.copies.map((c) => c.hostSlot)]), [["c", [
    0,
    1,
  ]]]);
  assertEquals(h.sched.blockManager.numFreeHostSlots, 4);
});

Deno.test("policy priority preempts the lowest priority first, and a waiting request preempts", () => {
  const h = tightPool({ policy: "priority" }, [1, 9, 1]);
  assertEquals(h.step().preempted, ["b"]);
  h.finish();

  const p = new Harness(continuous({ policy: "priority", maxNumSeqs: 2 }), 64, 4);
  p.add("a", range(1, 4), { maxTokens: 8 }, 5);
  p.add("b", range(1, 4), { maxTokens: 8 }, 5);
  p.step();
  p.add("c", range(50, 4), { maxTokens: 3 }, 0);
  const s2 = p.step();
  assertEquals(s2.preempted, ["b"]);
  assertEquals(summary(s2), [["a", 1, 4, true], ["c", 4, 0, true]]);
  p.finish();
});

Deno.test("abortRequest() frees blocks at once, leaves every queue and drops in-flight tokens", () => {
  const h = new Harness(continuous({ maxNumSeqs: 2 }), 64, 4);
  h.add("a", range(1, 9), { maxTokens: 20 });
  h.add("b", range(1, 5), { maxTokens: 20 });
  h.add("w", range(1, 5), { maxTokens: 20 });
  const s1 = h.sched.schedule();
  const t1 = h.exec.run(s1);
  assert(h.sched.abortRequest("a"));
  assert(h.sched.abortRequest("w"));
  assertEquals(h.sched.abortRequest("a"), false);
  assertEquals(h.sched.waiting.length + h.sched.running.length, 1);
  const bm = h.sched.blockManager;
  assertEquals(bm.numUsedBlocks, h.sched.getRequest("b")!.blockTable.length);
  const updates = h.sched.updateFromOutput(s1, t1);
  assertEquals(updates.map((u) => u.requestId), ["b"]);
  assertEquals(h.sched.schedule().aborted, ["a", "w"]);
  h.prompts.delete("a");
  h.prompts.delete("w");
  assert(h.sched.abortRequest("b"));
  assertEquals(bm.numUsedBlocks, 0);
  assertEquals(h.sched.hasUnfinishedRequests(), false);
});

Deno.test("schedule() lists a request in newRequests once, at its first step, not when it resumes", () => {
  const h = tightPool({});
  // tightPool ran two steps: all three were new in the first.
  const s3 = h.step();
  assertEquals([s3.preempted, s3.newRequests], [["c"], []]);
  const seen: [number, string[]][] = [];
  h.add("d", range(90, 3), { maxTokens: 2 });
  h.finish(true, (o) => {
    if (o.newRequests.length > 0) seen.push([o.step, o.newRequests.map((n) => n.requestId)]);
    for (const n of o.newRequests) {
      assertEquals(n.promptTokenIds, h.prompts.get(n.requestId));
      assert(n.params === o.scheduled.find((r) => r.requestId === n.requestId)!.params);
    }
  });
  // c resumes by recompute (isNew again) without being listed again; d is listed once.
  assertEquals(seen.map(([, ids]) => ids), [["d"]]);
});

Deno.test("schedule() reports ended ids once, also of requests never scheduled", () => {
  const cfg = { batchSize: 2, maxModelLen: 16, blockSize: 4, numGpuBlocks: 8 };
  const h = new Harness(new StaticScheduler({ ...cfg, maxNumBatchedTokens: 64 }), 8, 4);
  h.add("a", range(1, 3), { maxTokens: 2 });
  h.add("b", range(1, 5), { maxTokens: 1 });
  h.add("w", range(1, 4), { maxTokens: 2 });
  const s1 = h.step();
  assertEquals(s1.newRequests.map((n) => n.requestId), ["a", "b"]);
  assert(h.sched.abortRequest("w"));
  h.prompts.delete("w");
  const s2 = h.step();
  assertEquals([s2.newRequests, s2.finished, s2.aborted], [[], ["b"], ["w"]]);
  const s3 = h.step();
  assertEquals([s3.finished, s3.aborted], [["a"], []]);
  assertEquals([h.step().finished, h.sched.hasUnfinishedRequests()], [[], false]);
});

Deno.test("a request with bad words waits for its last token on the host; a plain one runs ahead", () => {
  const h = new Harness(continuous(), 64, 4);
  h.add("plain", range(1, 3), { maxTokens: 5 });
  h.add("bad", range(10, 3), { maxTokens: 5, badWords: ["no"] });
  const s1 = h.sched.schedule();
  const t1 = h.exec.run(s1);
  assertEquals(summary(s1), [["plain", 3, 0, true], ["bad", 3, 0, true]]);
  // Step 1's tokens are not back: only the plain request decodes on a placeholder.
  const s2 = h.sched.schedule();
  const t2 = h.exec.run(s2);
  assertEquals(summary(s2), [["plain", 1, 3, true]]);
  h.sched.updateFromOutput(s1, t1);
  // Its token is known now: the bad-words request runs again.
  const s3 = h.sched.schedule();
  assertEquals(summary(s3).map((r) => r[0]).sort(), ["bad", "plain"]);
  h.sched.updateFromOutput(s2, t2);
  h.sched.updateFromOutput(s3, h.exec.run(s3));
});

Deno.test("async scheduling feeds placeholders and resolves them in step order", () => {
  const h = new Harness(continuous(), 64, 4);
  h.add("a", range(1, 3), { maxTokens: 5 });
  const s1 = h.sched.schedule();
  h.exec.run(s1);
  const s2 = h.sched.schedule();
  const t2 = h.exec.run(s2);
  assertEquals(summary(s2), [["a", 1, 3, true]]);
  assertEquals(s2.scheduled[0]!.tokenIds, [SAMPLED_TOKEN]);
  assertEquals([s2.scheduled[0]!.sampledFrom, s2.scheduled[0]!.sampleRow], [
    { step: 1, row: 0 },
    0,
  ]);
  const a = h.sched.getRequest("a")!;
  assertEquals([a.numPlaceholders, a.numTokens, a.numComputedTokens], [2, 5, 4]);
  assertThrows(() => h.sched.updateFromOutput(s2, t2), RangeError, "step 1 is the next");
  assertThrows(() => h.sched.updateFromOutput(s1, new Map()), RangeError, "none was given");
  const h2 = new Harness(continuous(), 64, 4);
  h2.add("a", range(1, 3), { maxTokens: 5 });
  const u1 = h2.sched.schedule();
  const v1 = h2.exec.run(u1);
  const u2 = h2.sched.schedule();
  const v2 = h2.exec.run(u2);
  h2.sched.updateFromOutput(u1, v1);
  const a2 = h2.sched.getRequest("a")!;
  assertEquals([a2.numPlaceholders, [...a2.outputTokenIds]], [1, [tokenAt("a", 3)]]);
  const u3 = h2.sched.schedule();
  assertEquals(summary(u3), [["a", 1, 4, true]]);
  assertEquals(u3.scheduled[0]!.tokenIds, [SAMPLED_TOKEN]);
  h2.sched.updateFromOutput(u2, v2);
  h2.sched.updateFromOutput(u3, h2.exec.run(u3));
  h2.finish();
});

Deno.test("stop checks: EOS, ignore_eos, min_tokens, stop ids, stop strings, max_tokens", () => {
  const eos = tokenAt("e", 6);
  const h = new Harness(continuous({ eosTokenIds: [eos] }), 64, 4, 0, [eos]);
  const e = h.add("e", range(1, 4), { maxTokens: 10 });
  const x = h.add("x", range(1, 4), { maxTokens: 10, ignoreEos: true });
  const s = h.add("s", range(1, 4), { maxTokens: 10, stopTokenIds: [tokenAt("s", 5)] });
  const m = h.add("m", range(1, 4), { maxTokens: 10, minTokens: 10 });
  const t = h.add("t", range(1, 4), { maxTokens: 10 });
  h.step();
  assert(h.sched.finishRequest("t", "stop", "###"));
  h.prompts.delete("t");
  assertEquals(h.step().finished, ["t"]);
  h.finish();
  const got = (q: Sequence) => [q.finishReason, q.stopReason, q.outputTokenIds.length];
  assertEquals(got(e), ["stop", null, 3]);
  assertEquals(got(s), ["stop", tokenAt("s", 5), 2]);
  assertEquals(got(x), ["length", null, 10]);
  assertEquals(got(m), ["length", null, 10]);
  assertEquals(got(t), ["stop", "###", 1]);
});

Deno.test("addRequest() rejects requests that can never run", () => {
  const s = continuous({ maxModelLen: 32, blockSize: 2, numGpuBlocks: 8 });
  assertThrows(
    () => s.addRequest({ requestId: "a", promptTokenIds: range(1, 30), params: { maxTokens: 10 } }),
    RangeError,
    "prompt (30 tokens) + max_tokens (10) exceeds max_model_len 32",
  );
  assertThrows(
    () => s.addRequest({ requestId: "b", promptTokenIds: range(1, 15), params: { maxTokens: 3 } }),
    RangeError,
    "needs KV for 17 tokens, the cache holds 16",
  );
  assertThrows(() => s.addRequest({ requestId: "c", promptTokenIds: [] }), RangeError, "empty");
  assertThrows(
    () => s.addRequest({ requestId: "d", promptTokenIds: [1, 2], params: { maxTokens: null } }),
    RangeError,
    "needs KV for 31 tokens",
  );
  const big = continuous({ maxModelLen: 32, blockSize: 2, numGpuBlocks: 16 });
  const d = big.addRequest({ requestId: "d", promptTokenIds: [1, 2], params: { maxTokens: null } });
  assertEquals(d.maxTokens, 30);
  assertThrows(() => big.addRequest({ requestId: "d", promptTokenIds: [1] }), RangeError, "in use");
});

Deno.test("a request sharing a cached prefix skips its full blocks", () => {
  const h = new Harness(continuous(), 64, 4);
  h.add("a", range(1, 12), { maxTokens: 2 });
  h.step();
  h.add("b", range(1, 12), { maxTokens: 2 });
  const s2 = h.step();
  const b = s2.scheduled.find((r) => r.requestId === "b")!;
  assertEquals([b.isNew, b.numCachedTokens, b.positionStart, b.numTokens], [true, 8, 8, 4]);
  assertEquals(b.blockTable.slice(0, 2), [0, 1]);
  const st = h.sched.stats();
  assertEquals([st.prefixCacheQueries, st.prefixCacheHits], [24, 8]);
  h.finish();
});

Deno.test("static batching waits for a full batch, runs it to its longest request", () => {
  assertThrows(
    () =>
      new StaticScheduler({
        batchSize: 4,
        maxModelLen: 16,
        blockSize: 4,
        numGpuBlocks: 8,
        maxNumBatchedTokens: 64,
      }),
    RangeError,
    "need 16 KV blocks, the pool has 8",
  );
  const cfg = { batchSize: 2, maxModelLen: 16, blockSize: 4, numGpuBlocks: 8 };
  const h = new Harness(new StaticScheduler({ ...cfg, maxNumBatchedTokens: 64 }), 8, 4);
  h.add("a", range(1, 3), { maxTokens: 2 });
  assertEquals(h.step().scheduled.length, 0, "one request: the batch is not full");
  h.add("b", range(1, 5), { maxTokens: 5 });
  h.add("c", range(1, 4), { maxTokens: 2 });
  const s = h.step();
  assertEquals(s.scheduled.map((r) => [r.requestId, r.blockTable]), [
    ["a", [0, 1, 2, 3]],
    ["b", [4, 5, 6, 7]],
  ]);
  assertEquals(h.sched.stats().kvTokensAllocated, 32);
  assertEquals(h.sched.stats().kvTokensUsed, 8);
  for (let i = 0; i < 10; i++) {
    const o = h.step();
    assert(!o.scheduled.some((r) => r.requestId === "c"), `c joined at step ${o.step}`);
  }
  assertEquals(h.sched.stats().numWaiting, 1);
  h.sched.flush();
  assertEquals(h.step().scheduled.map((r) => [r.requestId, r.blockTable]), [["c", [0, 1, 2, 3]]]);
  h.finish();
  assertEquals((h.sched as StaticScheduler).batchesStarted, 2);
});

Deno.test("dynamic batching starts a batch when full or when the wait window closes", () => {
  let t = 0;
  const s = new DynamicScheduler({
    maxBatchSize: 3,
    batchWaitMs: 10,
    maxModelLen: 16,
    blockSize: 4,
    numGpuBlocks: 12,
    maxNumBatchedTokens: 64,
    now: () => t,
  });
  const h = new Harness(s, 12, 4);
  h.add("a", range(1, 3), { maxTokens: 2 });
  t = 5;
  assertEquals(h.step().scheduled.length, 0);
  assertEquals(s.wakeTime(), 10);
  t = 10;
  assertEquals(h.step().scheduled.map((r) => r.requestId), ["a"]);
  t = 11;
  for (const id of ["b", "c", "d"]) h.add(id, range(1, 3), { maxTokens: 2 });
  assertEquals(s.wakeTime(), null, "a batch is running");
  const started: string[][] = [];
  while (s.batchesStarted < 2) {
    const o = h.step();
    if (o.scheduled.some((r) => r.isNew)) started.push(o.scheduled.map((r) => r.requestId));
  }
  assertEquals(started, [["b", "c", "d"]], "a full batch starts at once at t=11");
  h.finish();
  t = 50;
  h.add("e", range(1, 3), { maxTokens: 2 });
  t = 59;
  assertEquals(h.step().scheduled.length, 0);
  t = 60;
  assertEquals(h.step().scheduled.map((r) => r.requestId), ["e"]);
  h.finish();
});

Deno.test("ContinuousScheduler keeps watermark blocks free when admitting new requests", () => {
  // 20 blocks of 4 tokens; watermark 0.25 keeps 5 blocks free for running requests to grow.
  const s = new ContinuousScheduler({
    maxNumBatchedTokens: 64,
    maxNumSeqs: 8,
    maxModelLen: 64,
    blockSize: 4,
    numGpuBlocks: 20,
    watermark: 0.25,
  });
  const params = samplingParams({ maxTokens: 4, ignoreEos: true });
  for (let i = 0; i < 4; i++) {
    s.addRequest({ requestId: `r${i}`, promptTokenIds: new Array(16).fill(i + 1), params });
  }
  // Each prompt needs 4 blocks: r0 (16 free after), r1 (12), r2 (8) are admitted; r3 would
  // leave 4 < 5 free and waits although it would fit.
  const out = s.schedule();
  assertEquals(out.scheduled.map((r) => r.requestId), ["r0", "r1", "r2"]);
  assertEquals(s.blockManager.numFreeBlocks, 8);
  // Alone, a request is admitted whatever the watermark.
  const lone = new ContinuousScheduler({
    maxNumBatchedTokens: 64,
    maxNumSeqs: 8,
    maxModelLen: 64,
    blockSize: 4,
    numGpuBlocks: 5,
    watermark: 0.8,
  });
  lone.addRequest({ requestId: "a", promptTokenIds: new Array(16).fill(1), params });
  assertEquals(lone.schedule().scheduled.map((r) => r.requestId), ["a"]);
  throws(
    () =>
      new ContinuousScheduler({
        maxNumBatchedTokens: 8,
        maxNumSeqs: 1,
        maxModelLen: 8,
        blockSize: 4,
        numGpuBlocks: 4,
        watermark: 1,
      }),
    RangeError,
  );
});
