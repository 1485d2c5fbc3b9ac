import assert from "node:assert/strict";
import { WebGpuExecutor } from "../engine/executors/webgpu_executor.ts";
import { blockBytesPerLayer } from "../engine/kv_cache.ts";
import { readBuffer } from "../gpu/readback.ts";
import { maskWords } from "../kernels/token_mask.ts";
import { ModelRunner } from "../engine/model_runner.ts";
import type { SampledToken } from "../engine/executors/executor.ts";
import { type SamplingParams, samplingParams } from "../scheduler/sampling_params.ts";
import {
  SAMPLED_TOKEN,
  type ScheduledRequest,
  type SchedulerOutput,
} from "../scheduler/scheduler_output.ts";
import { makeModel } from "../tools/make_model.ts";
import { ReferenceModel } from "./reference/model.ts";
import { GPU_TEST, testContext } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { referenceRun, type SoloPenalties } from "./support/solo_run.ts";

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

/** A request of {@linkcode HandScheduler}: what it holds and what it got. */
interface HandRequest {
  readonly id: string;
  readonly prompt: readonly number[];
  readonly penalties: SoloPenalties;
  readonly params: SamplingParams;
  /** GPU blocks (swapped out: host slots in `hostSlots`). */
  blocks: number[];
  hostSlots: number[];
  /** Tokens whose KV is computed. */
  computed: number;
  /** Output ids read back, in order. */
  readonly outputs: number[];
  /** Output tokens sampled but not read back yet. */
  pending: number;
  /** Where its newest output was sampled (scheduler step, row). */
  last: { step: number; row: number } | null;
  /** Its next scheduling is a (re-)admission. */
  isNew: boolean;
}

/**
 * Schedules by hand, step by step, what a scheduler would (new requests, prefill chunks,
 * decodes fed from the GPU, preemption by recompute, swap out and in, finish, abort), keeping
 * up to 3 steps in flight, through a real {@linkcode WebGpuExecutor}.
 */
class HandScheduler {
  step = 0;
  readonly #executor: WebGpuExecutor;
  readonly #bs: number;
  readonly #free: number[];
  readonly #hostFree: number[];
  readonly #inFlight: {
    result: Promise<ReadonlyMap<string, SampledToken>>;
    ids: HandRequest[];
    started: () => boolean;
  }[] = [];

  constructor(executor: WebGpuExecutor, numBlocks: number, numHostSlots: number) {
    this.#executor = executor;
    this.#bs = executor.runner.options.blockSize;
    this.#free = Array.from({ length: numBlocks }, (_, i) => numBlocks - 1 - i);
    this.#hostFree = Array.from({ length: numHostSlots }, (_, i) => i);
  }

  /** Whether each step in flight has started its readback (oldest first). */
  started(): boolean[] {
    return this.#inFlight.map((s) => s.started());
  }

  /** Outputs so far, read back or not. */
  static total(r: HandRequest): number {
    return r.outputs.length + r.pending;
  }

  /**
   * One step: `work` lists (request, tokens to compute; null: up to its end), `life` the
   * lifecycle and swap lists. Keeps at most 3 steps in flight.
   */
  async run(
    work: readonly (readonly [HandRequest, number | null])[],
    life: {
      newRequests?: HandRequest[];
      preempted?: HandRequest[];
      swapOut?: HandRequest[];
      swapIn?: HandRequest[];
      finished?: HandRequest[];
      aborted?: HandRequest[];
      /** Requests that sample under a grammar's token mask (one that allows every token). */
      masked?: HandRequest[];
    } = {},
  ): Promise<void> {
    const step = ++this.step;
    const swappedOut = (life.swapOut ?? []).map((r) => this.#swapOut(r));
    const swappedIn = (life.swapIn ?? []).map((r) => this.#swapIn(r));
    for (const r of life.preempted ?? []) {
      this.#free.push(...r.blocks);
      r.blocks = [];
      r.computed = 0;
      r.isNew = true;
    }
    const samplers: HandRequest[] = [];
    const scheduled = work.map(([r, n]) => this.#schedule(r, n, step, samplers));
    const output: SchedulerOutput = {
      step,
      newRequests: (life.newRequests ?? []).map((r) => ({
        requestId: r.id,
        promptTokenIds: r.prompt,
        params: r.params,
      })),
      scheduled,
      totalTokens: scheduled.reduce((n, r) => n + r.numTokens, 0),
      blockSize: this.#bs,
      preempted: (life.preempted ?? []).map((r) => r.id),
      swappedOut,
      swappedIn,
      finished: (life.finished ?? []).map((r) => r.id),
      aborted: (life.aborted ?? []).map((r) => r.id),
    };
    await this.#executor.swapInReady(output);
    const vocab = this.#executor.runner.config.vocabSize;
    const masks = new Map(
      (life.masked ?? []).map((r) => [r.id, new Uint32Array(maskWords(vocab)).fill(~0 >>> 0)]),
    );
    const executed = this.#executor.execute(output, masks);
    assert.equal(executed.failed, undefined, `step ${step}: ${[...executed.failed ?? []]}`);
    this.#inFlight.push({
      result: executed.result,
      ids: samplers,
      started: () => executed.readbackStarted?.() ?? true,
    });
    while (this.#inFlight.length > 3) await this.#collect();
  }

  /** Waits for every step in flight. */
  async drain(): Promise<void> {
    this.#executor.flush();
    while (this.#inFlight.length > 0) await this.#collect();
  }

  async #collect(): Promise<void> {
    const { result, ids, started } = this.#inFlight.shift()!;
    // Overlapped steps' readbacks may wait for a later submit.
    if (!started()) this.#executor.flush();
    const tokens = await result;
    for (const r of ids) {
      r.outputs.push(tokens.get(r.id)!.tokenId);
      r.pending--;
    }
  }

  /** `r`'s share of `step`: `n` tokens from its computed ones (null: to its end). */
  #schedule(
    r: HandRequest,
    n: number | null,
    step: number,
    samplers: HandRequest[],
  ): ScheduledRequest {
    const end = r.prompt.length + HandScheduler.total(r);
    const start = r.computed;
    const numTokens = n ?? end - start;
    assert.ok(numTokens >= 1 && start + numTokens <= end, `${r.id}: ${start} + ${numTokens}`);
    while (r.blocks.length * this.#bs < start + numTokens) r.blocks.push(this.#free.pop()!);
    const known = [...r.prompt, ...r.outputs];
    const tokenIds = Array.from(
      { length: numTokens },
      (_, i) => known[start + i] ?? SAMPLED_TOKEN,
    );
    const samplesToken = start + numTokens === end;
    const row = samplesToken ? samplers.length : -1;
    const scheduled: ScheduledRequest = {
      requestId: r.id,
      order: 0, // only the scheduler's own result handling reads it
      numTokens,
      tokenIds,
      positionStart: start,
      blockTable: [...r.blocks],
      slotMapping: Array.from({ length: numTokens }, (_, i) => {
        const p = start + i;
        return r.blocks[Math.floor(p / this.#bs)]! * this.#bs + (p % this.#bs);
      }),
      samplesToken,
      isNew: r.isNew,
      numCachedTokens: 0,
      params: r.params,
      sampleRow: row,
      sampledFrom: tokenIds.at(-1) === SAMPLED_TOKEN ? r.last : null,
    };
    r.isNew = false;
    r.computed = start + numTokens;
    if (samplesToken) {
      samplers.push(r);
      r.pending++;
      r.last = { step, row };
    }
    return scheduled;
  }

  #swapOut(r: HandRequest): { requestId: string; copies: BlockCopy[] } {
    const copies = r.blocks.map((gpuBlock) => ({ gpuBlock, hostSlot: this.#hostFree.pop()! }));
    this.#free.push(...r.blocks);
    r.blocks = [];
    r.hostSlots = copies.map((c) => c.hostSlot);
    return { requestId: r.id, copies };
  }

  #swapIn(r: HandRequest): { requestId: string; copies: BlockCopy[] } {
    const copies = r.hostSlots.map((hostSlot) => ({ hostSlot, gpuBlock: this.#free.pop()! }));
    this.#hostFree.push(...r.hostSlots);
    r.hostSlots = [];
    r.blocks = copies.map((c) => c.gpuBlock);
    return { requestId: r.id, copies };
  }
}

const HAND_PENALTIES: SoloPenalties[] = [
  { repetitionPenalty: 1.8 },
  { presencePenalty: 1.5, frequencyPenalty: 0.7 },
  { repetitionPenalty: 0.8, frequencyPenalty: -0.2, logitBias: new Map([[7, 2.5], [100, -3]]) },
  { repetitionPenalty: 1.3, presencePenalty: 0.2, frequencyPenalty: 0.3 },
  { repetitionPenalty: 1.6, presencePenalty: 0.8 },
  {}, // none
];

Deno.test(
  "WebGpuExecutor penalised greedy outputs equal the float64 reference across chunked prefill, preemption by recompute and swap, and history growth, and every history is freed",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      const { seed, rng } = testSeed("executor penalties");
      await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed: seed % 1000 });
      const ref = await ReferenceModel.load(dir);
      const ctx = await testContext({ forceF32: true });
      const runner = await ModelRunner.load(ctx, dir, {
        maxTokens: 64,
        maxSeqs: 8,
        maxModelLen: 64,
        blockSize: 16,
        numKvBlocks: 24,
        showProgress: false,
      });
      const executor = new WebGpuExecutor(runner, {
        numSwapBlocks: 4,
        seedSource: () => 0,
        overlapSteps: true,
        readbackBatch: 3,
      });
      try {
        const N = 14;
        const [A, B, C, D, E, F] = [7, 19, 12, 5, 16, 9].map((len, i): HandRequest => {
          const penalties = HAND_PENALTIES[i]!;
          return {
            id: "ABCDEF"[i]!,
            prompt: Array.from({ length: len }, () => rng.int(0, 500)),
            penalties,
            params: samplingParams({ temperature: 0, maxTokens: N, ignoreEos: true, ...penalties }),
            blocks: [],
            hostSlots: [],
            computed: 0,
            outputs: [],
            pending: 0,
            last: null,
            isNew: true,
          };
        }) as [HandRequest, HandRequest, HandRequest, HandRequest, HandRequest, HandRequest];
        const h = new HandScheduler(executor, 24, 4);
        const decode = (...rs: HandRequest[]) =>
          rs.filter((r) => HandScheduler.total(r) < N).map((r) => [r, 1] as const);
        // Chunked prefill of B; A, C, D take 4 histories.
        await h.run([[A, null], [B, 8], [F, null]], { newRequests: [A, B, F] });
        await h.run([...decode(A), [B, 8], ...decode(F)]);
        // A step that prefills starts its readback at the next step (no first token waits).
        assert.deepEqual(h.started(), [true, false], `seed ${seed}: prefill readback`);
        await h.run([...decode(A), [B, null], ...decode(F), [C, null], [D, null]], {
          newRequests: [C, D],
        });
        for (let i = 0; i < 3; i++) await h.run(decode(A, B, C, D, F));
        // Decode-only steps start their readbacks 3 at a time: the next step starts these.
        assert.deepEqual(h.started(), [false, false, false], `seed ${seed}: decode batch`);
        // E's history grows the buffer while the others' steps are in flight.
        await h.run([...decode(A, B, C, D, F), [E, null]], { newRequests: [E] });
        assert.deepEqual(h.started(), [true, true, false], `seed ${seed}: batch started`);
        assert.equal(runner.penaltyHistories.inUse, 5, `seed ${seed}`);
        // A step that samples under a grammar's mask starts its readback at the next step (the
        // request's next step waits for its token).
        await h.run(decode(A, B, C, D, E, F), { masked: [A] });
        await h.run(decode(A, B, C, D, E, F));
        assert.deepEqual(h.started().slice(-2), [true, false], `seed ${seed}: masked step`);
        // B: preempted by recompute mid-decode, then recomputed in two chunks.
        await h.drain();
        await h.run(decode(A, C, D, E, F), { preempted: [B] });
        await h.run(decode(A, C, D, E, F));
        await h.run([...decode(A, C, D, E, F), [B, 10]]);
        await h.run([...decode(A, C, D, E, F), [B, null]]);
        // C: swapped out, then back into other blocks.
        await h.drain();
        await h.run(decode(A, B, D, E, F), { swapOut: [C] });
        await h.run(decode(A, B, D, E, F));
        await h.drain();
        await h.run(decode(A, B, C, D, E, F), { swapIn: [C] });
        // E: aborted mid-decode.
        await h.drain();
        await h.run(decode(A, B, C, D, F), { aborted: [E] });
        const rest = [A, B, C, D, F];
        while (rest.some((r) => HandScheduler.total(r) < N)) await h.run(decode(...rest));
        await h.drain();
        await h.run([], { finished: rest });
        for (const r of [A, B, C, D, E, F]) {
          const expected = referenceRun(ref, r.prompt, N, r.penalties).map((s) => s.token);
          assert.deepEqual(
            r.outputs,
            expected.slice(0, r.outputs.length),
            `seed ${seed} request ${r.id} (${JSON.stringify(r.penalties)})`,
          );
          if (r !== E) assert.equal(r.outputs.length, N, `seed ${seed} request ${r.id}`);
        }
        assert.ok(E.outputs.length >= 8, `seed ${seed}: E got ${E.outputs.length}`);
        assert.equal(runner.penaltyHistories.inUse, 0, `seed ${seed}: histories left behind`);
        assert.equal(executor.numTracked, 0, `seed ${seed}: executor state left behind`);
      } finally {
        executor.destroy();
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);
