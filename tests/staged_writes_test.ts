import assert from "node:assert/strict";
import { StagedWrites } from "../gpu/staged_writes.ts";
import { GPU_TEST, poisonedU32, readU32, testContext } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";

const POISON = 0xdeadbeef; // tests/support/gpu.ts poisonedU32's fill

/** Counts `queue.writeBuffer` calls while `fn` runs. */
function countingWrites<T>(fn: () => T): { result: T; writes: number } {
  const proto = GPUQueue.prototype;
  const original = proto.writeBuffer;
  let writes = 0;
  proto.writeBuffer = function (this: GPUQueue, ...args: Parameters<typeof original>) {
    writes++;
    return original.apply(this, args);
  };
  try {
    return { result: fn(), writes };
  } finally {
    proto.writeBuffer = original;
  }
}

/** Random u32 words. */
function words(rng: { next(): number }, n: number): Uint32Array<ArrayBuffer> {
  return Uint32Array.from({ length: n }, () => Math.floor(rng.next() * 0xffffffff) >>> 0);
}

Deno.test(
  "StagedWrites.encode() lands every write at its offset with one writeBuffer and copies",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("staged writes");
    const staged = new StagedWrites(ctx, 256);
    const a = poisonedU32(ctx, 13, "a");
    const b = poisonedU32(ctx, 7, "b");
    const c = poisonedU32(ctx, 9, "c");
    const wa = words(rng, 13);
    const wb = new Float32Array([1.5, -2.25, 3, 0.125]);
    const wc = words(rng, 5);
    staged.write(a, wa, 11); // 11 of 13 elements
    staged.write(b, wb, undefined, 8); // all 4, at byte 8
    staged.write(c, wc.buffer, 12, 4); // 12 bytes (3 words) of an ArrayBuffer, at byte 4
    assert.equal(staged.pending, 3);
    const expectedA = Array.from(wa.subarray(0, 11));
    wa.fill(0); // the values were copied when staged
    const encoder = ctx.device.createCommandEncoder();
    const { writes } = countingWrites(() => staged.encode(encoder));
    assert.equal(writes, 1, "one writeBuffer for the three targets");
    assert.equal(staged.pending, 0);
    ctx.device.queue.submit([encoder.finish()]);
    const gotA = await readU32(ctx, a);
    assert.deepEqual(Array.from(gotA), [...expectedA, POISON, POISON], `seed ${seed}`);
    const fb = new Uint32Array(new Float32Array([1.5, -2.25, 3, 0.125]).buffer);
    assert.deepEqual(Array.from(await readU32(ctx, b)), [POISON, POISON, ...fb, POISON]);
    assert.deepEqual(
      Array.from(await readU32(ctx, c)),
      [POISON, ...wc.subarray(0, 3), POISON, POISON, POISON, POISON, POISON],
    );
    staged.destroy();
  },
);

Deno.test(
  "StagedWrites grows past its first size and each step's copies read that step's bytes",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, rng } = testSeed("staged writes grow");
    const staged = new StagedWrites(ctx, 256);
    const target = poisonedU32(ctx, 300, "target");
    const outs = [0, 1, 2].map((i) => poisonedU32(ctx, 300, `out${i}`));
    // Three steps, the first larger than the initial 256 bytes; each step's command buffer
    // copies the target out after its staged writes, so a later step's upload must not reach
    // an earlier step's copies.
    const sent = [300, 40, 120].map((n) => words(rng, n));
    sent.forEach((data, i) => {
      staged.write(target, data.subarray(0, data.length / 2));
      staged.write(target, data.subarray(data.length / 2), undefined, data.length * 2);
      const encoder = ctx.device.createCommandEncoder();
      staged.encode(encoder);
      encoder.copyBufferToBuffer(target, 0, outs[i]!, 0, data.byteLength);
      ctx.device.queue.submit([encoder.finish()]);
      if (i === 0) assert.ok(staged.stagingBytes >= 1200);
    });
    for (let i = 0; i < 3; i++) {
      const got = await readU32(ctx, outs[i]!);
      assert.deepEqual(
        Array.from(got.subarray(0, sent[i]!.length)),
        Array.from(sent[i]!),
        `seed ${seed}, step ${i}`,
      );
    }
    staged.destroy();
  },
);

Deno.test(
  "StagedWrites.write() rejects unaligned or oversized writes and stages nothing then",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const staged = new StagedWrites(ctx);
    const target = poisonedU32(ctx, 4, "small");
    assert.throws(() => staged.write(target, new Uint8Array(6)), /multiples of 4/);
    assert.throws(() => staged.write(target, new Uint32Array(2), undefined, 2), /multiples of 4/);
    assert.throws(() => staged.write(target, new Uint32Array(2), 3), /within the data/);
    assert.throws(
      () => staged.write(target, new Uint32Array(4), undefined, 4),
      /Cannot stage 16 bytes at byte 4 of small: it holds 16/,
    );
    assert.equal(staged.pending, 0);
    staged.write(target, new Uint32Array([1, 2]));
    staged.clear();
    const encoder = ctx.device.createCommandEncoder();
    const { writes } = countingWrites(() => staged.encode(encoder));
    assert.equal(writes, 0, "a cleared stage uploads nothing");
    ctx.device.queue.submit([encoder.finish()]);
    assert.deepEqual(Array.from(await readU32(ctx, target)), [POISON, POISON, POISON, POISON]);
    staged.destroy();
  },
);
