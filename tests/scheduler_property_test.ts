import { AssertionError, deepStrictEqual as assertEquals } from "node:assert/strict";
import { ContinuousScheduler, type ContinuousSchedulerConfig } from "../scheduler/scheduler.ts";
import { MockExecutor, mockTokenAt } from "../engine/executors/mock_executor.ts";
import { type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import type { SchedulerOutput } from "../scheduler/scheduler_output.ts";
import { type Rng, testSeed } from "./support/random.ts";

const EOS = 100;

/** Outputs of request `id` run alone: the mock model's tokens until a stop condition. */
function aloneOutputs(id: string, promptLen: number, p: SamplingParams): number[] {
  const out: number[] = [];
  for (;;) {
    const t = mockTokenAt(id, promptLen + out.length);
    out.push(t);
    if (out.length >= p.minTokens && !p.ignoreEos && t === EOS) return out;
    if (out.length >= (p.maxTokens ?? Infinity)) return out;
  }
}

/** Throws an AssertionError (messages are built only on failure). */
function fail(message: string): never {
  throw new AssertionError({ message });
}

/** Every scheduler/block-manager invariant, checked after each schedule(). */
function checkInvariants(s: ContinuousScheduler, out: SchedulerOutput, ctx: string): void {
  const bm = s.blockManager;
  if (out.totalTokens > s.maxNumBatchedTokens) fail(`${ctx}: ${out.totalTokens} over budget`);
  let sum = 0;
  const ids = new Set<string>();
  for (const r of out.scheduled) {
    if (r.numTokens < 1 || ids.has(r.requestId)) fail(`${ctx}: bad entry ${r.requestId}`);
    ids.add(r.requestId);
    sum += r.numTokens;
  }
  if (sum !== out.totalTokens) fail(`${ctx}: totalTokens ${out.totalTokens}, sum ${sum}`);
  // Sampler rows: one per sampled token, one per scored prompt position (prompt_logprobs).
  let rows = 0;
  for (const r of out.scheduled) {
    rows += (r.samplesToken ? 1 : 0) + (r.promptLogprobs?.targets.length ?? 0);
  }
  if (rows > s.maxSamplerRows) fail(`${ctx}: ${rows} sampler rows`);
  const sampled = out.scheduled.filter((r) => r.samplesToken).length;
  if (sampled > s.maxNumSeqs) fail(`${ctx}: ${sampled} sampled rows`);
  if (s.running.length > s.maxNumSeqs) fail(`${ctx}: ${s.running.length} running`);
  const refs = new Int32Array(bm.numBlocks);
  const host = new Set<number>();
  const queues = [[s.running, "running"], [s.waiting, ""], [s.swapped, "swapped"]] as const;
  for (const [queue, status] of queues) {
    for (const q of queue) {
      if (status !== "" && q.status !== status) fail(`${ctx}: ${q.requestId} is ${q.status}`);
      if (status === "" && q.blockTable.length > 0) {
        fail(`${ctx}: waiting ${q.requestId} holds blocks`);
      }
      for (const b of q.blockTable) {
        if (q.blockTable.indexOf(b) !== q.blockTable.lastIndexOf(b)) {
          fail(`${ctx}: ${q.requestId} repeats block ${b}`);
        }
        refs[b]!++;
      }
      for (const h of q.hostSlots) {
        if (host.has(h)) fail(`${ctx}: host slot ${h} owned twice`);
        host.add(h);
      }
    }
  }
  let used = 0;
  for (let b = 0; b < bm.numBlocks; b++) {
    const r = refs[b]!;
    if (bm.refCount(b) !== r) {
      fail(`${ctx}: block ${b} has ref count ${bm.refCount(b)}, ${r} owners`);
    }
    if (r > 0) used++;
    if (r > 1 && bm.blockHash(b) === null) fail(`${ctx}: block ${b} shared but not cached`);
  }
  if (bm.numUsedBlocks !== used) fail(`${ctx}: ${bm.numUsedBlocks} used blocks, ${used} owned`);
  const free = [...bm.freeQueue(), ...bm.evictableQueue()];
  if (free.length + used !== bm.numBlocks) fail(`${ctx}: free + used != total`);
  if (!free.every((b) => refs[b] === 0)) fail(`${ctx}: a queued free block is owned`);
  if (host.size + bm.numFreeHostSlots !== bm.numSwapBlocks) fail(`${ctx}: host slots leaked`);
}

/** Drives `count` random requests through one configuration, async, with random aborts. */
function run(rng: Rng, seed: number, count: number, config: ContinuousSchedulerConfig): void {
  const s = new ContinuousScheduler({ ...config, eosTokenIds: [EOS] });
  const prompts = new Map<string, number[]>();
  const params = new Map<string, SamplingParams>();
  const outputs = new Map<string, number[]>();
  const cut = new Set<string>(); // aborted or stopped by a "stop string"
  /** Prompt positions scored per request (prompt_logprobs), in step order. */
  const scored = new Map<string, number[]>();
  const exec = new MockExecutor({
    tokenAt: mockTokenAt,
    kv: {
      numBlocks: config.numGpuBlocks,
      blockSize: config.blockSize,
      numSwapBlocks: config.numSwapBlocks ?? 0,
      truth: (id, p) => {
        const prompt = prompts.get(id)!;
        return p < prompt.length ? prompt[p]! : mockTokenAt(id, p);
      },
    },
  });
  const prefixes = Array.from(
    { length: 6 },
    () => Array.from({ length: rng.int(0, 24) }, () => rng.int(0, 999)),
  );
  let added = 0;
  let swaps = 0;
  let pending: { out: SchedulerOutput; sampled: Map<string, number> } | null = null;
  const live: string[] = [];
  const apply = (p: { out: SchedulerOutput; sampled: Map<string, number> }) => {
    for (const u of s.updateFromOutput(p.out, p.sampled)) {
      outputs.get(u.requestId)!.push(...u.newTokenIds);
    }
  };
  for (let step = 0; added < count || s.hasUnfinishedRequests() || pending !== null; step++) {
    const ctx = `seed ${seed}, ${s.policy}/${s.preemptionMode}, step ${step}`;
    if (step >= 200_000) fail(`${ctx}: no progress`);
    for (let k = rng.int(0, 3); k > 0 && added < count; k--) {
      const id = `r${added++}`;
      const prompt = [
        ...prefixes[rng.int(0, 5)]!,
        ...Array.from({ length: rng.int(1, 16) }, () => rng.int(0, 999)),
      ];
      const maxTokens = rng.int(1, Math.min(32, config.maxModelLen - prompt.length));
      const p = samplingParams({
        maxTokens,
        ignoreEos: rng.next() < 0.2,
        minTokens: rng.int(0, 2),
        promptLogprobs: rng.next() < 0.15 ? rng.int(0, 3) : null,
      });
      prompts.set(id, prompt);
      params.set(id, p);
      outputs.set(id, []);
      s.addRequest({ requestId: id, promptTokenIds: prompt, params: p, priority: rng.int(0, 3) });
      live.push(id);
    }
    if (live.length > 0 && rng.next() < 0.04) {
      const id = live[rng.int(0, live.length - 1)]!;
      if (rng.next() < 0.5 ? s.abortRequest(id) : s.finishRequest(id, "stop", "</s>")) cut.add(id);
    }
    const out = s.schedule();
    swaps += out.swappedOut.length;
    checkInvariants(s, out, ctx);
    for (const r of out.scheduled) {
      const pl = r.promptLogprobs;
      if (!pl) continue;
      const prompt = prompts.get(r.requestId)!;
      const seen = scored.get(r.requestId) ?? [];
      pl.targets.forEach((t, j) => {
        const position = r.positionStart + pl.first + j;
        if (t !== prompt[position + 1]) fail(`${ctx}: ${r.requestId} scores ${t} at ${position}`);
        seen.push(position);
      });
      scored.set(r.requestId, seen);
    }
    const sampled = exec.run(out);
    if (pending !== null) apply(pending);
    pending = { out, sampled };
    if (rng.next() < 0.3 || (!s.hasUnfinishedRequests() && added >= count)) {
      apply(pending);
      pending = null;
    }
    for (let i = live.length - 1; i >= 0; i--) {
      if (s.getRequest(live[i]!) === undefined) live.splice(i, 1);
    }
  }
  const bm = s.blockManager;
  const st = s.stats();
  const ctx = `seed ${seed}, ${s.policy}/${s.preemptionMode}`;
  if (st.numPreemptions === 0) fail(`${ctx}: the pool never ran out; the test is too easy`);
  if (s.preemptionMode === "swap" && swaps === 0) fail(`${ctx}: nothing was swapped`);
  if (bm.enablePrefixCaching && st.prefixCacheHits === 0) fail(`${ctx}: no prefix hit`);
  assertEquals(bm.numFreeBlocks, bm.numBlocks, `seed ${seed}: blocks leaked`);
  for (let b = 0; b < bm.numBlocks; b++) {
    assertEquals(bm.refCount(b), 0, `seed ${seed}: block ${b}`);
  }
  assertEquals(bm.numFreeHostSlots, bm.numSwapBlocks, `seed ${seed}: host slots leaked`);
  let scoredRequests = 0;
  for (const [id, got] of outputs) {
    const promptLen = prompts.get(id)!.length;
    // Each position before the prompt's last scored once, in order (a cut request: a prefix).
    if (params.get(id)!.promptLogprobs !== null) {
      const seen = scored.get(id) ?? [];
      const all = Array.from({ length: promptLen - 1 }, (_, p) => p);
      if (got.length > 0) scoredRequests++;
      assertEquals(
        seen,
        cut.has(id) || got.length === 0 ? all.slice(0, seen.length) : all,
        `seed ${seed}: ${id} scored positions`,
      );
    } else if (scored.has(id)) fail(`seed ${seed}: ${id} scored without prompt_logprobs`);
    const want = aloneOutputs(id, promptLen, params.get(id)!);
    if (cut.has(id)) {
      assertEquals(got, want.slice(0, got.length), `seed ${seed}: ${id} is no prefix`);
    } else assertEquals(got, want, `seed ${seed}: ${id} differs from running alone`);
  }
  if (scoredRequests === 0) fail(`${ctx}: no request with prompt_logprobs completed`);
}

Deno.test("10,000 random requests with aborts on a small pool keep every invariant every step", () => {
  const base = { maxNumSeqs: 8, maxModelLen: 64 };
  const configs: ContinuousSchedulerConfig[] = [
    { ...base, blockSize: 4, numGpuBlocks: 40, maxNumBatchedTokens: 32 },
    {
      ...base,
      preemptionMode: "swap",
      // Scored prompt positions in sub-batches: more sampler rows than sequences.
      maxSamplerRows: 20,
      numSwapBlocks: 24,
      blockSize: 2,
      numGpuBlocks: 64,
      maxNumBatchedTokens: 24,
    },
    {
      ...base,
      policy: "priority",
      blockSize: 4,
      numGpuBlocks: 32,
      maxNumBatchedTokens: 64,
      enableChunkedPrefill: false,
    },
    {
      ...base,
      policy: "priority",
      preemptionMode: "swap",
      numSwapBlocks: 16,
      blockSize: 4,
      numGpuBlocks: 24,
      maxNumBatchedTokens: 16,
      enablePrefixCaching: false,
    },
  ];
  for (const config of configs) {
    const { seed, rng } = testSeed(`scheduler property ${config.policy}/${config.preemptionMode}`);
    run(rng, seed, 2500, config);
  }
});
