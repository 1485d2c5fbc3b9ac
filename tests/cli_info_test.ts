import assert from "node:assert/strict";
import { runMain } from "./support/cli.ts";

Deno.test("main.ts info prints the adapter, its features and the requested limits", async () => {
  const { code, stdout } = await runMain(["info"]);
  assert.equal(code, 0);
  assert.match(stdout, /^Adapter: {3}\S/m);
  assert.match(stdout, /^Kind: {6}(hardware adapter|software fallback adapter)/m);
  assert.match(stdout, /shader-f16 +(yes|no)/);
  assert.match(stdout, /timestamp-query +(yes|no)/);
  assert.match(stdout, /subgroups +(yes|no)/);
  assert.match(stdout, /maxStorageBufferBindingSize +[\d,]+/);
  // The GPU's memory (what the KV cache is sized from): unknown on a software adapter.
  if (/^Kind: {6}software/m.test(stdout) || /llvmpipe|lavapipe/.test(stdout)) {
    assert.match(
      stdout,
      /^Memory: {4}unknown \(a software adapter, whose memory is the host's\): the KV cache takes --kv-cache-memory, default 1,024 MiB$/m,
    );
  } else {
    assert.match(stdout, /^Memory: {4}(unknown \(.+\)|[\d,]+ MiB, [\d,.]+ MiB in use \(.+\)): /m);
  }
});

Deno.test("main.ts info fails with one line when no adapter exists", async () => {
  // No Linux machine has a DirectX 12 backend: wgpu finds no adapter at all.
  const { code, stdout, stderr } = await runMain(["info"], { DENO_WEBGPU_BACKEND: "dx12" });
  assert.equal(code, 1);
  assert.equal(stdout, "");
  const lines = stderr.split("\n").filter((l) => l.startsWith("error:"));
  assert.equal(lines.length, 1);
  assert.match(lines[0]!, /^error: No WebGPU adapter found/);
  assert.doesNotMatch(stderr, /at .*\.ts:\d+/); // no stack trace
});

Deno.test("main.ts info refuses --quantization without --model (there are no weights to quantize)", async () => {
  const { code, stdout, stderr } = await runMain(["info", "--quantization", "int4"]);
  assert.equal(code, 1);
  assert.equal(stdout, "");
  assert.equal(
    stderr.trim(),
    "error: --quantization applies to the model of --model: info loads none",
  );
});

Deno.test("main.ts rejects an unknown command with one line", async () => {
  const { code, stderr } = await runMain(["frobnicate"]);
  assert.equal(code, 2);
  assert.equal(
    stderr.trim(),
    "error: unknown command 'frobnicate' (try: info, serve, generate, cluster)",
  );
});

Deno.test("main.ts info prints the kernel profile, forced by --kernel-profile or the environment", async () => {
  const auto = await runMain(["info"], { WEBGPU_LLM_KERNEL_PROFILE: "" });
  assert.match(
    auto.stdout,
    /^Kernels: {3}(cpu|gpu) profile \(auto: (software|hardware) adapter\)$/m,
  );
  const forced = await runMain(["info", "--kernel-profile", "gpu"]);
  assert.match(forced.stdout, /^Kernels: {3}gpu profile \(forced\)$/m);
  const env = await runMain(["info"], { WEBGPU_LLM_KERNEL_PROFILE: "cpu" });
  assert.match(env.stdout, /^Kernels: {3}cpu profile \(forced by WEBGPU_LLM_KERNEL_PROFILE\)$/m);
  const bad = await runMain(["info", "--kernel-profile", "fast"]);
  assert.equal(bad.code, 1);
  assert.equal(bad.stderr.trim(), 'error: --kernel-profile expects auto, cpu, gpu, got "fast"');
  const badGenerate = await runMain(["generate", "--prompt-ids", "1,2", "--kernel-profile", "x"]);
  assert.equal(badGenerate.code, 1);
  assert.match(badGenerate.stderr, /^error: --kernel-profile expects auto, cpu, gpu, got "x"$/m);
});

Deno.test("main.ts info --model --quantization prints the weight bytes before and after", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const { makeModel } = await import("../tools/make_model.ts");
    await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "bf16", seed: 1 });
    const plain = await runMain(["info", "--model", dir]);
    assert.equal(plain.code, 0, plain.stderr);
    // The default, auto, leaves a BF16 checkpoint unquantized.
    assert.match(plain.stdout, /quantization none \(auto\)$/m);
    const bytes = (text: string) =>
      Number(/\(([\d,]+) bytes\)/.exec(text)![1]!.replaceAll(",", ""));
    const none = bytes(plain.stdout);
    for (const [format, max] of [["int8", 0.55], ["int4", 0.3]] as const) {
      const r = await runMain(["info", "--model", dir, "--quantization", format]);
      assert.equal(r.code, 0, r.stderr);
      const ratio = Number(/ratio ([\d.]+)/.exec(r.stdout)![1]);
      assert.ok(ratio <= max, `${format}: ${ratio}`);
      // The ratio is the device bytes over the unquantized ones, which `none` reports.
      assert.ok(Math.abs(bytes(r.stdout) / none - ratio) < 2e-3, r.stdout);
    }
    const bad = await runMain(["info", "--quantization", "int5"]);
    assert.equal(bad.code, 1);
    assert.match(
      bad.stderr,
      /^error: --quantization expects auto, none, int8 or int4, got "int5"$/m,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
