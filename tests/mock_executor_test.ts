/**
 * The one mock executor (engine/executors/mock_executor.ts) across its parameters: the virtual
 * clock's serial device, the contract checks through the engine's `execute`, and options that
 * belong to the other clock.
 */

import assert from "node:assert/strict";
import { MockExecutor, mockTokenAt, VirtualClock } from "../engine/executors/mock_executor.ts";
import { GpuDeviceError } from "../gpu/errors.ts";
import { ContinuousScheduler } from "../scheduler/scheduler.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import type { SchedulerOutput } from "../scheduler/scheduler_output.ts";

/** A continuous scheduler over 16 blocks of 4 slots with `prompts` added. */
function scheduler(prompts: Record<string, number[]>): ContinuousScheduler {
  const s = new ContinuousScheduler({
    maxNumBatchedTokens: 64,
    maxNumSeqs: 8,
    maxModelLen: 64,
    blockSize: 4,
    numGpuBlocks: 16,
  });
  const params = samplingParams({ maxTokens: 3, ignoreEos: true });
  for (const [id, p] of Object.entries(prompts)) {
    s.addRequest({ requestId: id, promptTokenIds: p, params });
  }
  return s;
}

Deno.test("MockExecutor on the virtual clock runs steps one after another and settle() moves time", async () => {
  const clock = new VirtualClock();
  const exec = new MockExecutor({
    latency: { baseMs: 10, perTokenMs: 1 },
    clock: "virtual",
    virtualClock: clock,
  });
  assert.equal(exec.virtualClock, clock);
  const s = scheduler({ a: [1, 2, 3], b: [4, 5] });
  const first = s.schedule(); // 5 prompt tokens: 15 ms
  const r1 = exec.execute(first);
  const second = s.schedule(); // 2 decodes, queued behind the first step: 12 ms
  const r2 = exec.execute(second);
  assert.equal(clock.now(), 0, "submitting takes no time");
  const t1 = await r1.result;
  assert.deepEqual(
    [...t1].map(([id, t]) => [id, t.tokenId]),
    [["a", mockTokenAt("a", 3, 10, 50)], ["b", mockTokenAt("b", 2, 10, 50)]],
  );
  exec.settle(first.step);
  assert.equal(clock.now(), 15);
  await r2.result;
  exec.settle(second.step);
  assert.equal(clock.now(), 27);
  exec.settle(second.step); // a step settles once
  assert.equal(clock.now(), 27);
  assert.deepEqual([exec.steps, exec.tokens], [2, 7]);
});

Deno.test("MockExecutor with kv checks the scheduler's contract through execute() too", async () => {
  const prompt = [1, 2, 3, 4, 5];
  const kv = {
    numBlocks: 16,
    blockSize: 4,
    truth: (id: string, p: number) => p < 5 ? prompt[p]! : mockTokenAt(id, p, 10, 50),
  };
  const exec = new MockExecutor({ kv, failAtStep: 2 });
  const s = scheduler({ a: prompt });
  const step = s.schedule();
  // The same step with one slot moved off its block table fails the check (on an executor of
  // its own: a step that fails a check leaves the simulated cache half written).
  const r = step.scheduled[0]!;
  const bad: SchedulerOutput = {
    ...step,
    scheduled: [{ ...r, slotMapping: r.slotMapping.map((x, i) => i === 0 ? x + 1 : x) }],
  };
  assert.throws(
    () => new MockExecutor({ kv }).execute(bad),
    /slot \d+ for position 0 disagrees with the block table/,
  );
  const sampled = await exec.execute(step).result;
  assert.deepEqual([...sampled.keys()], ["a"]);
  // failAtStep counts the steps that reached the device: the second one fails as a lost device.
  s.updateFromOutput(step, new Map([["a", sampled.get("a")!.tokenId]]));
  await assert.rejects(exec.execute(s.schedule()).result, GpuDeviceError);
  exec.destroy();
});

Deno.test("MockExecutor rejects options of the other clock and negative times", () => {
  assert.throws(
    () => new MockExecutor({ clock: "virtual", blockingSubmit: true }),
    /virtual clock cannot busy-wait/,
  );
  assert.throws(() => new MockExecutor({ virtualClock: new VirtualClock() }), /clock: "virtual"/);
  assert.throws(() => new MockExecutor({ swapOutMs: -1 }), /swap-out time must be >= 0/);
  assert.throws(
    () => new MockExecutor({ latency: { baseMs: -1, perTokenMs: 0 } }),
    /Mock latency must be >= 0/,
  );
  assert.equal(new MockExecutor().virtualClock, null);
});

Deno.test("MockExecutor with kv fails a step whose request lifecycle breaks the contract", () => {
  const kv = { numBlocks: 16, blockSize: 4 };
  const s = scheduler({ a: [1, 2, 3], b: [4, 5] });
  const first = s.schedule();
  assert.deepEqual(first.newRequests.map((n) => n.requestId), ["a", "b"]);
  // Scheduled without having been listed as new.
  assert.throws(
    () => new MockExecutor({ kv }).execute({ ...first, newRequests: first.newRequests.slice(1) }),
    /request "a": scheduled but never listed in newRequests/,
  );
  // Listed as new twice while live.
  const exec = new MockExecutor({ kv });
  exec.run(first);
  assert.throws(
    () => exec.run({ ...first, step: 2, scheduled: [], totalTokens: 0 }),
    /request "a": listed as new while live/,
  );
  // Listed as new without being scheduled.
  assert.throws(
    () => new MockExecutor({ kv }).run({ ...first, scheduled: [], totalTokens: 0 }),
    /request "a": listed as new but not scheduled/,
  );
  // An ended id may come back as a new request: ended ids are dropped first.
  const again = new MockExecutor({ kv });
  again.run(first);
  again.run({ ...first, step: 2, scheduled: [], newRequests: [], totalTokens: 0, aborted: ["a"] });
  const a = first.scheduled[0]!;
  again.run({
    ...first,
    step: 3,
    newRequests: [first.newRequests[0]!],
    scheduled: [a],
    totalTokens: a.numTokens,
    aborted: [],
  });
});
