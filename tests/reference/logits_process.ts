/**
 * Float64 references for `logits_process` (logit bias and repetition / presence / frequency
 * penalties, vLLM semantics) and `top_logprobs`, written plainly from the definitions.
 *
 * @module
 */

/** One sequence's processing parameters with resolved token ids (no sampled references). */
export interface LogitsProcessRefSeq {
  repetition: number;
  presence: number;
  frequency: number;
  prompt: readonly number[];
  output: readonly number[];
  bias: readonly (readonly [number, number])[];
}

/**
 * Processes `logits` (`[seqs.length, vocab]`) as vLLM does: bias first, then for every distinct
 * token of the prompt or output the repetition penalty (`l > 0 ? l / r : l * r`), then
 * `l -= frequency * count + presence` for tokens in the output. Tokens `>= vocab` are ignored.
 */
export function logitsProcessRef(
  logits: ArrayLike<number>,
  vocab: number,
  seqs: readonly LogitsProcessRefSeq[],
): Float64Array {
  const out = Float64Array.from(logits);
  seqs.forEach((s, row) => {
    const base = row * vocab;
    for (const [t, b] of s.bias) if (t < vocab) out[base + t]! += b;
    const counts = new Map<number, number>();
    for (const t of s.output) if (t < vocab) counts.set(t, (counts.get(t) ?? 0) + 1);
    const seen = new Set<number>([...s.prompt.filter((t) => t < vocab), ...counts.keys()]);
    for (const t of seen) {
      let l = out[base + t]!;
      l = l > 0 ? l / s.repetition : l * s.repetition;
      const c = counts.get(t) ?? 0;
      if (c > 0) l -= s.frequency * c + s.presence;
      out[base + t] = l;
    }
  });
  return out;
}

/**
 * The top `n` tokens of one row by logit (ties: lower id first) and their log-softmax values,
 * computed in float64.
 */
export function topLogprobsRef(
  row: ArrayLike<number>,
  n: number,
): { ids: number[]; logprobs: number[] } {
  let m = -Infinity;
  for (let i = 0; i < row.length; i++) m = Math.max(m, row[i]!);
  let sum = 0;
  for (let i = 0; i < row.length; i++) sum += Math.exp(row[i]! - m);
  const lse = m + Math.log(sum);
  const order = Array.from({ length: row.length }, (_, i) => i);
  order.sort((a, b) => row[b]! - row[a]! || a - b);
  const ids = order.slice(0, Math.min(n, row.length));
  return { ids, logprobs: ids.map((i) => row[i]! - lse) };
}
