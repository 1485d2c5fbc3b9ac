import assert from "node:assert/strict";
import { DeferredReadbacks } from "../engine/deferred_readbacks.ts";

Deno.test("DeferredReadbacks is due once as many wait as one of them allows, and starts them in order", async () => {
  const d = new DeferredReadbacks();
  const order: number[] = [];
  const complete = (n: number) => () => {
    order.push(n);
    return Promise.resolve(n);
  };
  const a = d.defer(complete(1), 3);
  const b = d.defer(complete(2), 3);
  assert.equal(d.due, false, "2 of 3");
  const c = d.defer(complete(3), 3);
  assert.equal(d.due, true, "3 of 3");
  assert.deepEqual([a.started(), b.started(), c.started()], [false, false, false]);
  d.startAll();
  assert.deepEqual(order, [1, 2, 3]);
  assert.deepEqual([a.started(), b.started(), c.started(), d.length], [true, true, true, 0]);
  assert.deepEqual(await Promise.all([a.result, b.result, c.result]), [1, 2, 3]);
  // One that allows no company makes the next start due at once.
  d.defer(complete(4), 3);
  assert.equal(d.due, false);
  const e = d.defer(() => Promise.reject(new Error("lost")), 1);
  assert.equal(d.due, true, "batch 1 reached");
  d.startAll();
  await assert.rejects(e.result, /lost/);
});
