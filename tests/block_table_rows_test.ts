/**
 * BlockTableRows (engine/block_table_rows.ts): the GPU buffer holds every step's tables in the
 * indexed layout the attention kernels read (checked by reading it back after each step), and a
 * step stages only the header and the entries its tables gained since their rows were written.
 */

import assert from "node:assert/strict";
import { blockTableEntries, BlockTableRows } from "../engine/block_table_rows.ts";
import type { GpuContext } from "../gpu/context.ts";
import { StagedWrites } from "../gpu/staged_writes.ts";
import { GPU_TEST, poisonedU32, readU32, testContext } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";

const MAX_SEQS = 4;
const MAX_BLOCKS = 6;

/** Stages `tables`, runs the copies, and checks the buffer against them; returns staged entries. */
async function step(
  ctx: GpuContext,
  rows: BlockTableRows,
  target: GPUBuffer,
  tables: readonly (readonly number[])[],
  context: string,
): Promise<number> {
  const writes = new StagedWrites(ctx, 256);
  try {
    rows.stage(tables, writes, target);
    const encoder = ctx.device.createCommandEncoder();
    writes.encode(encoder);
    ctx.device.queue.submit([encoder.finish()]);
    const got = await readU32(ctx, target);
    const starts = new Set<number>();
    tables.forEach((table, s) => {
      const at = got[s]!;
      assert.ok(at >= MAX_SEQS && (at - MAX_SEQS) % MAX_BLOCKS === 0, `${context}: row of ${s}`);
      assert.deepEqual([...got.subarray(at, at + table.length)], [...table], `${context}: ${s}`);
      starts.add(at);
    });
    // Distinct tables never share a row.
    assert.equal(starts.size, new Set(tables).size, `${context}: rows`);
    return rows.lastStagedEntries;
  } finally {
    writes.destroy();
  }
}

Deno.test(
  "BlockTableRows.stage() keeps rows across steps and stages only a header and new entries",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const target = poisonedU32(ctx, blockTableEntries(MAX_SEQS, MAX_BLOCKS));
    const rows = new BlockTableRows(MAX_SEQS, MAX_BLOCKS);
    const a = [7, 3];
    const b = [9];
    const c = [1, 2, 4];
    assert.equal(await step(ctx, rows, target, [a, b, c], "first step"), 3 + 6);
    assert.equal(await step(ctx, rows, target, [a, b, c], "unchanged"), 3, "header only");
    a.push(11);
    c.push(5);
    assert.equal(await step(ctx, rows, target, [a, b, c], "two appends"), 3 + 2);
    // Reordered, one sequence not scheduled: still the header only.
    assert.equal(await step(ctx, rows, target, [c, a], "reordered"), 2);
    // A rebuilt table is a new array (after a preemption): its row is written whole.
    const b2 = [20, 21];
    assert.equal(await step(ctx, rows, target, [a, b2, c], "rebuilt"), 3 + 2);
    // A table changed in place at its last uploaded entry is rewritten (guard).
    a[2] = 12;
    assert.equal(await step(ctx, rows, target, [a, b2, c], "changed in place"), 3 + 3);
    // The same array for two sequences: one row.
    assert.equal(await step(ctx, rows, target, [c, c], "shared"), 2);
    target.destroy();
  },
);

Deno.test(
  "BlockTableRows.stage() reuses the least recently used rows for new tables, never one of the step's",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("block table rows churn");
    const target = poisonedU32(ctx, blockTableEntries(MAX_SEQS, MAX_BLOCKS));
    const rows = new BlockTableRows(MAX_SEQS, MAX_BLOCKS);
    let live: number[][] = [];
    for (let i = 0; i < 40; i++) {
      // Each step: drop a random table, add new ones, grow some, shuffle (2 x MAX_SEQS rows, so
      // rows get reused for new tables all the time).
      if (live.length > 0 && rng.int(0, 2) === 0) live.splice(rng.int(0, live.length - 1), 1);
      while (live.length < MAX_SEQS && rng.int(0, 1) === 0) {
        live.push(Array.from({ length: rng.int(1, 3) }, () => rng.int(0, 999)));
      }
      for (const t of live) {
        if (t.length < MAX_BLOCKS && rng.int(0, 2) === 0) t.push(rng.int(0, 999));
      }
      live = rng.permutation(live.length).map((j) => live[j]!);
      await step(ctx, rows, target, live, `seed ${seed} step ${i}`);
    }
    target.destroy();
  },
);

Deno.test(
  "BlockTableRows.stage() refuses more tables or blocks than it holds",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const rows = new BlockTableRows(2, 3);
    const target = poisonedU32(ctx, blockTableEntries(2, 3));
    const writes = new StagedWrites(ctx, 256);
    assert.throws(() => rows.stage([[1], [2], [3]], writes, target), /3 block tables: room for 2/);
    assert.throws(() => rows.stage([[1, 2, 3, 4]], writes, target), /4 blocks: rows hold 3/);
    writes.destroy();
    target.destroy();
  },
);
