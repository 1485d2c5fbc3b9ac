import assert from "node:assert/strict";
import { z } from "zod";
import { runPrefillDecodeBench } from "../bench/prefill_decode.ts";
import {
  decodeCost,
  layerLinearParams,
  type ModelShape,
  prefillCost,
  rooflineMs,
  STANDARD_SHAPES,
  totalParams,
} from "../bench/lib/roofline.ts";
import { GPU_TEST } from "./support/gpu.ts";

/** 1 layer, hidden 2, 1 head of 2 (1 KV head), gated MLP of 4, vocab 3, tied embeddings. */
const TOY: ModelShape = {
  name: "toy",
  layers: 1,
  hidden: 2,
  heads: 1,
  kvHeads: 1,
  headDim: 2,
  intermediate: 4,
  vocab: 3,
  gatedMlp: true,
  tiedEmbeddings: true,
};
const F16 = { weightBytes: 2, kvBytes: 2 };

Deno.test("prefillCost() and decodeCost() match FLOPs and bytes counted by hand on a toy shape", () => {
  // q 2x2 + k, v 2x2 each + o 2x2 + gate, up, down 3 x 2x4 = 4 + 8 + 4 + 24.
  assert.equal(layerLinearParams(TOY), 40);
  assert.equal(totalParams(TOY), 46); // + tied 3 x 2 embedding
  // Prefill of 2 tokens: linear 2*2*40 = 160; attention 2*2 dims*(1+2) keys*2 (QK, PV) = 24;
  // LM head on 1 row 2*3*2 = 12. Bytes: weights (40 + 6) * 2 = 92; KV 2 tokens*K,V*2 dims*2 B = 16.
  assert.deepEqual(prefillCost(TOY, F16, 2), { flops: 196, bytes: 108 });
  // Decode at context 3: linear 80 + attention 4*2*3 = 24 + LM head 12; bytes 92 + KV 3*2*2*2 = 24.
  assert.deepEqual(decodeCost(TOY, F16, 3), { flops: 116, bytes: 116 });
  // Batch 2 shares the weights: flops x2, KV x2.
  assert.deepEqual(decodeCost(TOY, F16, 3, 2), { flops: 232, bytes: 140 });
});

Deno.test("rooflineMs() is bounded by the slower of compute and memory", () => {
  assert.deepEqual(rooflineMs({ flops: 2e9, bytes: 1e9 }, 10, 2), { ms: 500, bound: "memory" });
  assert.deepEqual(rooflineMs({ flops: 2e9, bytes: 1e8 }, 10, 2), { ms: 200, bound: "compute" });
});

Deno.test("STANDARD_SHAPES have the published parameter counts (0.6B, 6.7B, 13B, 69B)", () => {
  const params = STANDARD_SHAPES.map((m) => Math.round(totalParams(m) / 1e8) / 10);
  assert.deepEqual(params, [0.6, 6.7, 13, 69]);
});

const Report = z.object({
  prefill_ms: z.number().positive(),
  decode_ms: z.number().positive(),
  decode_steps: z.number(),
  prefill_pct: z.number(),
  decode_pct: z.number(),
  decode_pipelined_ms_per_step: z.number().positive(),
  decode_step_ms: z.array(z.number()),
  intensity: z.object({
    prefill: z.object({ flop_per_byte: z.number().positive() }),
    decode: z.object({ flop_per_byte: z.number().positive() }),
  }),
  ceilings: z.object({ copy_bandwidth_gb_s: z.number().positive(), matmul_gflops: z.number() }),
  roofline: z.object({ rows: z.array(z.object({ model: z.string() })).length(4) }),
  batch_sweep: z.object({
    rows: z.array(z.object({
      scheduler: z.enum(["static", "continuous"]),
      batchSize: z.number(),
      outputTokensPerS: z.number().positive(),
      meanLatencyMs: z.number().positive(),
    })),
  }),
});

Deno.test({
  name: "bench:prefill-decode --json on the tiny model reports every section and writes its files",
  ...GPU_TEST,
  fn: async () => {
    const dir = await Deno.makeTempDir();
    try {
      const out: string[] = [];
      const code = await runPrefillDecodeBench([
        "--model",
        "tiny",
        "--prompt-len",
        "16",
        "--gen",
        "4",
        "--batch-sizes",
        "1,2",
        "--batch-requests",
        "4",
        "--batch-gen",
        "4",
        "--json",
        "--out-dir",
        dir,
      ], { log: (l) => out.push(l), err: () => {} });
      assert.equal(code, 0);
      const r = Report.parse(JSON.parse(out[0]!));
      assert.equal(r.decode_steps, 3);
      assert.equal(r.decode_step_ms.length, 3);
      assert.ok(Math.abs(r.prefill_pct + r.decode_pct - 100) < 1e-9);
      assert.ok(r.intensity.prefill.flop_per_byte > r.intensity.decode.flop_per_byte);
      assert.deepEqual(
        r.batch_sweep.rows.map((b) => `${b.scheduler} ${b.batchSize}`),
        ["static 1", "continuous 1", "static 2", "continuous 2"],
      );
      Report.parse(JSON.parse(await Deno.readTextFile(`${dir}/report.json`)));
      assert.match(await Deno.readTextFile(`${dir}/report.md`), /## Roofline/);
      for (const f of ["decode_steps.svg", "batch_throughput.svg", "batch_latency.svg"]) {
        assert.ok((await Deno.readTextFile(`${dir}/${f}`)).startsWith("<svg"), f);
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("bench:prefill-decode rejects bad flags with exit status 2", async () => {
  const err: string[] = [];
  const code = await runPrefillDecodeBench(["--gen", "1"], {
    log: () => {},
    err: (l) => err.push(l),
  });
  assert.equal(code, 2);
  assert.match(err.join("\n"), /--gen must be an integer >= 2/);
});

Deno.test("bench:prefill-decode rejects sweep flags with --no-batch-sweep (they would be ignored)", async () => {
  for (const flag of ["--batch-model", "--batch-sizes", "--batch-requests", "--batch-gen"]) {
    const err: string[] = [];
    const value = flag === "--batch-model" ? "main" : "4";
    const code = await runPrefillDecodeBench(["--no-batch-sweep", flag, value], {
      log: () => {},
      err: (l) => err.push(l),
    });
    assert.equal(code, 2, flag);
    assert.equal(err.length, 1, flag);
    assert.match(err[0]!, new RegExp(`^error: ${flag} applies to the batch-size sweep, not --no`));
  }
});
