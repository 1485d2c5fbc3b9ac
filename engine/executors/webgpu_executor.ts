/**
 * The WebGPU executor: turns each {@linkcode SchedulerOutput} into a {@linkcode ForwardBatch}
 * for the {@linkcode ModelRunner}, and performs the scheduler's swap copies between the KV
 * cache and a bounded host-memory pool.
 *
 * Tokens the host does not know yet ({@linkcode SAMPLED_TOKEN}) are fed from the GPU ring of
 * sampled tokens through `runner.sampledRef`, so no step waits for a readback. Sampling is
 * seeded per request (the request's seed, or one drawn from the engine's generator) with the
 * token's position as counter: the same request gives the same tokens whatever the batch.
 *
 * @module
 */

import { SAMPLED_TOKEN, type SchedulerOutput } from "../../scheduler/scheduler_output.ts";
import type { SequenceChunk } from "../forward_batch.ts";
import { blockBytesPerLayer } from "../kv_cache.ts";
import type { ModelRunner } from "../model_runner.ts";
import type { ExecutedStep, Executor, SampledToken } from "./executor.ts";

/** Options of {@linkcode WebGpuExecutor}. */
export interface WebGpuExecutorOptions {
  /** Host swap slots (blocks), 0 for none. */
  readonly numSwapBlocks: number;
  /** Seeds for requests without one. */
  readonly seedSource: () => number;
}

/** See the module documentation. */
export class WebGpuExecutor implements Executor {
  readonly kind = "webgpu" as const;
  readonly runner: ModelRunner;
  readonly #seeds = new Map<string, number>();
  readonly #seedSource: () => number;
  /** Scheduler step -> runner step, for steps whose samples may still be fed from the GPU. */
  readonly #runnerStep = new Map<number, number>();
  /** Host swap pool: slot i holds one block of every layer, K then V. */
  readonly #swapPool: Uint8Array<ArrayBuffer> | null;
  readonly #layerBlockBytes: number;

  constructor(runner: ModelRunner, options: WebGpuExecutorOptions) {
    this.runner = runner;
    this.#seedSource = options.seedSource;
    this.#layerBlockBytes = blockBytesPerLayer(runner.kv.shape);
    const slotBytes = 2 * runner.kv.shape.numLayers * this.#layerBlockBytes;
    this.#swapPool = options.numSwapBlocks > 0
      ? new Uint8Array(options.numSwapBlocks * slotBytes)
      : null;
  }

  get maxInFlight(): number {
    return this.runner.maxInFlight;
  }

  execute(output: SchedulerOutput): ExecutedStep {
    const ready = output.swappedOut.length > 0 ? this.#swapOut(output) : undefined;
    if (output.swappedIn.length > 0) this.#swapIn(output);
    if (output.scheduled.length === 0) {
      return { result: Promise.resolve(new Map()), ...(ready ? { ready } : {}) };
    }
    const n = output.totalTokens;
    const inputIds = new Uint32Array(n);
    const positions = new Uint32Array(n);
    const slotMapping = new Uint32Array(n);
    const seqs: SequenceChunk[] = [];
    const samplers: string[] = [];
    let t = 0;
    for (const r of output.scheduled) {
      if (r.isNew || !this.#seeds.has(r.requestId)) {
        this.#seeds.set(r.requestId, r.params.seed ?? this.#seedSource());
      }
      for (let i = 0; i < r.numTokens; i++, t++) {
        const id = r.tokenIds[i]!;
        if (id === SAMPLED_TOKEN) {
          const from = r.sampledFrom;
          const step = from === null ? undefined : this.#runnerStep.get(from.step);
          if (from === null || step === undefined) {
            throw new RangeError(
              `Cannot feed request "${r.requestId}": its sampled token is no longer on the GPU`,
            );
          }
          inputIds[t] = this.runner.sampledRef(step, from.row);
        } else {
          inputIds[t] = id;
        }
        positions[t] = r.positionStart + i;
        slotMapping[t] = r.slotMapping[i]!;
      }
      const contextLen = r.positionStart + r.numTokens;
      seqs.push({
        queryLen: r.numTokens,
        contextLen,
        blockTable: r.blockTable,
        sample: r.samplesToken
          ? {
            temperature: r.params.temperature,
            topK: r.params.topK,
            topP: r.params.topP,
            minP: r.params.minP,
            seed: this.#seeds.get(r.requestId)!,
            counter: contextLen,
          }
          : null,
      });
      if (r.samplesToken) samplers.push(r.requestId);
    }
    const handle = this.runner.execute({ inputIds, positions, slotMapping, seqs });
    this.#runnerStep.set(output.step, handle.step);
    // Steps the ring has moved past can no longer be fed from.
    for (const [step, runnerStep] of this.#runnerStep) {
      if (handle.step - runnerStep > this.runner.maxInFlight) this.#runnerStep.delete(step);
    }
    const result = handle.result.then((rows) => {
      const map = new Map<string, SampledToken>();
      samplers.forEach((id, row) => {
        map.set(id, { tokenId: rows.tokens[row]!, logprob: rows.logprobs[row]! });
      });
      return map;
    });
    return { result, ...(ready ? { ready } : {}) };
  }

  /** Copies swapped-out blocks to a staging buffer now, and into the host pool once mapped. */
  #swapOut(output: SchedulerOutput): Promise<void> {
    const pool = this.#swapPool;
    if (pool === null) throw new RangeError("Cannot swap out: no swap space (--swap-space 0)");
    const ctx = this.runner.ctx;
    const kv = this.runner.kv;
    const b = this.#layerBlockBytes;
    const copies = output.swappedOut.flatMap((r) => r.copies);
    const perBlock = 2 * kv.shape.numLayers * b;
    const staging = ctx.createBuffer(
      "swap-out",
      copies.length * perBlock,
      GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    );
    const encoder = ctx.device.createCommandEncoder({ label: "swap-out" });
    copies.forEach((c, i) => {
      for (let l = 0; l < kv.shape.numLayers; l++) {
        const dst = i * perBlock + 2 * l * b;
        encoder.copyBufferToBuffer(kv.k[l]!, c.gpuBlock * b, staging, dst, b);
        encoder.copyBufferToBuffer(kv.v[l]!, c.gpuBlock * b, staging, dst + b, b);
      }
    });
    ctx.device.queue.submit([encoder.finish()]);
    return staging.mapAsync(GPUMapMode.READ).then(() => {
      const bytes = new Uint8Array(staging.getMappedRange());
      copies.forEach((c, i) => {
        pool.set(bytes.subarray(i * perBlock, (i + 1) * perBlock), c.hostSlot * perBlock);
      });
      staging.unmap();
      staging.destroy();
    });
  }

  /** Writes swapped-in blocks from the host pool into the KV cache (ordered before the step). */
  #swapIn(output: SchedulerOutput): void {
    const pool = this.#swapPool;
    if (pool === null) throw new RangeError("Cannot swap in: no swap space (--swap-space 0)");
    const kv = this.runner.kv;
    const b = this.#layerBlockBytes;
    const perBlock = 2 * kv.shape.numLayers * b;
    const queue = this.runner.ctx.device.queue;
    for (const r of output.swappedIn) {
      for (const c of r.copies) {
        for (let l = 0; l < kv.shape.numLayers; l++) {
          const src = c.hostSlot * perBlock + 2 * l * b;
          queue.writeBuffer(kv.k[l]!, c.gpuBlock * b, pool, src, b);
          queue.writeBuffer(kv.v[l]!, c.gpuBlock * b, pool, src + b, b);
        }
      }
    }
  }

  release(requestId: string): void {
    this.#seeds.delete(requestId);
  }

  destroy(): void {
    this.runner.destroy();
  }
}
