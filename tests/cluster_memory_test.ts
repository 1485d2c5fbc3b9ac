import assert from "node:assert/strict";
import type { AdapterSummary } from "../gpu/context.ts";
import { type ClusterGpuProbe, replicaMemory } from "../cli/cluster_memory.ts";
import { H200_ADAPTER } from "./support/adapter.ts";

const H200 = H200_ADAPTER;

/** A probe whose nvidia-smi prints `stdout` and whose adapter is `adapter`; it counts both. */
function probe(stdout: string | Error, adapter: AdapterSummary | null = H200) {
  const seen = { runs: 0, adapters: 0 };
  const p: ClusterGpuProbe = {
    run: () => {
      seen.runs++;
      return stdout instanceof Error
        ? Promise.reject(stdout)
        : Promise.resolve({ code: 0, stdout });
    },
    adapter: () => {
      seen.adapters++;
      return Promise.resolve(adapter);
    },
  };
  return { probe: p, seen };
}

const SMI = "NVIDIA H200, 143771, 600\n";

Deno.test("replicaMemory() gives each replica 0.9 / N of the free memory of a GPU that nvidia-smi reads", async () => {
  const { probe: p } = probe(SMI);
  assert.deepEqual(await replicaMemory(["--model", "m"], 2, p), {
    args: ["--gpu-memory-utilization", "0.448"],
    note: "[cluster] each replica's engine may use 0.448 of the GPU's 143,771 MiB " +
      "(--gpu-memory-utilization: 0.9 of the 143,171 MiB free, shared by 2 replicas; " +
      "nvidia-smi); a sizing flag after -- chooses instead",
  });
  // Rounded down: 0.9 x 143,171 / 143,771 / 7 = 0.12803...
  assert.deepEqual((await replicaMemory([], 7, p)).args, ["--gpu-memory-utilization", "0.128"]);
  // A GPU half in use: 0.9 x 0.5 / 2.
  const { probe: half } = probe("NVIDIA H200, 143771, 71885.5\n");
  assert.deepEqual((await replicaMemory([], 2, half)).args, ["--gpu-memory-utilization", "0.225"]);
});

Deno.test("replicaMemory() adds nothing where the serve flags size the cache or run the mock", async () => {
  for (
    const args of [
      ["--kv-cache-memory", "4096"],
      ["--num-kv-blocks=100"],
      ["--model", "m", "--gpu-memory-utilization", "0.3"],
      ["--executor", "mock"],
      ["--executor=mock"],
    ]
  ) {
    const { probe: p, seen } = probe(SMI);
    assert.deepEqual(await replicaMemory(args, 2, p), { args: [], note: null }, args.join(" "));
    assert.deepEqual(seen, { runs: 0, adapters: 0 }, args.join(" "));
  }
});

Deno.test("replicaMemory() adds nothing where the memory cannot be read, asking for no adapter without nvidia-smi", async () => {
  for (
    const [stdout, runs, adapters] of [
      [new Deno.errors.NotFound("nvidia-smi"), 1, 0],
      ["", 1, 0],
      ["NVIDIA H200, [N/A], [N/A]\n", 1, 0],
    ] as const
  ) {
    const { probe: p, seen } = probe(stdout);
    assert.deepEqual(await replicaMemory([], 2, p), { args: [], note: null });
    assert.deepEqual(seen, { runs, adapters });
  }
  // nvidia-smi lists a GPU, but WebGPU's adapter is lavapipe, or there is none.
  const lavapipe = { ...H200, description: "llvmpipe (LLVM 19.1.1, 256 bits)", vendor: "65541" };
  for (const adapter of [lavapipe, null]) {
    const { probe: p, seen } = probe(SMI, adapter);
    assert.deepEqual(await replicaMemory([], 2, p), { args: [], note: null });
    assert.equal(seen.adapters, 1);
  }
});
