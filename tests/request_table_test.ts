import { deepStrictEqual as assertEquals, ok as assert, throws } from "node:assert/strict";
import { ContinuousScheduler } from "../scheduler/scheduler.ts";
import { StaticScheduler } from "../scheduler/static_scheduler.ts";
import { RequestTable } from "../scheduler/request_table.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import type { Scheduler } from "../scheduler/scheduler_api.ts";
import type { Sequence } from "../scheduler/sequence.ts";

/** Asserts that `fn` throws an `type` whose message contains `text`. */
function assertThrows(fn: () => unknown, type: ErrorConstructor, text: string): void {
  throws(fn, (e: unknown) => e instanceof type && e.message.includes(text));
}

const LIMITS = { maxModelLen: 64, maxKvTokens: 64 };
const request = (id: string, prompt = [1, 2, 3]) => ({
  requestId: id,
  promptTokenIds: prompt,
  params: samplingParams({ maxTokens: 4 }),
});

Deno.test("RequestTable.add() numbers requests in arrival order and rejects a live id", () => {
  const table = new RequestTable(() => {});
  const a = table.add(request("a"), LIMITS, 10);
  const b = table.add(request("b"), LIMITS, 11);
  assertEquals([a.order, b.order, table.size], [0, 1, 2]);
  assertThrows(() => table.add(request("a"), LIMITS, 12), RangeError, 'request "a"');
  assertEquals(table.size, 2);
  assertEquals(table.get("b"), b);
});

Deno.test("RequestTable.add() keeps a request's cache salt and rejects an empty one", () => {
  const table = new RequestTable(() => {});
  assertEquals(table.add({ ...request("a"), cacheSalt: "t1" }, LIMITS, 0).cacheSalt, "t1");
  assertEquals(table.add(request("b"), LIMITS, 0).cacheSalt, null);
  assertThrows(
    () => table.add({ ...request("c"), cacheSalt: "" }, LIMITS, 0),
    TypeError,
    "cacheSalt must be a non-empty string",
  );
  assertEquals(table.size, 2);
});

Deno.test("RequestTable.finishById() releases first, then reports each id once in takeEnded()", () => {
  const seen: string[] = [];
  const table = new RequestTable((seq: Sequence) => {
    // Still live while it is released.
    seen.push(`${seq.requestId}:${table.get(seq.requestId) === seq ? "live" : "gone"}`);
  });
  table.add(request("a"), LIMITS, 0);
  table.add(request("b"), LIMITS, 0);
  table.add(request("c"), LIMITS, 0);
  assert(table.finishById("a", "stop", "###"));
  assert(table.finishById("b", "abort", null));
  assertEquals(table.finishById("b", "abort", null), false);
  assertEquals(table.finishById("zzz", "length", null), false);
  assertEquals(seen, ["a:live", "b:live"]);
  assertEquals(table.takeEnded(), { finished: ["a"], aborted: ["b"] });
  assertEquals(table.takeEnded(), { finished: [], aborted: [] });
  assertEquals([table.size, table.get("a"), table.get("c")?.requestId], [1, undefined, "c"]);
});

for (
  const [name, make] of [
    [
      "ContinuousScheduler",
      () =>
        new ContinuousScheduler({
          numGpuBlocks: 8,
          blockSize: 4,
          maxNumBatchedTokens: 16,
          maxNumSeqs: 4,
          maxModelLen: 16,
        }),
    ],
    [
      "StaticScheduler",
      () =>
        new StaticScheduler({
          batchSize: 2,
          maxModelLen: 16,
          blockSize: 4,
          numGpuBlocks: 8,
          maxNumBatchedTokens: 16,
        }),
    ],
  ] as const
) {
  Deno.test(`${name}.updateFromOutput() throws when a step is applied out of order`, () => {
    const s: Scheduler = make();
    s.addRequest(request("a"));
    s.addRequest(request("b"));
    s.flush();
    const first = s.schedule();
    const second = s.schedule();
    assertThrows(() => s.updateFromOutput(second, new Map()), RangeError, "step 1 is the next");
    const updates = s.updateFromOutput(first, new Map([["a", 7], ["b", 8]]));
    assertEquals(updates.map((u) => [u.requestId, u.newTokenIds]), [["a", [7]], ["b", [8]]]);
    assertThrows(() => s.updateFromOutput(first, new Map()), RangeError, "step 2 is the next");
  });

  Deno.test(`${name}.addRequest() rejects an id that is still live, accepts it once finished`, () => {
    const s: Scheduler = make();
    s.addRequest(request("a"));
    assertThrows(() => s.addRequest(request("a")), RangeError, "already in use");
    assert(s.abortRequest("a"));
    assertEquals(s.hasUnfinishedRequests(), false);
    s.addRequest(request("a"));
    assertEquals(s.schedule().aborted, ["a"]);
  });
}

Deno.test(
  "ContinuousScheduler.updateFromOutput() gives a step's token to no newer request reusing an ended id",
  () => {
    const s = new ContinuousScheduler({
      maxNumBatchedTokens: 64,
      maxNumSeqs: 4,
      maxModelLen: 64,
      blockSize: 4,
      numGpuBlocks: 16,
    });
    s.addRequest(request("x", [1, 2, 3]));
    const s1 = s.schedule();
    // "x" is aborted while step 1 is in flight, and a new "x" arrives at once.
    s.abortRequest("x");
    const fresh = s.addRequest(request("x", [7, 8, 9, 10, 11]));
    const s2 = s.schedule();
    assertEquals(s2.scheduled.map((r) => [r.requestId, r.numTokens]), [["x", 5]]);
    assert(s1.scheduled[0]!.order !== s2.scheduled[0]!.order);
    // Step 1's token was the old request's: the new one gets nothing from it.
    assertEquals(s.updateFromOutput(s1, new Map([["x", 42]])), []);
    assertEquals([...fresh.outputTokenIds, fresh.numPlaceholders], [1]);
    const updates = s.updateFromOutput(s2, new Map([["x", 43]]));
    assertEquals(updates.map((u) => u.newTokenIds), [[43]]);
    assertEquals(fresh.outputTokenIds, [43]);
  },
);
