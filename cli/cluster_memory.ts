/**
 * The GPU memory each of `main.ts cluster`'s replicas may use. Every replica is an engine of its
 * own on the same GPU, and an engine sizes its KV cache from its `--gpu-memory-utilization`
 * share of the GPU's memory (engine/kv_cache_plan.ts, default 0.9 of the memory free at its
 * start-up): left to the default, the
 * first replica would take 0.9 of the free memory and the others find little room. So where the
 * GPU's memory can be read and the serve flags do not size the cache themselves, the launcher
 * gives each replica 0.9 / N of the memory free before they start.
 *
 * @module
 */

import { type AdapterSummary, adapterSummary } from "../gpu/context.ts";
import {
  type CommandRunner,
  NVIDIA_SMI_ARGS,
  parseNvidiaSmiMemory,
  readDeviceMemory,
  runCommand,
} from "../gpu/device_memory.ts";
import { DEFAULT_GPU_MEMORY_UTILIZATION } from "../engine/kv_cache_size.ts";

/** Serve flags that size the KV cache themselves (the launcher then adds nothing). */
const SIZING_FLAGS = ["--gpu-memory-utilization", "--kv-cache-memory", "--num-kv-blocks"];

/** How the launcher looks at the GPU (a test double replaces it). */
export interface ClusterGpuProbe {
  /** Runs `nvidia-smi` (gpu/device_memory.ts). */
  readonly run: CommandRunner;
  /** The adapter the replicas' engines would get, or null where there is none. */
  readonly adapter: () => Promise<AdapterSummary | null>;
}

/** The adapter `GpuContext.create` picks: a high-performance one, else any. */
async function engineAdapter(): Promise<AdapterSummary | null> {
  if (typeof navigator === "undefined" || navigator.gpu === undefined) return null;
  const adapter = (await navigator.gpu.requestAdapter({ powerPreference: "high-performance" })) ??
    (await navigator.gpu.requestAdapter());
  return adapter === null ? null : adapterSummary(adapter);
}

/** The real probe. */
export const GPU_PROBE: ClusterGpuProbe = { run: runCommand, adapter: engineAdapter };

/** The flags added to every replica's serve, and the launcher's line saying so (or none). */
export interface ReplicaMemory {
  readonly args: readonly string[];
  readonly note: string | null;
}

const NONE: ReplicaMemory = { args: [], note: null };

/** Whether `args` set `flag` (as `--flag V` or `--flag=V`). */
function hasFlag(args: readonly string[], flag: string): boolean {
  return args.some((a) => a === flag || a.startsWith(`${flag}=`));
}

/** Whether `args` run the mock executor (no GPU memory to share). */
function mockExecutor(args: readonly string[]): boolean {
  return args.some((a, i) =>
    a === "--executor=mock" || (a === "--executor" && args[i + 1] === "mock")
  );
}

/**
 * Each of `replicas` replicas' share of the GPU's memory, as serve flags: 0.9 of the memory free
 * now, / N (rounded down to 0.001), where the GPU's memory can be read (an engine's own default is
 * 0.9 of what is free, engine/kv_cache_plan.ts); none where `serveArgs` size the KV cache or run
 * the mock executor, or the memory cannot be read. The adapter is looked at only once
 * `nvidia-smi` has listed a GPU (a machine without one starts no WebGPU here).
 */
export async function replicaMemory(
  serveArgs: readonly string[],
  replicas: number,
  probe: ClusterGpuProbe = GPU_PROBE,
): Promise<ReplicaMemory> {
  if (SIZING_FLAGS.some((f) => hasFlag(serveArgs, f)) || mockExecutor(serveArgs)) return NONE;
  try {
    const out = await probe.run("nvidia-smi", NVIDIA_SMI_ARGS);
    if (out.code !== 0 || parseNvidiaSmiMemory(out.stdout).length === 0) return NONE;
  } catch {
    return NONE;
  }
  const adapter = await probe.adapter();
  if (adapter === null) return NONE;
  const reading = await readDeviceMemory(adapter, probe.run);
  if (!("memory" in reading)) return NONE;
  const { totalMiB, usedMiB, source } = reading.memory;
  const free = Math.max(0, totalMiB - usedMiB);
  const share = Math.floor((1000 * DEFAULT_GPU_MEMORY_UTILIZATION * free) / totalMiB / replicas) /
    1000;
  const f = (n: number) => n.toLocaleString("en-US");
  return {
    args: ["--gpu-memory-utilization", String(share)],
    note: `[cluster] each replica's engine may use ${share} of the GPU's ${f(totalMiB)} MiB ` +
      `(--gpu-memory-utilization: ${DEFAULT_GPU_MEMORY_UTILIZATION} of the ${f(free)} MiB free, ` +
      `shared by ${replicas} replicas; ${source}); a sizing flag after -- chooses instead`,
  };
}
