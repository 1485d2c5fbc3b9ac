/**
 * Measures which prefill attention kernel (kernels/paged_attention_prefill.ts: `workgroup`,
 * `tiled`, ...) is fastest on this adapter for one model's shape: one sequence of `tokens` new
 * tokens and no cached prefix, on buffers made here (zero queries and KV: the time does not
 * depend on the values), each kernel timed as the median of several passes on the GPU
 * (gpu/timer.ts). The engine measures it at two lengths ({@linkcode prefillLengths}) and runs
 * each step's prefill through the kernel measured fastest at the least length that holds the
 * step's new tokens ({@linkcode PrefillChoice}).
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../gpu/context.ts";
import { kvBytesPerElement } from "../gpu/dtype.ts";
import { ParamArena } from "../gpu/params.ts";
import { PassClock } from "../gpu/timer.ts";
import type { PagedAttentionPrefill } from "./paged_attention_prefill.ts";

/** What {@linkcode tunePrefillAttention} measured and chose. */
export interface PrefillAttentionReport {
  /** The fastest kernel's name (`PagedAttentionPrefill.name`). */
  readonly name: string;
  readonly tokens: number;
  /** Each kernel's median time in ms. */
  readonly points: readonly {
    readonly name: string;
    readonly ms: number;
  }[];
  readonly method: string;
  /** The GPU errors of the candidates the adapter could not run (measured as Infinity). */
  readonly failures: readonly string[];
  readonly wallMs: number;
}

/**
 * Times each of `kernels` (compiled for the same shape and KV dtype) on one sequence of `tokens`
 * new tokens with `blockSize`-token KV blocks, and returns the fastest.
 *
 * @throws {RangeError} when `kernels` is empty or `tokens` / `blockSize` is not positive.
 */
export async function tunePrefillAttention(
  ctx: GpuContext,
  kernels: readonly PagedAttentionPrefill[],
  options: { readonly tokens: number; readonly blockSize: number; readonly repeats?: number },
): Promise<PrefillAttentionReport> {
  const t0 = performance.now();
  const { tokens: T, blockSize: bs } = options;
  const first = kernels[0];
  if (first === undefined || ![T, bs].every((n) => Number.isInteger(n) && n >= 1)) {
    throw new RangeError(
      `Cannot tune prefill attention: ${kernels.length} kernels, ${T} tokens, block ${bs}`,
    );
  }
  const { numQHeads: hq, numKvHeads: hkv, headDim: D, dtype } = first.config;
  const blocks = Math.ceil(T / bs);
  const cacheBytes = blocks * hkv * bs * D * kvBytesPerElement(dtype);
  const own: { destroy(): void }[] = [];
  const buffer = (label: string, data: Uint32Array<ArrayBuffer> | number) => {
    const bytes = typeof data === "number" ? data : data.byteLength;
    const b = ctx.createBuffer(`prefill_tuner/${label}`, Math.max(16, bytes), STORAGE_RW);
    if (typeof data !== "number") ctx.device.queue.writeBuffer(b, 0, data);
    own.push(b);
    return { buffer: b };
  };
  try {
    const buffers = {
      q: buffer("q", 4 * T * hq * D),
      kCache: buffer("k", cacheBytes),
      vCache: buffer("v", cacheBytes),
      blockTables: buffer("block_tables", Uint32Array.from({ length: blocks }, (_, i) => i)),
      cuQLens: buffer("cu_q_lens", Uint32Array.of(0, T)),
      contextLens: buffer("context_lens", Uint32Array.of(T)),
      out: buffer("out", 4 * T * hq * D),
    };
    const arena = new ParamArena(ctx, kernels.length, "prefill-tuning");
    own.push(arena);
    const clock = new PassClock(ctx, arena, options.repeats);
    // The kernels timed together (PassClock.medianMsEach), each with its own parameter slot.
    const times = await clock.medianMsEach(kernels.map((kernel) => () => {
      const op = kernel.bind(arena, buffers, { blockSize: bs, btStride: blocks });
      const tiles = kernel.countTiles([T]);
      return (pass) => op.encode(pass, 1, T, tiles);
    }));
    const points = kernels.map((kernel, i) => ({ name: kernel.name, ms: times[i]! }));
    ctx.check();
    const best = points.reduce((a, p) => (p.ms < a.ms ? p : a));
    return {
      name: best.name,
      tokens: T,
      points,
      method: clock.method,
      failures: clock.failures,
      wallMs: performance.now() - t0,
    };
  } finally {
    for (const o of own) o.destroy();
  }
}

/** The prefill attention kernel of steps of up to `tokens` new tokens (one measured length). */
export interface PrefillLengthChoice {
  readonly tokens: number;
  /** The kernel's name (`PagedAttentionPrefill.name`). */
  readonly name: string;
}

/**
 * The prefill attention kernel per step length, by ascending `tokens`: a step of N new tokens
 * runs the first entry whose `tokens` hold N, a longer one the last entry's.
 */
export type PrefillChoice = readonly PrefillLengthChoice[];

/**
 * The prompt lengths the prefill attention is measured at for prefills of up to `tokens` new
 * tokens: a quarter of it (from 16 tokens) and `tokens`. A kernel of few rows a workgroup may win
 * a short prompt (a 128-token prefill gives 32-row tiles 4 workgroups a kv head) and lose a long
 * one.
 */
export function prefillLengths(tokens: number): number[] {
  const short = Math.ceil(tokens / 4);
  return short >= 16 ? [short, tokens] : [tokens];
}

/** The kernel name `choice` gives a step of `tokens` new tokens. */
export function prefillChoiceAt(choice: PrefillChoice, tokens: number): string {
  const last = choice[choice.length - 1];
  if (last === undefined) throw new RangeError("Cannot choose a prefill attention: no choice");
  return (choice.find((c) => tokens <= c.tokens) ?? last).name;
}

/**
 * Checks plain data read back (a cache file) as a {@linkcode PrefillChoice} measured at
 * `lengths` among the kernels `names`.
 *
 * @throws {TypeError} naming what is wrong.
 */
export function parsePrefillChoice(
  data: unknown,
  names: readonly string[],
  lengths: readonly number[],
): PrefillChoice {
  if (!Array.isArray(data) || data.length !== lengths.length) {
    throw new TypeError(
      `prefill attention choice ${JSON.stringify(data)} is not one entry per length (${lengths})`,
    );
  }
  return data.map((d, i) => {
    const o = d as { tokens?: unknown; name?: unknown } | null;
    if (o?.tokens !== lengths[i]) {
      throw new TypeError(`prefill attention choice ${i}: tokens ${o?.tokens}, not ${lengths[i]}`);
    }
    const name = names.find((n) => n === o?.name);
    if (name === undefined) {
      throw new TypeError(`prefill attention ${JSON.stringify(o?.name)} is not one of ${names}`);
    }
    return { tokens: lengths[i]!, name };
  });
}

/**
 * `choice` in words, e.g. "prefill attention blocked br8 up to 128 tokens, blocked above (of
 * workgroup, blocked, blocked br8; 128 and 512 tokens)".
 */
export function describePrefillChoice(choice: PrefillChoice, names: readonly string[]): string {
  const lengths = choice.map((c) => c.tokens).join(" and ");
  const chosen = choice.every((c) => c.name === choice[0]?.name)
    ? `${choice[0]?.name}`
    : choice.map((c, i) =>
      i < choice.length - 1 ? `${c.name} up to ${c.tokens} tokens` : `${c.name} above`
    ).join(", ");
  return `prefill attention ${chosen} (of ${names.join(", ")}; ${lengths} tokens)`;
}
