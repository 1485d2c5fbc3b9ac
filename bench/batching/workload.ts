/**
 * The batching benchmark's synthetic workload: prompt and output lengths drawn uniformly from
 * fixed ranges with a seeded generator, random prompt token ids (so the prefix cache never
 * hits), and arrival times either all at 0 or with exponential (Poisson process) gaps.
 *
 * @module
 */

/** One request of the workload. */
export interface WorkloadRequest {
  readonly requestId: string;
  readonly promptTokenIds: readonly number[];
  /** max_tokens with ignore_eos: exactly this many tokens are generated. */
  readonly outputLen: number;
  /** Arrival time in ms after the start of the run. */
  readonly arrivalMs: number;
}

/** How requests arrive. */
export type Arrival =
  | { readonly kind: "burst" }
  | { readonly kind: "poisson"; readonly ratePerS: number };

/** Parameters of {@linkcode makeWorkload}. */
export interface WorkloadSpec {
  readonly requests: number;
  readonly seed: number;
  /** Inclusive range of prompt lengths. */
  readonly promptLen: readonly [number, number];
  /** Inclusive range of output lengths. */
  readonly outputLen: readonly [number, number];
  /** Prompt token ids are drawn from [0, vocabSize). */
  readonly vocabSize: number;
  readonly arrival: Arrival;
}

/** mulberry32: a small seeded generator of uniform numbers in [0, 1). */
export function seededRandom(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The workload of `spec`: the same requests for the same seed.
 *
 * @throws {RangeError} on an empty or inverted range, a non-positive count or rate.
 */
export function makeWorkload(spec: WorkloadSpec): WorkloadRequest[] {
  const ranges: [string, readonly [number, number]][] = [
    ["promptLen", spec.promptLen],
    ["outputLen", spec.outputLen],
  ];
  for (const [name, [lo, hi]] of ranges) {
    if (!Number.isInteger(lo) || !Number.isInteger(hi) || lo < 1 || hi < lo) {
      throw new RangeError(`Invalid workload ${name} range [${lo}, ${hi}]: need 1 <= lo <= hi`);
    }
  }
  if (!Number.isInteger(spec.requests) || spec.requests < 1) {
    throw new RangeError(`Invalid workload: ${spec.requests} requests, expected an integer >= 1`);
  }
  if (spec.arrival.kind === "poisson" && !(spec.arrival.ratePerS > 0)) {
    throw new RangeError(`Invalid workload: request rate ${spec.arrival.ratePerS}, expected > 0`);
  }
  const rand = seededRandom(spec.seed);
  const uniform = ([lo, hi]: readonly [number, number]) => lo + Math.floor(rand() * (hi - lo + 1));
  const out: WorkloadRequest[] = [];
  let t = 0;
  for (let i = 0; i < spec.requests; i++) {
    const promptLen = uniform(spec.promptLen);
    const outputLen = uniform(spec.outputLen);
    const promptTokenIds = Array.from(
      { length: promptLen },
      () => Math.floor(rand() * spec.vocabSize),
    );
    if (spec.arrival.kind === "poisson" && i > 0) {
      t += (-Math.log(1 - rand()) / spec.arrival.ratePerS) * 1000;
    }
    out.push({ requestId: `req-${i}`, promptTokenIds, outputLen, arrivalMs: t });
  }
  return out;
}
