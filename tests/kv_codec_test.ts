import { deepStrictEqual } from "node:assert/strict";
import { kvLoad8Prelude, kvVec4Prelude } from "../kernels/kv_codec.ts";
import type { GpuContext } from "../gpu/context.ts";
import type { KvDtype } from "../gpu/dtype.ts";
import {
  GPU_TEST,
  ParamArena,
  poisonedF32,
  poisonedU32,
  readF32,
  readU32,
  runPass,
  testContext,
  upload,
} from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { e4m3Code, e4m3Value } from "./reference/fp8.ts";

/**
 * A test kernel over the KV prelude of `dtype`: word i of `codes` = kv_pack(vals[i]) (fp8: 4
 * codes), `decoded[i]` = kv4(words[i]), `staged[i]` = kv_stage(words[i]) as f32.
 */
function codecKernel(ctx: GpuContext, dtype: KvDtype): GPUComputePipeline {
  return ctx.pipeline(`test/kv_codec/${dtype}`, () =>
    kvVec4Prelude(ctx, dtype) + `
@group(0) @binding(0) var<storage, read> vals: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> codes: array<KVT>;
@group(0) @binding(2) var<storage, read> words: array<KVT>;
@group(0) @binding(3) var<storage, read_write> decoded: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> staged: array<vec4<f32>>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3u) {
  let i = gid.x;
  if (i < arrayLength(&vals)) {
    codes[i] = kv_pack(vals[i]);
  }
  if (i < arrayLength(&words)) {
    decoded[i] = kv4(words[i]);
    staged[i] = vec4<f32>(kv_stage(words[i]));
  }
}
`);
}

/** Runs the codec kernel on `vals` (a multiple of 4) and fp8 `words`. */
async function runCodec(
  ctx: GpuContext,
  vals: Float32Array,
  words: Uint32Array,
): Promise<{ codes: Uint32Array; decoded: Float32Array; staged: Float32Array }> {
  const pipeline = codecKernel(ctx, "fp8_e4m3");
  const codes = poisonedU32(ctx, vals.length / 4);
  const decoded = poisonedF32(ctx, words.length * 4);
  const staged = poisonedF32(ctx, words.length * 4);
  const group = ctx.device.createBindGroup({
    layout: pipeline.getBindGroupLayout(0),
    entries: [
      upload(ctx, vals),
      codes,
      upload(ctx, words),
      decoded,
      staged,
    ].map((buffer, binding) => ({ binding, resource: { buffer } })),
  });
  await runPass(ctx, new ParamArena(ctx, 1), (pass) => {
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(Math.ceil(Math.max(vals.length / 4, words.length) / 64));
  });
  return {
    codes: await readU32(ctx, codes),
    decoded: await readF32(ctx, decoded),
    staged: await readF32(ctx, staged),
  };
}

/** Values where an e4m3 rounding can go wrong, and random ones over the whole range. */
function hardValues(seedName: string): { seed: number; values: number[] } {
  const { seed, rng } = testSeed(seedName);
  const mags = Array.from({ length: 0x7f }, (_, c) => e4m3Value(c));
  const values: number[] = [...mags];
  for (let c = 0; c + 1 < mags.length; c++) {
    const mid = (mags[c]! + mags[c + 1]!) / 2;
    // The midpoint (a tie: to the even code) and the f32 values just beside it.
    const f = new Float32Array([mid, mid, mid]);
    const u = new Uint32Array(f.buffer);
    u[0]! -= 1;
    u[2]! += 1;
    values.push(...f);
  }
  // Subnormal multiples of 2^-10, past 448 (saturated), the extremes.
  for (let k = 0; k <= 20; k++) values.push(k * 2 ** -10);
  values.push(448, 449, 463.9, 464, 465, 480, 1e6, 3e38, Infinity, 0);
  for (let i = 0; i < 2000; i++) values.push(2 ** rng.uniform(-14, 10));
  // Both signs, in a random order.
  const all = [...values, ...values.map((v) => -v)];
  return { seed, values: rng.permutation(all.length).map((i) => all[i]!) };
}

Deno.test(
  "kv_pack() of an fp8 cache writes the nearest e4m3 code, ties to even, saturated at 448",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { seed, values } = hardValues("kv_codec fp8 pack");
    while (values.length % 4 !== 0) values.push(0.5);
    const vals = Float32Array.from(values);
    const { codes } = await runCodec(ctx, vals, new Uint32Array(4));
    const mismatches: string[] = [];
    for (let i = 0; i < vals.length && mismatches.length < 8; i++) {
      const got = (codes[i >> 2]! >>> (8 * (i & 3))) & 0xff;
      const want = e4m3Code(vals[i]!);
      if (got !== want) {
        mismatches.push(`${vals[i]}: code 0x${got.toString(16)}, expected 0x${want.toString(16)}`);
      }
    }
    deepStrictEqual(mismatches, [], `seed ${seed}`);
  },
);

Deno.test(
  "kv4() and kv_stage() of an fp8 cache read every e4m3 code as its value, 0x7F and 0xFF as NaN",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const { rng } = testSeed("kv_codec fp8 unpack");
    const order = rng.permutation(256);
    while (order.length % 4 !== 0) order.push(0x38);
    const words = Uint32Array.from(
      { length: order.length / 4 },
      (_, w) =>
        (order[4 * w]! | (order[4 * w + 1]! << 8) | (order[4 * w + 2]! << 16) |
          (order[4 * w + 3]! << 24)) >>> 0,
    );
    const { decoded, staged } = await runCodec(ctx, new Float32Array(4), words);
    const mismatches: string[] = [];
    for (let i = 0; i < order.length && mismatches.length < 8; i++) {
      const want = e4m3Value(order[i]!);
      for (const [name, got] of [["kv4", decoded[i]!], ["kv_stage", staged[i]!]] as const) {
        if (!Object.is(got, want)) {
          mismatches.push(`${name}(0x${order[i]!.toString(16)}) = ${got}, expected ${want}`);
        }
      }
    }
    deepStrictEqual(mismatches, []);
  },
);

Deno.test("kvLoad8Prelude() and kvVec4Prelude() refuse an f16 cache without shader-f16", async () => {
  const ctx = await testContext();
  const noF16 = { ...ctx, hasF16: false } as GpuContext;
  for (const prelude of [kvVec4Prelude, kvLoad8Prelude]) {
    let message = "";
    try {
      prelude(noF16, "f16");
    } catch (e) {
      message = (e as Error).message;
    }
    deepStrictEqual(
      message,
      "Cannot compile an f16 KV cache kernel: the adapter lacks shader-f16",
    );
  }
});
