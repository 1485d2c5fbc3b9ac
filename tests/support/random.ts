/**
 * Seeded random numbers for tests. Each test draws fresh inputs: the run's base seed comes from
 * the `TEST_SEED` environment variable when set, otherwise from the clock, and each check's seed
 * (derived from it and the check's name, see {@linkcode testSeed}) is printed in its failure
 * messages. To replay one failing check exactly, run its test alone with that printed seed in
 * `TEST_RNG_SEED` (every check of the run then draws from it):
 * `TEST_RNG_SEED=850073341 deno test -A tests/quant_matmul_test.ts --filter "word layout"`.
 *
 * @module
 */

/** A small, fast, seedable PRNG (mulberry32) with uniform, normal and integer draws. */
export class Rng {
  #state: number;

  constructor(seed: number) {
    this.#state = seed >>> 0;
  }

  /** Uniform in [0, 1). */
  next(): number {
    let t = (this.#state = (this.#state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** Uniform in [lo, hi). */
  uniform(lo = -1, hi = 1): number {
    return lo + (hi - lo) * this.next();
  }

  /** Integer uniform in [lo, hi] (inclusive). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }

  /** Standard normal (Box-Muller). */
  normal(): number {
    const u = 1 - this.next();
    const v = this.next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  }

  /** `n` uniform values in [lo, hi). */
  array(n: number, lo = -1, hi = 1): Float32Array {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = this.uniform(lo, hi);
    return out;
  }

  /** `n` normal values scaled by `scale`. */
  normals(n: number, scale = 1): Float32Array {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = this.normal() * scale;
    return out;
  }

  /** A random permutation of 0..n-1. */
  permutation(n: number): number[] {
    const p = Array.from({ length: n }, (_, i) => i);
    for (let i = n - 1; i > 0; i--) {
      const j = Math.floor(this.next() * (i + 1));
      [p[i], p[j]] = [p[j]!, p[i]!];
    }
    return p;
  }
}

/** A seed from the environment variable `name`, or undefined; not a 32-bit integer: an error. */
function envSeed(name: string): number | undefined {
  const text = Deno.env.get(name);
  if (text === undefined) return undefined;
  const seed = Number(text);
  if (!/^\d+$/.test(text) || seed >= 2 ** 32) {
    throw new RangeError(`${name} must be an integer in [0, 2^32): got "${text}"`);
  }
  return seed;
}

const baseSeed = envSeed("TEST_SEED") ?? (Date.now() ^ (Math.random() * 2 ** 31)) >>> 0;
const replaySeed = envSeed("TEST_RNG_SEED");

/**
 * A fresh seed for one test, derived from the run's base seed and the test's name, and an
 * {@linkcode Rng} for it. Put `seed` in assertion messages.
 */
export function testSeed(name: string): { seed: number; rng: Rng } {
  if (replaySeed !== undefined) return { seed: replaySeed, rng: new Rng(replaySeed) };
  let h = baseSeed >>> 0;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  return { seed: h, rng: new Rng(h) };
}

/** The run's base seed (replay a run with `TEST_SEED=<this>`). */
export const BASE_SEED = baseSeed;
