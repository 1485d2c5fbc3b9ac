/**
 * Synthetic serving workloads: seeded random prompt and output lengths, prompts made of random
 * token ids (or random words), and request arrival times (Poisson, or gamma with burstiness).
 *
 * @module
 */

/** Seedable PRNG (SplitMix32-seeded xorshift-multiply generator); deterministic per seed. */
export class Rng {
  #s: number;

  constructor(seed: number) {
    // Mix the seed so that nearby seeds give unrelated streams.
    let z = (Math.floor(seed) ^ 0x9e3779b9) >>> 0;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    this.#s = (z ^ (z >>> 16)) >>> 0;
  }

  /** Uniform in [0, 1) with 32 random bits. */
  next(): number {
    this.#s = (this.#s + 0x9e3779b9) >>> 0;
    let z = this.#s;
    z = Math.imul(z ^ (z >>> 16), 0x21f0aaad) >>> 0;
    z = Math.imul(z ^ (z >>> 15), 0x735a2d97) >>> 0;
    return ((z ^ (z >>> 15)) >>> 0) / 4294967296;
  }

  /** Integer uniform in [lo, hi], both inclusive. */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }

  /** Standard normal (Box-Muller). */
  normal(): number {
    const u = 1 - this.next(); // (0, 1]
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * this.next());
  }

  /** Gamma(shape, scale) by Marsaglia-Tsang; shape < 1 boosted with U^(1/shape). */
  gamma(shape: number, scale: number): number {
    if (!(shape > 0) || !(scale > 0)) {
      throw new RangeError(`Gamma needs shape > 0 and scale > 0, got ${shape} and ${scale}`);
    }
    if (shape < 1) return this.gamma(shape + 1, scale) * Math.pow(1 - this.next(), 1 / shape);
    const d = shape - 1 / 3;
    const c = 1 / Math.sqrt(9 * d);
    for (;;) {
      let x: number;
      let v: number;
      do {
        x = this.normal();
        v = 1 + c * x;
      } while (v <= 0);
      v = v * v * v;
      const u = 1 - this.next();
      if (Math.log(u) < 0.5 * x * x + d - d * v + d * Math.log(v)) return d * v * scale;
    }
  }
}

/** An inclusive integer range; `min === max` for a fixed value. */
export interface IntRange {
  readonly min: number;
  readonly max: number;
}

/**
 * Parses "N" or "A:B" (inclusive, A <= B) of integers >= `least`. Throws RangeError naming
 * `what` on bad input.
 */
export function parseRange(text: string, what: string, least = 1): IntRange {
  const m = /^\s*(\d+)\s*(?::\s*(\d+)\s*)?$/.exec(text);
  if (m === null) throw new RangeError(`${what} must be N or A:B (integers), got '${text}'`);
  const min = Number(m[1]);
  const max = m[2] === undefined ? min : Number(m[2]);
  if (min < least) throw new RangeError(`${what} must be at least ${least}, got ${min}`);
  if (max < min) throw new RangeError(`${what} range ${min}:${max} is empty (A > B)`);
  return { min, max };
}

/** How prompts are made. */
export type PromptKind = "tokens" | "words";

/** One planned request. */
export interface PlannedRequest {
  readonly index: number;
  /** Token ids (kind "tokens") or a string of `promptTokens` random words (kind "words"). */
  readonly prompt: string | readonly number[];
  /** Planned prompt length: exact for token ids, approximate (one word each) for words. */
  readonly promptTokens: number;
  readonly maxTokens: number;
}

/** Options for {@linkcode planRequests}. */
export interface WorkloadOptions {
  readonly count: number;
  readonly inputLen: IntRange;
  readonly outputLen: IntRange;
  readonly promptKind: PromptKind;
  /** Token ids are drawn uniformly from this inclusive range (kind "tokens"). */
  readonly vocab: IntRange;
}

const WORDS = (
  "time year people way day man thing woman life child world school state family student " +
  "group country problem hand part place case week company system program question work " +
  "government number night point home water room mother area money story fact month lot " +
  "right study book eye job word business issue side kind head house service friend father " +
  "power hour game line end member law car city community name president team minute idea"
).split(" ");

/** Draws `count` requests with lengths uniform in the given ranges. */
export function planRequests(options: WorkloadOptions, rng: Rng): PlannedRequest[] {
  const out: PlannedRequest[] = [];
  for (let i = 0; i < options.count; i++) {
    const n = rng.int(options.inputLen.min, options.inputLen.max);
    const maxTokens = rng.int(options.outputLen.min, options.outputLen.max);
    let prompt: string | number[];
    if (options.promptKind === "tokens") {
      prompt = Array.from({ length: n }, () => rng.int(options.vocab.min, options.vocab.max));
    } else {
      prompt = Array.from({ length: n }, () => WORDS[rng.int(0, WORDS.length - 1)]!).join(" ");
    }
    out.push({ index: i, prompt, promptTokens: n, maxTokens });
  }
  return out;
}

/**
 * Send times (ms from the start, first request at 0) for `count` requests arriving at `rate`
 * requests per second. Gaps are gamma-distributed with shape `burstiness` and mean `1/rate`
 * (scale `1 / (rate * burstiness)`): burstiness 1 is a Poisson process (exponential gaps),
 * below 1 burstier, above 1 more regular. `rate = Infinity` sends everything at 0.
 */
export function arrivalTimesMs(
  count: number,
  rate: number,
  burstiness: number,
  rng: Rng,
): number[] {
  if (!(rate > 0)) throw new RangeError(`Request rate must be > 0, got ${rate}`);
  if (!(burstiness > 0)) throw new RangeError(`Burstiness must be > 0, got ${burstiness}`);
  const times: number[] = [];
  let t = 0;
  for (let i = 0; i < count; i++) {
    times.push(t);
    if (rate !== Infinity) t += rng.gamma(burstiness, 1 / (rate * burstiness)) * 1000;
  }
  return times;
}
