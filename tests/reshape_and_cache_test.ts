import { deepStrictEqual } from "node:assert/strict";
import { kvBytesPerElement, type KvDtype } from "../gpu/dtype.ts";
import { readBuffer } from "../gpu/readback.ts";
import { ReshapeAndCache, SKIP_SLOT } from "../kernels/reshape_and_cache.ts";
import { GPU_TEST, ParamArena, runPass, testContext, upload, whole } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { reshapeAndCacheRef } from "./reference/attention.ts";
import { fromKvData, roundToKv, toKvData } from "./reference/kv_values.ts";

const CASES = [
  // [numQHeads, numKvHeads, headDim, blockSize, numBlocks, tokens]
  [16, 8, 128, 16, 6, 37],
  [4, 2, 64, 8, 5, 9],
  [8, 1, 40, 32, 3, 70],
  [2, 2, 4, 16, 2, 1],
] as const;

for (const dtype of ["f32", "f16", "fp8_e4m3"] as const satisfies readonly KvDtype[]) {
  Deno.test(
    `reshape_and_cache() writes exactly the mapped slots, skips SKIP_SLOT tokens, ${dtype} cache`,
    GPU_TEST,
    async () => {
      const ctx = await testContext();
      if (dtype === "f16" && !ctx.hasF16) return;
      const kernel = new ReshapeAndCache(ctx, dtype);
      for (const [hq, hkv, headDim, blockSize, numBlocks, tokens] of CASES) {
        const shapeName = `Hq ${hq} Hkv ${hkv} D ${headDim} block ${blockSize} tokens ${tokens}`;
        const { seed, rng } = testSeed(`reshape_and_cache ${dtype} ${shapeName}`);
        const context = `seed ${seed} ${dtype} ${shapeName}`;
        // Fused [q | k | v] rows plus 4 columns of padding to exercise srcStride.
        const srcStride = (hq + 2 * hkv) * headDim + 4;
        const src = rng.array(tokens * srcStride, -4, 4);
        // fp8: magnitudes from e4m3's subnormals (< 2^-6) past its largest value (448, saturated).
        if (dtype === "fp8_e4m3") src.forEach((x, i) => src[i] = x * 2 ** rng.int(-10, 7));
        // Distinct random slots, every third token skipped.
        const slots = rng.permutation(numBlocks * blockSize);
        const slotMapping = Uint32Array.from(
          { length: tokens },
          (_, t) => (t % 3 === 1 ? SKIP_SLOT : slots[t]!),
        );
        const cacheLen = numBlocks * hkv * blockSize * headDim;
        // Random initial contents: the bytes uploaded, and the values they hold. (The bytes come
        // from the raw values: an fp8 -0 from roundToKv would be re-encoded as +0.)
        const [kRaw, vRaw] = [rng.array(cacheLen, -1, 1), rng.array(cacheLen, -1, 1)];
        const [kInit, vInit] = [roundToKv(kRaw, dtype), roundToKv(vRaw, dtype)];
        const kCache = upload(ctx, toKvData(kRaw, dtype), "k_cache");
        const vCache = upload(ctx, toKvData(vRaw, dtype), "v_cache");
        const arena = new ParamArena(ctx, 2);
        const shape = {
          numKvHeads: hkv,
          headDim,
          blockSize,
          srcStride,
          kOffset: hq * headDim,
          vOffset: (hq + hkv) * headDim,
        };
        const op = kernel.bind(arena, {
          src: whole(upload(ctx, src)),
          slotMapping: whole(upload(ctx, slotMapping)),
          kCache: whole(kCache),
          vCache: whole(vCache),
        }, shape);
        await runPass(ctx, arena, (pass) => op.encode(pass, tokens));
        const expected = reshapeAndCacheRef(src, slotMapping, kInit, vInit, { ...shape, dtype });
        for (
          const [name, buffer, want] of [["K", kCache, expected.k], [
            "V",
            vCache,
            expected.v,
          ]] as const
        ) {
          const bytes = await readBuffer(ctx, buffer, 0, cacheLen * kvBytesPerElement(dtype));
          const got = fromKvData(bytes, dtype);
          const mismatches: string[] = [];
          for (let i = 0; i < cacheLen && mismatches.length < 5; i++) {
            if (!Object.is(got[i], want[i])) {
              mismatches.push(`[${i}] got ${got[i]}, expected ${want[i]}`);
            }
          }
          deepStrictEqual(mismatches, [], `${context}: ${name} cache differs`);
        }
      }
    },
  );
}
