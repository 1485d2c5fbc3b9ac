/**
 * Benchmarks decode attention (`reshape_and_cache` is negligible beside it and not timed) at
 * Qwen3-0.6B shapes: 16 query heads, 8 kv heads, head_dim 128, block size 16, KV cache in the
 * context's weight dtype (f16 on lavapipe) and in fp8 (`--kv-cache-dtype fp8`; e4m3 codes
 * decoded as they are read), for contexts of 512 and 2048 tokens and batches of 1, 16 and 64
 * sequences, with the direct path and with split-K (partitions of 512 tokens;
 * `DECODE_PARTITIONS=16,64,512`, `DECODE_CONTEXTS=160,512` and `DECODE_KV_DTYPES=auto` or
 * `fp8_e4m3` choose others), each at every workgroup width the kernel runs here
 * (kernels/decode_split.ts DECODE_WIDTHS: 64 and 256).
 *
 * Run: `deno bench -A bench/attention_bench.ts`. The printed lines are GPU times from timestamp
 * queries (bench/support.ts timeGpu). "KV GB/s" counts the K and V bytes a call must read
 * (batch * context * Hkv * head_dim * 2 tensors * bytes per element) over the median time, next to
 * the copy bandwidth (read + write) measured in the same run. One layer's cache binding holds at
 * most `maxStorageBufferBindingSize` bytes (128 MiB on lavapipe = 65536 tokens at these shapes),
 * so larger batches draw their blocks from a shuffled pool of that size (block tables then share
 * physical blocks; every read still comes from a working set far above the CPU caches). The
 * `Deno.bench` entries time one submission with the host clock, so they include the ~10 ms wait
 * floor.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../gpu/context.ts";
import { kvBytesPerElement, type KvDtype } from "../gpu/dtype.ts";
import { ParamArena } from "../gpu/params.ts";
import { PagedAttentionDecode } from "../kernels/paged_attention_decode.ts";
import {
  benchSubmission,
  copyBandwidthText,
  type KernelCase,
  medianText,
  openKernelBench,
  timeCase,
  uploadBuffer,
} from "./lib/kernel_bench.ts";

const HQ = 16;
const HKV = 8;
const HEAD_DIM = 128;
const BLOCK = 16;
/** Positive integers from the environment variable `name` ("a,b,..."), else `fallback`. */
function envInts(name: string, fallback: string): number[] {
  const text = Deno.env.get(name) ?? fallback;
  const values = text.split(",").map(Number);
  if (values.some((v) => !Number.isInteger(v) || v < 1)) {
    console.error(`error: ${name} expects positive integers, got "${text}"`);
    Deno.exit(2);
  }
  return values;
}

/** Context lengths ($DECODE_CONTEXTS, e.g. "160,512"; default 512 and 2048). */
const CONTEXTS = envInts("DECODE_CONTEXTS", "512,2048");
const BATCHES = [1, 16, 64];

/** KV cache dtypes ($DECODE_KV_DTYPES: `auto`, the weights', and `fp8_e4m3`; default both). */
const KV_DTYPES: readonly ("auto" | "fp8_e4m3")[] = (() => {
  const text = Deno.env.get("DECODE_KV_DTYPES") ?? "auto,fp8_e4m3";
  const names = text.split(",");
  if (names.some((n) => n !== "auto" && n !== "fp8_e4m3")) {
    console.error(`error: DECODE_KV_DTYPES expects auto and / or fp8_e4m3, got "${text}"`);
    Deno.exit(2);
  }
  return names as ("auto" | "fp8_e4m3")[];
})();

/**
 * A cache buffer of `bytes` filled with a repeated 1 MiB pattern of random `kv` values: f16 / f32
 * in [-1, 1), or e4m3 codes of magnitudes 2^-6 to 1.875 of either sign.
 */
function randomCache(ctx: GpuContext, bytes: number, label: string, kv: KvDtype): GPUBuffer {
  const b = ctx.createBuffer(label, bytes, STORAGE_RW);
  const chunk = 1 << 20;
  const random = () => Math.floor(Math.random() * 256);
  const pattern = kv === "fp8_e4m3"
    ? Uint8Array.from({ length: chunk }, () => (random() & 0x87) | ((1 + (random() % 7)) << 3))
    : kv === "f16"
    ? Float16Array.from({ length: chunk / 2 }, () => Math.random() * 2 - 1)
    : Float32Array.from({ length: chunk / 4 }, () => Math.random() * 2 - 1);
  for (let off = 0; off < bytes; off += chunk) {
    ctx.device.queue.writeBuffer(b, off, pattern.buffer, 0, Math.min(chunk, bytes - off));
  }
  return b;
}

/**
 * Bound decode attention over `batch` sequences of `contextLen` tokens: the call on the direct
 * path or split-K (`call(split)`); `kvBytes` is what one call must read of K and V.
 */
function setup(
  ctx: GpuContext,
  batch: number,
  contextLen: number,
  partitionSize = 512,
  kv: KvDtype = ctx.weightDtype,
) {
  const tokenBytes = HKV * HEAD_DIM * kvBytesPerElement(kv);
  const blocksPer = Math.ceil(contextLen / BLOCK);
  const poolBlocks = Math.min(
    batch * blocksPer,
    Math.floor(ctx.maxBindingBytes / (tokenBytes * BLOCK)),
  );
  const order = Array.from({ length: poolBlocks }, (_, i) => i);
  for (let i = poolBlocks - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  const blockTables = Uint32Array.from(
    { length: batch * blocksPer },
    (_, i) => order[i % poolBlocks]!,
  );
  const qStride = (HQ + 2 * HKV) * HEAD_DIM;
  const buffers = {
    q: uploadBuffer(ctx, "q", Float32Array.from({ length: batch * qStride }, () => Math.random())),
    kCache: randomCache(ctx, poolBlocks * BLOCK * tokenBytes, "k_cache", kv),
    vCache: randomCache(ctx, poolBlocks * BLOCK * tokenBytes, "v_cache", kv),
    blockTables: uploadBuffer(ctx, "block_tables", blockTables),
    contextLens: uploadBuffer(ctx, "context_lens", new Uint32Array(batch).fill(contextLen)),
    out: ctx.createBuffer("out", batch * HQ * HEAD_DIM * 4, STORAGE_RW),
  };
  const kernel = new PagedAttentionDecode(ctx, {
    numQHeads: HQ,
    numKvHeads: HKV,
    headDim: HEAD_DIM,
    blockSize: BLOCK,
    partitionSize,
    dtype: kv,
  });
  const scratch = kernel.createScratch(batch, contextLen);
  const arena = new ParamArena(ctx, 2);
  const op = kernel.bind(arena, {
    q: { buffer: buffers.q },
    kCache: { buffer: buffers.kCache },
    vCache: { buffer: buffers.vCache },
    blockTables: { buffer: buffers.blockTables },
    contextLens: { buffer: buffers.contextLens },
    out: { buffer: buffers.out },
    scratch,
  }, { qStride, btStride: blocksPer });
  return {
    kvBytes: 2 * batch * contextLen * tokenBytes,
    widths: kernel.widths,
    call: (split: boolean, width?: number): KernelCase => ({
      arena,
      encode: (pass) => op.encode(pass, batch, contextLen, split, false, width),
    }),
    destroy: () => {
      for (const b of Object.values(buffers)) b.destroy();
      scratch.destroy();
      arena.destroy();
    },
  };
}

const { ctx, copyGBs } = await openKernelBench(
  "paged_attention decode",
  { detail: (c) => `; KV ${KV_DTYPES.map((d) => d === "auto" ? c.weightDtype : d).join(", ")}` },
);
console.log(
  `Hq ${HQ}, Hkv ${HKV}, head_dim ${HEAD_DIM}, block ${BLOCK}; ${copyBandwidthText(copyGBs)}`,
);
const partitionSizes = envInts("DECODE_PARTITIONS", "512");
for (const contextLen of CONTEXTS) {
  for (const batch of BATCHES) {
    for (
      const [partitionSize, choice] of partitionSizes.flatMap((p) =>
        KV_DTYPES.map((d) => [p, d] as const)
      )
    ) {
      const kv = choice === "auto" ? ctx.weightDtype : choice;
      const s = setup(ctx, batch, contextLen, partitionSize, kv);
      try {
        for (const [split, width] of s.widths.flatMap((w) => [[false, w], [true, w]] as const)) {
          const repeats = s.kvBytes > 64 << 20 ? 4 : 8;
          const t = await timeCase(ctx, () => s.call(split, width), { warmup: 1, repeats });
          const path = `${split ? `split-K ${partitionSize}` : "direct"}, ${width} wide`;
          console.log(
            `  context ${contextLen}, batch ${batch}${
              choice === "auto" ? "" : ` (KV ${kv})`
            }, ${path}: ${medianText(t, 3)}, ` +
              `KV ${(s.kvBytes / 1e6).toFixed(1)} MB, ` +
              `${(s.kvBytes / (t.medianMs * 1e6)).toFixed(1)} GB/s effective vs copy ` +
              `${copyGBs.toFixed(1)} GB/s (${t.method})`,
          );
        }
      } finally {
        s.destroy();
      }
    }
  }
}

for (const contextLen of CONTEXTS) {
  for (const batch of [1, 16]) {
    for (const split of [false, true]) {
      benchSubmission(
        ctx,
        `paged_attention decode ctx ${contextLen} batch ${batch} ${
          split ? "split-K" : "direct"
        } (host clock, one submission)`,
        setup(ctx, batch, contextLen).call(split),
      );
    }
  }
}
