import { ok, throws } from "node:assert/strict";
import { Embedding } from "../kernels/embedding.ts";
import { type DType, roundTo } from "../gpu/dtype.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import type { GpuContext } from "../gpu/context.ts";
import { assertClose } from "./support/assert_close.ts";
import {
  GPU_TEST,
  ParamArena,
  poisonedF32,
  readF32,
  runPass,
  testContext,
  upload,
  whole,
} from "./support/gpu.ts";
import { type Rng, testSeed } from "./support/random.ts";
import { embeddingRef } from "./reference/embedding.ts";
import { quantizeRef } from "./reference/quant.ts";
import { type QuantFormat, quantizeRows, type WordLayout } from "../gpu/quant.ts";

const DTYPES: DType[] = ["f32", "f16"];

/** Random ids in [0, vocab) with repeats, the first and last rows, and out-of-range ids. */
function randomIds(rng: Rng, tokens: number, vocab: number): Uint32Array {
  const ids = Uint32Array.from({ length: tokens }, () => rng.int(0, vocab - 1));
  if (tokens >= 3) {
    ids[0] = vocab - 1;
    ids[1] = 0;
    ids[2] = rng.next() < 0.5 ? vocab : 0xffffffff;
  }
  if (tokens >= 5) ids[4] = ids[3]!;
  return ids;
}

/** Gathers `ids` from a random `[vocab, hidden]` table and checks every output element. */
async function checkGather(
  ctx: GpuContext,
  name: string,
  vocab: number,
  hidden: number,
  tokens: number,
  dtype: DType | QuantFormat,
  options: {
    maxPartBytes?: number;
    minParts?: number;
    accumulate?: boolean;
    layout?: WordLayout;
  } = {},
): Promise<void> {
  const { seed, rng } = testSeed(name);
  const values = rng.normals(vocab * hidden, 1);
  const quant = dtype === "int8" || dtype === "int4" ? dtype : null;
  const table = quant === null
    ? GpuMatrix.fromArray(ctx, "wte", values, vocab, hidden, dtype as DType, {
      maxPartBytes: options.maxPartBytes,
    })
    : GpuMatrix.fromQuantized(
      ctx,
      "wte",
      vocab,
      hidden,
      quant,
      quantizeRows(values, hidden, quant),
      {
        maxPartBytes: options.maxPartBytes,
        ...(options.layout === "texture"
          ? { wordStorage: "texture" }
          : options.layout === undefined
          ? {}
          : { wordBlock: options.layout }),
      },
    );
  if (options.layout !== undefined) ok(table.wordLayout === options.layout, name);
  ok(
    table.parts.length >= (options.minParts ?? 1),
    `seed ${seed} ${name}: expected a split table, got ${table.parts.length} parts`,
  );
  const ids = randomIds(rng, tokens, vocab);
  const base = options.accumulate ? rng.normals(tokens * hidden, 1) : undefined;
  const out = base === undefined ? poisonedF32(ctx, tokens * hidden) : upload(ctx, base);
  const arena = new ParamArena(ctx, table.parts.length);
  const op = new Embedding(ctx).bind(
    arena,
    { ids: whole(upload(ctx, ids)), table, out: whole(out) },
    { accumulate: options.accumulate },
  );
  await runPass(ctx, arena, (pass) => op.encode(pass, tokens));
  const stored = quant === null
    ? roundTo(values, dtype as DType)
    : quantizeRef(values, hidden, quant).dequantized;
  const want = embeddingRef(ids, stored, vocab, hidden, base);
  // A gather is exact (f16 -> f32 is exact); accumulate adds one rounding.
  assertClose(
    await readF32(ctx, out),
    want,
    1e-6,
    `seed ${seed} ${name} ids [${ids.slice(0, 8).join(", ")}${tokens > 8 ? ", ..." : ""}]`,
  );
  table.destroy();
}

Deno.test(
  "embedding() gathers rows exactly for odd shapes, f16 and f32 tables",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const dtype of DTYPES) {
      for (
        const [vocab, hidden, tokens] of [[5, 1, 1], [11, 7, 3], [50, 33, 17], [40, 1000, 3], [
          30,
          1024,
          17,
        ]] as const
      ) {
        await checkGather(
          ctx,
          `embedding ${dtype} vocab ${vocab} hidden ${hidden} tokens ${tokens}`,
          vocab,
          hidden,
          tokens,
          dtype,
        );
      }
    }
  },
);

Deno.test("embedding() gathers from a table split across several bindings", GPU_TEST, async () => {
  // maxBindingBytes 4096: 33 columns -> 31 f32 rows (60 f16 rows of stride 34) per part, so
  // 100 rows make 4 (2) parts.
  const small = await testContext({ maxBindingBytes: 4096 });
  for (const dtype of DTYPES) {
    await checkGather(small, `embedding split binding ${dtype}`, 100, 33, 17, dtype, {
      minParts: 2,
    });
  }
  // maxPartBytes 6000 on the default context: 1000 columns -> 1 f32 (3 f16) rows per part.
  const ctx = await testContext();
  for (const dtype of DTYPES) {
    await checkGather(ctx, `embedding split parts ${dtype}`, 20, 1000, 17, dtype, {
      maxPartBytes: 6000,
      minParts: 4,
    });
  }
});

Deno.test("embedding() accumulate adds position embeddings, split or not", GPU_TEST, async () => {
  const ctx = await testContext();
  for (const dtype of DTYPES) {
    await checkGather(ctx, `embedding accumulate ${dtype}`, 64, 33, 17, dtype, {
      accumulate: true,
    });
    await checkGather(ctx, `embedding accumulate split ${dtype}`, 64, 33, 17, dtype, {
      accumulate: true,
      maxPartBytes: 33 * 4 * 10,
      minParts: 4,
    });
  }
});

Deno.test(
  "embedding() gathers dequantized rows of int8 / int4 tables, split or not, in every word layout",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    for (const format of ["int8", "int4"] as const) {
      for (const layout of [1, 16, "texture"] as const) {
        for (
          const [vocab, hidden, tokens] of [[5, 32, 1], [50, 96, 17], [30, 1024, 17]] as const
        ) {
          await checkGather(
            ctx,
            `embedding ${format} vocab ${vocab} hidden ${hidden} word layout ${layout}`,
            vocab,
            hidden,
            tokens,
            format,
            { layout },
          );
        }
      }
      // A texture of three layers (8,192 rows each, gpu/quant.ts; the last block 10 rows).
      await checkGather(ctx, `embedding ${format} texture layers`, 16410, 64, 33, format, {
        layout: "texture",
      });
      // 96 columns: 96 (int8) or 48 (int4) bytes per row; 500-byte parts hold 5 or 10 rows
      // (row by row: 16-row blocks do not fit).
      await checkGather(ctx, `embedding ${format} split`, 50, 96, 17, format, {
        maxPartBytes: 500,
        minParts: 5,
        layout: 1,
      });
      // 1,600-byte parts: one block of 16 int8 rows (1,536 bytes; 4 parts), two of int4 (2).
      await checkGather(ctx, `embedding ${format} split in word blocks`, 50, 96, 17, format, {
        maxPartBytes: 1600,
        minParts: format === "int8" ? 4 : 2,
        layout: 16,
      });
    }
  },
);

Deno.test("embedding() rejects more tokens than the bound buffers hold", GPU_TEST, async () => {
  const ctx = await testContext();
  const table = GpuMatrix.create(ctx, "wte", 10, 8, "f32");
  const op = new Embedding(ctx).bind(new ParamArena(ctx, 1), {
    ids: whole(upload(ctx, new Uint32Array(4))),
    table,
    out: whole(poisonedF32(ctx, 3 * 8)),
  });
  throws(() => op.encode({} as GPUComputePassEncoder, 4), RangeError);
});
