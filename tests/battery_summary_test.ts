import assert from "node:assert/strict";
import { readBattery, readModelRun } from "../bench/battery_read.ts";
import { summaryLines } from "../bench/battery_summary.ts";

// Lines as bench/model_bench.ts, bench/torch_reference.py, bench/serve.ts, deno test and
// bench/gpu_battery.sh print them (copied from a lavapipe run of the battery, 2026-11-27).
const MODEL = `model_bench: adapter: NVIDIA H100 80GB HBM3 (vendor 4318); 16 CPU cores; Deno 2.9.6
prefill 128 tokens: 46 ms, 2766.5 tok/s (CPU 0.1 s)
prefill 256 tokens: 40 ms, 6400.0 tok/s (CPU 0.0 s; median of 3 after an untimed one, 38-45 ms; GPU pass 20.0 ms, 12800.0 tok/s)
prefill 512 tokens: 172 ms, 2970.4 tok/s (CPU 0.3 s; GPU pass 128.0 ms, 4000.0 tok/s)
decode batch 1: 77.44 tok/s, 12.9 ms/step (64 steps, CPU 22 ms/step), weights 0.03 GB/s
  host per step: 149 dispatches (5.3 per layer, fixed ones included), 0.36 ms to prepare, encode and submit (prepare 0.09, record 0.10, finish 0.12, rest 0.05); blocked in WebGPU: 7.9 ms in queue.submit, 4.2 ms in mapAsync
  GPU per step (timestamps): 12.25 ms computing, 0.466 ms idle between steps (waiting for the host)
decode batch 64: 2416.88 tok/s, 26.5 ms/step (64 steps, CPU 45 ms/step), weights 0.02 GB/s
  host per step: 149 dispatches (5.3 per layer, fixed ones included), 1.37 ms to prepare, encode and submit (prepare 0.13, record 0.10, finish 0.11, rest 0.03); blocked in WebGPU: 16.9 ms in queue.submit, 8.5 ms in mapAsync
`;
const TORCH = `# torch 2.5.1, transformers 4.57.0, bfloat16, 16 threads
prefill 512 tokens: 23492.00 tok/s (22 ms)
decode batch 1: 18.10 tok/s (55 ms/step, 32 steps)
`;

/** Fails with the whole text when `part` is not in it. */
function assertHas(text: string, part: string): void {
  assert.ok(text.includes(part), `missing ${JSON.stringify(part)} in:\n${text}`);
}

Deno.test("readModelRun() reads bench:model's rates with each decode step's host and GPU lines", () => {
  const run = readModelRun(MODEL);
  assert.deepEqual(run.adapter, "NVIDIA H100 80GB HBM3 (vendor 4318)");
  assert.deepEqual(run.prefill.get(512), { msPerStep: 172, tokPerS: 2970.4, gpuPassTokPerS: 4000 });
  // A line without timestamps: no pass rate, not a wrong one.
  assert.deepEqual(run.prefill.get(128), { msPerStep: 46, tokPerS: 2766.5 });
  // --prefill-repeats: the medians, read as any other line.
  assert.deepEqual(run.prefill.get(256), { msPerStep: 40, tokPerS: 6400, gpuPassTokPerS: 12800 });
  assert.deepEqual(run.decode.get(1), {
    tokPerS: 77.44,
    msPerStep: 12.9,
    dispatches: 149,
    dispatchesPerLayer: 5.3,
    hostMs: 0.36,
    gpuIdleMs: 0.466,
  });
  // No GPU line after batch 64's host line (no timestamps): no idle figure, not a wrong one.
  assert.deepEqual(run.decode.get(64)?.gpuIdleMs, undefined);
  assert.deepEqual(run.decode.get(64)?.hostMs, 1.37);
});

Deno.test("readModelRun() reads the PyTorch peer's rate lines", () => {
  const run = readModelRun(TORCH);
  assert.deepEqual(run.prefill.get(512), { msPerStep: 22, tokPerS: 23492 });
  assert.deepEqual(run.decode.get(1), { tokPerS: 18.1, msPerStep: 55 });
});

Deno.test("readBattery() reads the quantization medians, serving levels, coloured test lines and cut stages", () => {
  const b = readBattery({
    "info.txt": "name, driver_version, memory.total\nNVIDIA H100 80GB HBM3, 580.1, 81559 MiB\n" +
      "commit 8138a63\n",
    "quant.txt": "ratios to none (same run):\n  int4: weight bytes 0.283x; batch 8 9.99x\n" +
      "ratios to none, median of 2 rounds (range):\n" +
      "  int8: weight bytes 0.533x; batch 1 1.12x (1.06-1.12), prefill 512 1.02x (0.76-1.02)\n" +
      "  int4: weight bytes 0.283x; batch 1 1.05x (0.87-1.05), prefill 512 1.23x (0.76-1.23)\n",
    "serve.txt": "concurrency 1: 16/16 ok, 0.41 req/s, 52.18 output tok/s, TTFT p50 121.2 ms " +
      "p95 141.4 ms, TPOT p50 19.29 ms, E2E p50 2558.3 ms\n" +
      "concurrency 64: 256/256 ok, 9.3 req/s, 1190.0 output tok/s, TTFT p50 700.1 ms p95 " +
      "4301.0 ms, TPOT p50 26.80 ms, E2E p50 4100.0 ms, 72 preemptions (server /metrics)\n",
    "tests.txt":
      "\x1b[0m./tests/a_test.ts => \x1b[0mthing() works ... \x1b[0m\x1b[32mok\x1b[0m (1ms)\n" +
      "./tests/b_test.ts => other() works ... \x1b[31mFAILED\x1b[0m (2ms)\n",
    "progress.txt": "[0 s] info: rc 0\n[124 s] bench-model: rc 124\n[130 s] tests: rc 1\n",
  });
  assert.deepEqual(b.gpu, "NVIDIA H100 80GB HBM3, 580.1, 81559 MiB");
  assert.deepEqual(b.commit, "8138a63");
  // The medians, not the last round's own ratios printed before them.
  assert.deepEqual(b.quant.get("int4")?.get("batch 1"), 1.05);
  assert.deepEqual(b.quant.get("int4")?.has("batch 8"), false);
  assert.deepEqual(b.quant.get("int8")?.get("weight bytes"), 0.533);
  assert.deepEqual(b.quant.get("int4")?.get("prefill 512"), 1.23);
  // A line from before bench:serve read the server's /metrics (no preemption count), and one since.
  assert.deepEqual(b.serve.get(1), {
    ok: "16/16",
    outputTokPerS: 52.18,
    tpotP50Ms: 19.29,
    preempted: null,
  });
  assert.deepEqual(b.serve.get(64), {
    ok: "256/256",
    outputTokPerS: 1190,
    tpotP50Ms: 26.8,
    preempted: 72,
  });
  assert.deepEqual(b.tests, { passed: 1, failed: 1, summary: "" });
  assert.deepEqual(b.stagesCut, ["bench-model (rc 124)", "tests (rc 1)"]);
});

Deno.test("summaryLines() compares a second start-up's own tuning with the first's, and the dispatch floor", () => {
  const tuned = (tile: string, tokPerS: string) =>
    `model_bench: adapter: NVIDIA H200 (vendor 4318)\n` +
    `Kernel tuning: measured in 22.5 s (timestamp-query): tile ${tile}\n` +
    `Kernel tuning: measured in 0.4 s (timestamp-query): decode attention split at 592 tokens\n` +
    `prefill 512 tokens: 76 ms, 6732.0 tok/s (CPU 0.0 s; GPU pass 51.2 ms, 10000.0 tok/s)\n` +
    `decode batch 1: ${tokPerS} tok/s, 2.7 ms/step (64 steps, CPU 2 ms/step)\n`;
  const text = summaryLines(
    readBattery({
      "model.txt": tuned("32x8 bk32", "368.12"),
      "model_retuned.txt": tuned("16x16 bk16 tm8", "404.93"),
      "model_readback.txt":
        "decode batch 1: 392.50 tok/s, 2.5 ms/step (64 steps, CPU 2 ms/step)\n" +
        "  host per step: 173 dispatches (6.2 per layer, fixed ones included), 1.10 ms to prepare\n" +
        "  GPU per step (timestamps): 2.31 ms computing, 0.098 ms idle between steps\n",
      "kernels.txt": "dispatch_floor: adapter: NVIDIA H200\n" +
        "dependent, 1 workgroups of 256: 1 dispatch 0.0030 ms, 145 dispatches 0.5000 ms; " +
        "3.45 us per further dispatch (timestamp-query)\n" +
        "independent, 528 workgroups of 256: 1 dispatch 0.0040 ms, 145 dispatches 0.3000 ms; " +
        "2.06 us per further dispatch (timestamp-query)\n",
    }),
  ).join("\n");
  assertHas(text, "| decode batch 1: second start-up / first, each with its own tuning | 1.1x |");
  assertHas(
    text,
    "| decode batch 64: second start-up / first, each with its own tuning | not measured |",
  );
  assertHas(text, "| prefill 512: second start-up / first, each with its own tuning | 1x |");
  // The middle row counts' prefill (tiles measured between the decode batch and 512 rows).
  assertHas(text, "| prefill 256, tok/s (PyTorch peer: not measured) | not measured |  | - |");
  assertHas(text, "| prefill 128: tuned / defaults (--kernel-tuning off) | not measured |");
  assertHas(
    text,
    "| prefill 512, tok/s (PyTorch peer: not measured) | 6,732 (GPU pass alone: 10,000) | >= 20,000 | short |",
  );
  assertHas(
    text,
    "| decode batch 1: readbacks 6 at a time (11 in flight) / 3 (7); GPU idle ms 0.098 against " +
      "not measured | 1.07x |",
  );
  assertHas(text, "| GPU time a dispatch adds after a barrier, 1 workgroups, us | 3.45 |");
  assertHas(text, "| tests on the GPU | not measured | 0 failed | - |");
  assertHas(
    text,
    "| GPU time a dispatch adds after a barrier, 528 workgroups, us | not measured |",
  );
  assertHas(
    text,
    "Kernel tuning, first start-up (bench-model):\n- measured in 22.5 s (timestamp-query): tile 32x8 bk32\n",
  );
  assertHas(
    text,
    "Kernel tuning, second start-up (retune):\n- measured in 22.5 s (timestamp-query): tile 16x16 bk16 tm8\n",
  );
});

Deno.test("summaryLines() lists the fastest matmul kernels per case, double-buffered, split-K and the engine's X forms apart", () => {
  const tune = (xForm: string, lines: string) =>
    `$ deno run --cached-only -A bench/matmul_tune.ts\n` +
    `matmul_tune: adapter: NVIDIA H200 (vendor 4318); 16 CPU cores; Deno 2.9.6; 2026-11-30\n` +
    `command: deno run -A bench/matmul_tune.ts; f16 weights, X ${xForm}\n` +
    `copy bandwidth (same run): 3490.1 GB/s\n` + lines;
  const b = readBattery({
    "kernels.txt": tune(
      "plain",
      "qkv N 4096 K 1024, M 64:\n" +
        "  gemv mb1 rb4                    0.2100 ms    2556 GFLOP/s    40 GB/s of W\n" +
        "  tiled 16x16 bk16                0.1320 ms    4067 GFLOP/s    64 GB/s of W\n" +
        "  tiled 8x16 bk16                 0.0930 ms    5773 GFLOP/s    90 GB/s of W\n" +
        "  tiled 8x16 bk16 db              0.0710 ms    7562 GFLOP/s   118 GB/s of W\n" +
        "  tiled 16x16 bk16 sk4            0.0800 ms    6711 GFLOP/s   105 GB/s of W\n" +
        "  tiled 16x16 bk16 db sk8         0.0650 ms    8260 GFLOP/s   129 GB/s of W\n" +
        "down N 1024 K 3072, M 1:\n" +
        "  gemv mb1                        0.0090 ms     699 GFLOP/s   699 GB/s of W\n" +
        "dependent, 1 workgroups of 256: 1 dispatch 0.0030 ms, 145 dispatches 0.5000 ms; " +
        "3.45 us per further dispatch (timestamp-query)\n",
    ),
    "kernels_rms.txt": tune(
      "rms_residual",
      "qkv N 4096 K 1024, M 64:\n" +
        "  tiled 8x16 bk16                 0.1065 ms    5041 GFLOP/s    79 GB/s of W\n" +
        "  tiled 8x16 bk16 db              0.0994 ms    5400 GFLOP/s    84 GB/s of W\n",
    ),
    "kernels_swiglu.txt": tune(
      "swiglu",
      "down N 1024 K 3072, M 1:\n" +
        "  gemv mb1                        0.0120 ms     524 GFLOP/s   524 GB/s of W\n" +
        "  gemv mb1 rb4                    0.0108 ms     583 GFLOP/s   583 GB/s of W\n" +
        "down N 1024 K 3072, M 64:\n" +
        "  gemv mb8 rb4                    0.1190 ms    3384 GFLOP/s    53 GB/s of W\n",
    ),
  });
  assert.deepEqual([...b.kernels.keys()], ["qkv M 64", "down M 1"]);
  assert.deepEqual(b.kernels.get("qkv M 64")?.get("tiled 8x16 bk16 db"), 0.071);
  assert.deepEqual(b.dispatchUs.get("dependent, 1 workgroups"), 3.45);
  const text = summaryLines(b).join("\n");
  assertHas(
    text,
    "| qkv M 64 | tiled 16x16 bk16 db sk8 (0.065 ms) | tiled 8x16 bk16 (0.093 ms) | " +
      "tiled 8x16 bk16 db (0.071 ms) | tiled 16x16 bk16 db sk8 (0.065 ms) | " +
      "tiled 8x16 bk16 db (0.0994 ms) | 1.53x |",
  );
  assertHas(
    text,
    "| down M 1 | gemv mb1 (0.009 ms) | - | - | - | gemv mb1 rb4 (0.0108 ms) | 1.2x |",
  );
  // A case with the engine's X form only: no plain figure to compare.
  assertHas(text, "| down M 64 | - | - | - | - | gemv mb8 rb4 (0.119 ms) | not measured |");
  const none = summaryLines(readBattery({})).join("\n");
  assertHas(
    none,
    "Matmul kernels in isolation (bench/matmul_tune.ts, f16 weights; stages kernels, kernels-rms):\n\n- not measured",
  );
});

Deno.test("summaryLines() sets the decode attention's wider workgroups against 64 per case", () => {
  // bench/attention_bench.ts's lines (the direct path printed once per partition size) beside
  // bench/matmul_tune.ts's in the same log.
  const b = readBattery({
    "kernels.txt": "paged_attention decode, adapter: NVIDIA H200 (vendor 4318); KV f16\n" +
      "Hq 16, Hkv 8, head_dim 128, block 16; copy bandwidth 3490.1 GB/s (read + write)\n" +
      "  context 160, batch 1, direct, 64 wide: 0.0300 ms median (min 0.0290), KV 0.7 MB, " +
      "22.0 GB/s effective vs copy 3490.1 GB/s (timestamp-query)\n" +
      "  context 160, batch 1, split-K 16, 64 wide: 0.0180 ms median (min 0.0170), KV 0.7 MB\n" +
      "  context 160, batch 1, direct, 256 wide: 0.0120 ms median (min 0.0110), KV 0.7 MB\n" +
      "  context 160, batch 1, direct, 64 wide: 0.0280 ms median (min 0.0270), KV 0.7 MB\n" +
      "  context 160, batch 1, split-K 64, 64 wide: 0.0200 ms median (min 0.0190), KV 0.7 MB\n" +
      "  context 2048, batch 64, direct, 64 wide: 0.9000 ms median (min 0.8000), KV 537 MB\n" +
      "  context 2048, batch 64 (KV fp8_e4m3), direct, 64 wide: 0.6000 ms median, KV 268 MB\n" +
      "qkv N 4096 K 1024, M 1:\n" +
      "  gemv mb1                        0.0090 ms     699 GFLOP/s   699 GB/s of W\n",
  });
  assert.deepEqual([...b.attention.keys()], [
    "context 160, batch 1",
    "context 2048, batch 64",
    "context 2048, batch 64 (KV fp8_e4m3)",
  ]);
  // The direct path's two medians: the faster one.
  assert.deepEqual(b.attention.get("context 160, batch 1")?.get("direct, 64 wide"), 0.028);
  assert.deepEqual(b.kernels.get("qkv M 1")?.get("gemv mb1"), 0.009);
  const text = summaryLines(b).join("\n");
  assertHas(
    text,
    "| context 160, batch 1 | split-K 16, 64 wide (0.018 ms) | direct, 256 wide (0.012 ms) | 0.67x |",
  );
  assertHas(
    text,
    "| context 2048, batch 64 | direct, 64 wide (0.9 ms) | - | not measured |",
  );
  assertHas(
    text,
    "| context 2048, batch 64 (KV fp8_e4m3) | direct, 64 wide (0.6 ms) | - | not measured |",
  );
  assertHas(
    summaryLines(readBattery({})).join("\n"),
    "Decode attention in isolation (bench/attention_bench.ts; stage attention):\n\n- not measured",
  );
});

Deno.test("summaryLines() sets gemv's vec4 X loads against scalar ones per case", () => {
  const tune = (loads: string, lines: string) =>
    `matmul_tune: adapter: NVIDIA H200 (vendor 4318); 16 CPU cores; Deno 2.9.6; 2026-11-30\n` +
    `command: deno run -A bench/matmul_tune.ts; f16 weights, X rms_residual, gemv X loads ${loads}\n` +
    lines;
  const b = readBattery({
    "kernels_rms.txt": tune(
      "vec4 where K % 4 == 0",
      "qkv N 4096 K 1024, M 64:\n" +
        "  gemv mb8 rb4                    0.0500 ms    2556 GFLOP/s    40 GB/s of W\n" +
        "  tiled 8x16 bk16                 0.0300 ms    5041 GFLOP/s    79 GB/s of W\n",
    ),
    "kernels_rms_scalar.txt": tune(
      "scalar",
      "qkv N 4096 K 1024, M 64:\n" +
        "  gemv mb8 rb4                    0.0800 ms    1600 GFLOP/s    25 GB/s of W\n" +
        "  gemv mb4 rb4                    0.0900 ms    1400 GFLOP/s    22 GB/s of W\n" +
        "gate_up N 6144 K 1024, M 1:\n" +
        "  gemv mb1                        0.0110 ms     699 GFLOP/s   699 GB/s of W\n",
    ),
  });
  const text = summaryLines(b).join("\n");
  // The fastest gemv of each, not the faster tile beside it.
  assertHas(
    text,
    "| qkv M 64 | gemv mb8 rb4 (0.05 ms) | gemv mb8 rb4 (0.08 ms) | 0.63x |",
  );
  assertHas(text, "| gate_up M 1 | - | gemv mb1 (0.011 ms) | not measured |");
  assertHas(
    summaryLines(readBattery({})).join("\n"),
    "gemv X loads, normed residual X (stages kernels-rms, kernels-xscalar):\n\n- not measured",
  );
});

Deno.test("summaryLines() sets figures against the goals and says 'not measured' for missing ones", () => {
  const text = summaryLines(
    readBattery({
      "model.txt": MODEL,
      "torch.txt": TORCH,
      "tests.txt": "ok | 369 passed | 0 failed (120s)\n",
    }),
  ).join("\n");
  assertHas(text, "| decode batch 1, tok/s (PyTorch peer: 18.1) | 77.4 | >= 400 | short |");
  assertHas(
    text,
    "| prefill 512, tok/s (PyTorch peer: 23,492) | 2,970 (GPU pass alone: 4,000) | >= 20,000 | short |",
  );
  assertHas(text, "| dispatches per layer (decode) | 5.3 | <= 8 | met |");
  assertHas(text, "| serve, concurrency 64: output tok/s (- ok) | not measured | >= 4,000 | - |");
  assertHas(
    text,
    "| int4: decode batch 1 / f16 (median of rounds) | not measured | >= 1.8 (NVIDIA) | - |",
  );
  assertHas(text, "| tests on the GPU | ok \\| 369 passed \\| 0 failed (120s) | 0 failed | met |");
  assertHas(text, "Stages cut short or failed: none.");
  assertHas(text, "Kernel tuning, second start-up (retune):\n- not measured");
  assertHas(text, "GPU memory and the KV cache sized from it (info, kv-auto):\n- not measured");
});

Deno.test("summaryLines() quotes the GPU's memory as info read it and the KV cache the engine sized from it", () => {
  const text = summaryLines(readBattery({
    "info.txt": "$ deno run --cached-only -A main.ts info\nAdapter:   NVIDIA H200\n" +
      "Memory:    143,771 MiB, 612 MiB in use (nvidia-smi): the engine may use ...\n",
    "kv_auto.txt": "Adapter: NVIDIA H200; weights f16\nModel: Qwen3ForCausalLM, 28 layers\n" +
      "KV cache: 16,384 blocks x 16 tokens = 262,144 tokens\n" +
      "Maximum concurrency for 4,096 tokens per request: 64.00x\n" +
      "KV cache sized from the GPU's memory (nvidia-smi): 0.9 of 143,771 MiB ...\n" +
      "GPU memory in use: 612 MiB before loading, 31,000 of 143,771 MiB with the model and KV " +
      "cache (nvidia-smi)\nThe capital of France is ...\n",
  })).join("\n");
  assertHas(
    text,
    "GPU memory and the KV cache sized from it (info, kv-auto):\n" +
      "- Memory:    143,771 MiB, 612 MiB in use (nvidia-smi): the engine may use ...\n" +
      "- KV cache: 16,384 blocks x 16 tokens = 262,144 tokens\n" +
      "- KV cache sized from the GPU's memory (nvidia-smi): 0.9 of 143,771 MiB ...\n" +
      "- GPU memory in use: 612 MiB before loading, 31,000 of 143,771 MiB with the model and KV " +
      "cache (nvidia-smi)\n",
  );
});

Deno.test("summaryLines() shows the preemptions a serving level reported beside its rate", () => {
  const text = summaryLines(readBattery({
    "serve.txt": "concurrency 64: 256/256 ok, 9.3 req/s, 1190.0 output tok/s, TTFT p50 700.1 ms " +
      "p95 4301.0 ms, TPOT p50 26.80 ms, E2E p50 4100.0 ms, 72 preemptions (server /metrics)\n" +
      "concurrency 16: 64/64 ok, 5.0 req/s, 640.0 output tok/s, TTFT p50 100.0 ms p95 " +
      "200.0 ms, TPOT p50 20.00 ms, E2E p50 2700.0 ms\n",
  })).join("\n");
  assertHas(
    text,
    "| serve, concurrency 64: output tok/s (256/256 ok, 72 preemptions) | 1,190 | >= 4,000 | short |",
  );
  assertHas(text, "| serve, concurrency 16: output tok/s (64/64 ok) | 640 |  | - |");
});
