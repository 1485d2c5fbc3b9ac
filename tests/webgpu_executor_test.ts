import assert from "node:assert/strict";
import { WebGpuExecutor } from "../engine/executors/webgpu_executor.ts";
import { blockBytesPerLayer } from "../engine/kv_cache.ts";
import { readBuffer } from "../gpu/readback.ts";
import { ModelRunner } from "../engine/model_runner.ts";
import type { SchedulerOutput } from "../scheduler/scheduler_output.ts";
import { makeModel } from "../tools/make_model.ts";
import { GPU_TEST, testContext } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";

/** GPU block <-> host slot. */
interface BlockCopy {
  readonly gpuBlock: number;
  readonly hostSlot: number;
}

/** A step that only moves blocks. */
function moveOnly(
  step: number,
  out: readonly { id: string; copies: BlockCopy[] }[],
  back: readonly { id: string; copies: BlockCopy[] }[],
): SchedulerOutput {
  return {
    step,
    scheduled: [],
    totalTokens: 0,
    blockSize: 16,
    preempted: [],
    swappedOut: out.map((r) => ({ requestId: r.id, copies: r.copies })),
    swappedIn: back.map((r) => ({ requestId: r.id, copies: r.copies })),
    newRequests: [],
    finished: [],
    aborted: [],
  };
}

Deno.test(
  "WebGpuExecutor swap-out does not hold the next step back, and a swap-in waits for its bytes",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      const { seed, rng } = testSeed("executor swap");
      await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed: seed % 1000 });
      const ctx = await testContext({ forceF32: true });
      const runner = await ModelRunner.load(ctx, dir, {
        maxTokens: 16,
        maxSeqs: 2,
        maxModelLen: 64,
        blockSize: 16,
        numKvBlocks: 8,
        showProgress: false,
      });
      const executor = new WebGpuExecutor(runner, { numSwapBlocks: 4, seedSource: () => 0 });
      try {
        const kv = runner.kv;
        const b = blockBytesPerLayer(kv.shape);
        const layers = kv.shape.numLayers;
        // Fresh random bytes in every layer's K and V, blocks 0..7.
        const fill = (buffer: GPUBuffer) => {
          const data = Float32Array.from({ length: (8 * b) / 4 }, () => rng.normal());
          ctx.device.queue.writeBuffer(buffer, 0, data);
          return new Uint8Array(data.buffer);
        };
        const kInit = kv.k.map(fill);
        const vInit = kv.v.map(fill);
        const block = (bytes: Uint8Array, i: number) => bytes.subarray(i * b, (i + 1) * b);

        // Blocks 1 and 6 go to host slots 2 and 0.
        const out = [{
          id: "a",
          copies: [{ gpuBlock: 1, hostSlot: 2 }, { gpuBlock: 6, hostSlot: 0 }],
        }];
        const step = executor.execute(moveOnly(1, out, []));
        assert.equal("ready" in step, false, "a swap-out must not hold the next step back");
        // Overwrite the swapped-out blocks at once (as a later step reusing them would): the
        // copies were submitted first, so they still see the old bytes.
        for (const buffer of [...kv.k, ...kv.v]) {
          ctx.device.queue.writeBuffer(buffer, 1 * b, new Uint8Array(b).fill(0xff));
          ctx.device.queue.writeBuffer(buffer, 6 * b, new Uint8Array(b).fill(0xff));
        }
        // Back into blocks 3 and 4 (slot 0 -> 4, slot 2 -> 3), with block 5 going out to slot 1
        // in the same step.
        const back = moveOnly(
          2,
          [{ id: "b", copies: [{ gpuBlock: 5, hostSlot: 1 }] }],
          [{ id: "a", copies: [{ gpuBlock: 3, hostSlot: 2 }, { gpuBlock: 4, hostSlot: 0 }] }],
        );
        // Nothing was awaited since the swap-out, so its readback cannot have landed yet.
        const landing = executor.swapInReady(back);
        assert.ok(landing !== undefined, "the swap-in must wait for the swap-out's readback");
        assert.throws(() => executor.execute(back), /host slot \d is still on its way/);
        await landing;
        assert.equal(executor.swapInReady(back), undefined);
        await executor.execute(back).result;
        for (let l = 0; l < layers; l++) {
          const k = new Uint8Array(await readBuffer(ctx, kv.k[l]!, 0, 8 * b));
          const v = new Uint8Array(await readBuffer(ctx, kv.v[l]!, 0, 8 * b));
          assert.deepEqual(block(k, 3), block(kInit[l]!, 1), `layer ${l} K block 3`);
          assert.deepEqual(block(k, 4), block(kInit[l]!, 6), `layer ${l} K block 4`);
          assert.deepEqual(block(v, 3), block(vInit[l]!, 1), `layer ${l} V block 3`);
          assert.deepEqual(block(v, 4), block(vInit[l]!, 6), `layer ${l} V block 4`);
        }
        // Block 5 reached slot 1: swapped back into block 0, it holds block 5's bytes.
        const again = moveOnly(3, [], [{ id: "b", copies: [{ gpuBlock: 0, hostSlot: 1 }] }]);
        await executor.swapInReady(again);
        await executor.execute(again).result;
        for (let l = 0; l < layers; l++) {
          const k = new Uint8Array(await readBuffer(ctx, kv.k[l]!, 0, 8 * b));
          assert.deepEqual(block(k, 0), block(kInit[l]!, 5), `layer ${l} K block 0`);
        }
      } finally {
        executor.destroy();
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);
