/**
 * Runs one prompt alone through a {@linkcode ModelRunner} with greedy sampling: the prompt in
 * prefill chunks of `chunk` tokens, then one decode step per token, the decode inputs fed from
 * the previous step's sample on the GPU. Blocks come from `blocks` in order (pass a shuffled
 * list to exercise non-contiguous block tables). No scheduler: this is the runner's own check.
 *
 * @module
 */

import type { ModelRunner } from "../../engine/model_runner.ts";

/** Greedily generates `maxTokens` tokens for `prompt`. */
export async function soloGreedy(
  runner: ModelRunner,
  prompt: readonly number[],
  maxTokens: number,
  options: { chunk?: number; blocks?: readonly number[] } = {},
): Promise<number[]> {
  const bs = runner.options.blockSize;
  const blocks = options.blocks ?? Array.from({ length: runner.kv.numBlocks }, (_, i) => i);
  const chunk = options.chunk ?? prompt.length;
  const table = (len: number) => blocks.slice(0, Math.ceil(len / bs));
  const slot = (pos: number) => blocks[Math.floor(pos / bs)]! * bs + (pos % bs);
  const out: number[] = [];
  let done = 0;
  let last: { step: number; result: Promise<{ tokens: Uint32Array }> } | undefined;
  while (done < prompt.length) {
    const n = Math.min(chunk, prompt.length - done);
    const positions = Uint32Array.from({ length: n }, (_, i) => done + i);
    const step = runner.execute({
      inputIds: Uint32Array.from(prompt.slice(done, done + n)),
      positions,
      slotMapping: positions.map(slot),
      seqs: [{
        queryLen: n,
        contextLen: done + n,
        blockTable: table(done + n),
        sample: done + n === prompt.length ? { temperature: 0 } : null,
      }],
    });
    done += n;
    last = step;
  }
  // Decode steps are submitted without waiting: each feeds on the previous sample on the GPU.
  const pending: Promise<{ tokens: Uint32Array }>[] = [last!.result];
  let prev = last!.step;
  for (let i = 1; i < maxTokens; i++) {
    const pos = prompt.length + i - 1;
    const step = runner.execute({
      inputIds: Uint32Array.of(runner.sampledRef(prev, 0)),
      positions: Uint32Array.of(pos),
      slotMapping: Uint32Array.of(slot(pos)),
      seqs: [{
        queryLen: 1,
        contextLen: pos + 1,
        blockTable: table(pos + 1),
        sample: { temperature: 0 },
      }],
    });
    pending.push(step.result);
    prev = step.step;
    if (pending.length - out.length >= 6) out.push((await pending[out.length]!).tokens[0]!);
  }
  while (out.length < pending.length) out.push((await pending[out.length]!).tokens[0]!);
  return out;
}
