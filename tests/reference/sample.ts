/**
 * Float64 references of the `sample` kernel: the raw log-softmax, greedy argmax, the filtered,
 * temperature-scaled distribution a random draw must follow, and the chi-square statistics the
 * goodness-of-fit tests use.
 *
 * @module
 */

/** Sampling parameters in the kernel's units (defaults: greedy, no filters). */
export interface SampleRefParams {
  temperature: number;
  topK?: number;
  topP?: number;
  minP?: number;
}

/** Index of the largest value, lowest index on ties (`-Infinity` rows give 0). */
export function argmaxRef(row: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i;
  return best;
}

/** `log_softmax(row)[index]` in float64. */
export function logSoftmaxAtRef(row: ArrayLike<number>, index: number): number {
  let m = -Infinity;
  for (let i = 0; i < row.length; i++) m = Math.max(m, row[i]!);
  let sum = 0;
  for (let i = 0; i < row.length; i++) sum += Math.exp(row[i]! - m);
  return row[index]! - m - Math.log(sum);
}

/**
 * The distribution a random draw must follow: temperature softmax restricted to the tokens that
 * survive min-p (`l >= max + T log(minP)`), then top-k (`l >=` the k-th largest survivor; ties
 * kept), then top-p (keep i when the survivors' mass with a strictly larger logit is
 * `< topP * survivors' mass`), renormalised. Filtered tokens get probability 0.
 */
export function filteredDistributionRef(
  row: ArrayLike<number>,
  params: SampleRefParams,
): Float64Array {
  const n = row.length;
  const t = params.temperature;
  let m = -Infinity;
  for (let i = 0; i < n; i++) m = Math.max(m, row[i]!);
  const keep = new Array<boolean>(n);
  const minP = params.minP ?? 0;
  for (let i = 0; i < n; i++) {
    keep[i] = row[i]! > -Infinity && (minP <= 0 || row[i]! >= m + t * Math.log(minP));
  }
  const survivors = () => Array.from({ length: n }, (_, i) => i).filter((i) => keep[i]);
  const topK = params.topK ?? 0;
  if (topK > 0) {
    const sorted = survivors().map((i) => row[i]!).sort((a, b) => b - a);
    if (sorted.length > topK) {
      const kth = sorted[topK - 1]!;
      for (let i = 0; i < n; i++) keep[i] = keep[i]! && row[i]! >= kth;
    }
  }
  const q = Float64Array.from({ length: n }, (_, i) => keep[i] ? Math.exp((row[i]! - m) / t) : 0);
  const topP = params.topP ?? 1;
  if (topP < 1) {
    const total = q.reduce((a, b) => a + b, 0);
    const kept = survivors().sort((a, b) => row[b]! - row[a]!);
    // Walk groups of equal logits from the largest; `larger` is the mass strictly above a group.
    let larger = 0;
    for (let g = 0; g < kept.length;) {
      let end = g;
      let groupMass = 0;
      while (end < kept.length && row[kept[end]!] === row[kept[g]!]) groupMass += q[kept[end++]!]!;
      if (!(larger < topP * total)) { for (let j = g; j < end; j++) q[kept[j]!] = 0; }
      larger += groupMass;
      g = end;
    }
  }
  const total = q.reduce((a, b) => a + b, 0);
  return q.map((v) => v / total);
}

/**
 * Mass thresholds where the top-p kept set changes for `row` after min-p / top-k: the
 * cumulative (descending) mass fractions of the distinct logits. Tests pick `topP` between two of
 * them so float rounding cannot change the kept set.
 */
export function topPBreakpointsRef(row: ArrayLike<number>, temperature: number): number[] {
  const values = [...new Set(Array.from(row))].sort((a, b) => b - a);
  const m = values[0]!;
  let total = 0;
  for (let i = 0; i < row.length; i++) total += Math.exp((row[i]! - m) / temperature);
  const out: number[] = [];
  let acc = 0;
  for (const v of values) {
    for (let i = 0; i < row.length; i++) if (row[i] === v) acc += Math.exp((v - m) / temperature);
    out.push(acc / total);
  }
  return out;
}

/** Pearson's chi-square statistic and its degrees of freedom, bins of expectation < 5 pooled. */
export function chiSquareRef(
  observed: ArrayLike<number>,
  probabilities: ArrayLike<number>,
): { statistic: number; dof: number } {
  const draws = Array.from(observed).reduce((a, b) => a + b, 0);
  let statistic = 0;
  let bins = 0;
  let poolObs = 0;
  let poolExp = 0;
  for (let i = 0; i < observed.length; i++) {
    const e = probabilities[i]! * draws;
    if (e === 0) continue;
    if (e < 5) {
      poolObs += observed[i]!;
      poolExp += e;
      continue;
    }
    statistic += (observed[i]! - e) ** 2 / e;
    bins++;
  }
  if (poolExp > 0) {
    statistic += (poolObs - poolExp) ** 2 / poolExp;
    bins++;
  }
  return { statistic, dof: bins - 1 };
}

/**
 * Upper critical value of the chi-square distribution with `dof` degrees of freedom at
 * p = 0.001 (Wilson-Hilferty approximation, within ~1% for dof >= 3).
 */
export function chiSquareCritical001(dof: number): number {
  const z = 3.090232306167813; // standard normal quantile at 1 - 0.001
  const a = 2 / (9 * dof);
  return dof * (1 - a + z * Math.sqrt(a)) ** 3;
}

/** `ids[t] = hostIds[t]` unless bit 31 is set, then the sampled id it refers to (0 past the end). */
export function tokenFeedRef(hostIds: Uint32Array, sampled: Uint32Array): Uint32Array {
  return hostIds.map((h) => (h & 0x80000000) !== 0 ? (sampled[h & 0x7fffffff] ?? 0) : h);
}
