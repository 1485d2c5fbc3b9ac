/**
 * The steps the model bench runs through the {@linkcode ModelRunner}: prefills of one sequence,
 * and decode steps of a batch of sequences that share a {@linkcode PROMPT}-token prompt in KV
 * blocks [0, PROMPT / BLOCK) (prefix caching: the prompt is prefilled once) and each write their
 * own blocks from position PROMPT on. Decode steps are submitted back to back, each fed from
 * the previous step's samples on the GPU (`runner.sampledRef`), at most `runner.maxInFlight` in
 * flight.
 *
 * @module
 */

import type { ForwardBatch } from "../../engine/forward_batch.ts";
import type { ModelRunner, StepHandle } from "../../engine/model_runner.ts";
import { GpuTimer } from "../../gpu/timer.ts";
import { type StepCost, StepCostProbe } from "../lib/step_cost.ts";
import { BLOCK, PROMPT } from "./options.ts";

/** Process CPU seconds (user + system, all threads; lavapipe's workers included). */
export function cpuSeconds(): number {
  try {
    const stat = Deno.readTextFileSync("/proc/self/stat");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return NaN;
  }
}

/** One batch size's decode figures. */
export interface DecodeResult {
  readonly batch: number;
  readonly steps: number;
  /** First decode submit to last readback. */
  readonly wallMs: number;
  readonly cpuS: number;
  readonly tokensPerS: number;
  /** Host cost of the steps after the first. */
  readonly cost: StepCost;
  /** The GPU's timeline of those steps (with `timestamp-query`), else null. */
  readonly gpu: GpuTimeline | null;
}

/**
 * The GPU's timeline of the timed decode steps, from timestamps written at the start and end of
 * each step's compute pass: the time it computes and the time it waits between two steps (for
 * the host to submit the next one), averaged per step.
 */
export interface GpuTimeline {
  readonly busyMsPerStep: number;
  /** Mean gap between one step's end and the next one's start. */
  readonly idleMsPerStep: number;
}

/** Reads the timeline of the `steps` passes `timer` timed. */
async function readTimeline(runner: ModelRunner, timer: GpuTimer, steps: number) {
  const encoder = runner.ctx.device.createCommandEncoder();
  timer.resolve(encoder, steps);
  runner.ctx.device.queue.submit([encoder.finish()]);
  const spans = await timer.readSpans(steps);
  let busy = 0;
  let idle = 0;
  spans.forEach((s, i) => {
    busy += s.end - s.start;
    if (i > 0) idle += s.start - spans[i - 1]!.end;
  });
  return { busyMsPerStep: busy / steps, idleMsPerStep: steps > 1 ? idle / (steps - 1) : 0 };
}

/** Prefill and decode steps of one runner (see the module doc). */
export class BenchWorkload {
  /**
   * @param blocksPerSeq KV blocks of one sequence of the longest length; sequence `s` owns
   * blocks from `blocksPerSeq * (s + 1)` on.
   */
  constructor(readonly runner: ModelRunner, readonly blocksPerSeq: number) {}

  /**
   * Decode steps defer their readback to a later step's submit, as the engine runs them
   * (`StepOptions.overlap`); false starts each readback right after its submit.
   */
  overlap = true;

  /** With `overlap`: deferred readbacks that start together (`StepOptions.readbackBatch`). */
  readbackBatch = 1;

  /**
   * Each decode step awaited before the next is encoded: the host's cost measured with the
   * device idle (lavapipe's threads otherwise compete for the host's cores), not a throughput.
   */
  serial = false;

  /** Token ids the prompts use (the first 500 of the vocabulary at most). */
  get vocabTokens(): number {
    return Math.min(this.runner.config.vocabSize, 500);
  }

  /** Prefills `n` tokens of one sequence in blocks [base, base + ceil(n / BLOCK)); awaits it. */
  async prefill(n: number, base: number): Promise<number> {
    const start = performance.now();
    await this.runner.execute(this.prefillStep(n, base)).result;
    return performance.now() - start;
  }

  /**
   * {@linkcode BenchWorkload.prefill}, with the GPU's time for the step's compute pass
   * (`timestamp-query`; else null) beside the wall time: the wall time also holds the host's
   * encoding and Deno's readback wait (>= 10 ms, ../shared/platform-notes.md), which a server
   * pipelining its steps does not pay once per prefill.
   */
  async prefillTimed(n: number, base: number): Promise<{ ms: number; gpuMs: number | null }> {
    const timer = this.runner.ctx.hasTimestamps ? new GpuTimer(this.runner.ctx, 1) : null;
    try {
      const start = performance.now();
      const descriptor = timer?.passDescriptor(0);
      await this.runner.execute(this.prefillStep(n, base), { descriptor }).result;
      const ms = performance.now() - start;
      const gpuMs = timer === null
        ? null
        : (await readTimeline(this.runner, timer, 1)).busyMsPerStep;
      return { ms, gpuMs };
    } finally {
      timer?.destroy();
    }
  }

  /** The greedy prefill step of `n` tokens of one sequence in blocks from `base` on. */
  prefillStep(n: number, base: number): ForwardBatch {
    const positions = Uint32Array.from({ length: n }, (_, i) => i);
    const table = Array.from({ length: Math.ceil(n / BLOCK) }, (_, j) => base + j);
    return {
      inputIds: Uint32Array.from(
        { length: n },
        (_, i) => (i * 7 + base * 13 + 1) % this.vocabTokens,
      ),
      positions,
      slotMapping: positions.map((p) => table[Math.floor(p / BLOCK)]! * BLOCK + (p % BLOCK)),
      seqs: [{ queryLen: n, contextLen: n, blockTable: table, sample: { temperature: 0 } }],
    };
  }

  /** Block tables of `batch` sequences: the prompt's blocks, then each sequence's own. */
  tables(batch: number): number[][] {
    const promptBlocks = Array.from({ length: PROMPT / BLOCK }, (_, j) => j);
    const own = (s: number) => this.blocksPerSeq * (s + 1);
    return Array.from({ length: batch }, (_, s) => {
      const extra = Array.from(
        { length: this.blocksPerSeq - promptBlocks.length },
        (_, j) => own(s) + j,
      );
      return [...promptBlocks, ...extra];
    });
  }

  /**
   * Per table of {@linkcode tables}, the array handed to the runner: grown by appending as the
   * position crosses blocks, as the scheduler grows a sequence's table, so the runner's
   * block-table rows (engine/block_table_rows.ts) upload only the new entries.
   */
  readonly #live = new WeakMap<number[], number[]>();

  /** The greedy decode step at position `pos` of the sequences of `tables`, fed `id(s)`. */
  decodeStep(tables: number[][], pos: number, id: (s: number) => number): ForwardBatch {
    const needed = Math.ceil((pos + 1) / BLOCK);
    const live = (t: number[]) => {
      let a = this.#live.get(t);
      if (a === undefined || a.length > needed) this.#live.set(t, a = []);
      while (a.length < needed) a.push(t[a.length]!);
      return a;
    };
    const batch = tables.length;
    const slot = (s: number) => tables[s]![Math.floor(pos / BLOCK)]! * BLOCK + (pos % BLOCK);
    return {
      inputIds: Uint32Array.from({ length: batch }, (_, s) => id(s)),
      positions: new Uint32Array(batch).fill(pos),
      slotMapping: Uint32Array.from({ length: batch }, (_, s) => slot(s)),
      seqs: tables.map((t) => ({
        queryLen: 1,
        contextLen: pos + 1,
        blockTable: live(t),
        sample: { temperature: 0 },
      })),
    };
  }

  /**
   * Decodes `steps` steps of `batch` sequences sharing the prompt, after a step 0 that
   * recomputes each sequence's last prompt token (position PROMPT - 1) and is not timed.
   */
  async decode(batch: number, steps: number): Promise<DecodeResult> {
    const runner = this.runner;
    const tables = this.tables(batch);
    const pending: StepHandle[] = [];
    const probe = new StepCostProbe();
    const timer = runner.ctx.hasTimestamps ? new GpuTimer(runner.ctx, steps) : null;
    let prev = -1;
    let start = 0;
    let cpu0 = 0;
    for (let i = 0; i <= steps; i++) {
      if (i === 1) {
        runner.flush();
        await pending[0]!.result;
        start = performance.now();
        cpu0 = cpuSeconds();
      }
      const input = this.decodeStep(
        tables,
        PROMPT - 1 + i,
        (s) => i === 0 ? PROMPT % this.vocabTokens : runner.sampledRef(prev, s),
      );
      // Steps after the first are timed for their host cost (dispatches, encode + submit).
      const descriptor = i === 0 ? undefined : timer?.passDescriptor(i - 1);
      const run = () =>
        runner.execute(input, {
          overlap: this.overlap,
          readbackBatch: this.readbackBatch,
          descriptor,
        });
      const h = i === 0 ? run() : probe.measure(run);
      prev = h.step;
      pending.push(h);
      if (this.serial) await h.wait();
      if (i >= 1 && pending.length - 1 >= runner.maxInFlight + 1) {
        await pending[pending.length - 1 - runner.maxInFlight]!.wait();
      }
    }
    runner.flush();
    await Promise.all(pending.map((h) => h.result));
    const wallMs = performance.now() - start;
    const cpuS = cpuSeconds() - cpu0;
    const tokensPerS = (batch * steps) / (wallMs / 1000);
    const gpu = timer === null ? null : await readTimeline(runner, timer, steps);
    timer?.destroy();
    return { batch, steps, wallMs, cpuS, tokensPerS, cost: probe.result(), gpu };
  }
}
