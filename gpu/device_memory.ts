/**
 * How much memory the adapter's GPU has and how much is in use, read from outside WebGPU (which
 * has no memory query): NVIDIA GPUs through `nvidia-smi`. The engine sizes its KV cache from it
 * (engine/kv_cache_size.ts, `--gpu-memory-utilization`), as vLLM does from CUDA's.
 *
 * Why not probe with allocations instead (create buffers until one fails with an
 * `out-of-memory` error): wgpu's Vulkan allocator (the gpu-alloc crate) tries the next memory
 * type when the device-local heap is full, so storage buffers spill silently into host memory
 * rather than fail; and lavapipe allocates lazily (64 GiB "allocated" without an error on a
 * 24 GiB host). A probe would count memory the kernels must not use.
 *
 * Other vendors and software adapters read as unknown, with the reason (the engine then keeps a
 * fixed size, engine/kv_cache_size.ts `DEFAULT_KV_CACHE_MIB`).
 *
 * @module
 */

import type { AdapterSummary } from "./context.ts";
import { isSoftwareAdapter } from "./kernel_profile.ts";

/** A GPU's memory as read: total and in use (by every process, this one included), MiB. */
export interface DeviceMemory {
  readonly totalMiB: number;
  readonly usedMiB: number;
  /** Where it was read, for the log, e.g. "nvidia-smi" or "nvidia-smi, the least free of 2". */
  readonly source: string;
}

/** The memory, or why it could not be read. */
export type DeviceMemoryReading =
  | { readonly memory: DeviceMemory }
  | { readonly unknown: string };

/** Runs a command: its exit code and standard output (throws as `Deno.Command` does). */
export type CommandRunner = (
  command: string,
  args: readonly string[],
) => Promise<{ readonly code: number; readonly stdout: string }>;

/** Reads the adapter's memory (see {@linkcode readDeviceMemory}); a test double replaces it. */
export type DeviceMemoryReader = (adapter: AdapterSummary) => Promise<DeviceMemoryReading>;

/** One GPU of `nvidia-smi`'s list. */
export interface NvidiaGpuMemory {
  readonly name: string;
  readonly totalMiB: number;
  readonly usedMiB: number;
}

/** wgpu's vendor id of NVIDIA (PCI 0x10de). */
const NVIDIA_VENDOR = "4318";

/** `nvidia-smi`'s arguments: one CSV line per GPU, MiB without units. */
export const NVIDIA_SMI_ARGS: readonly string[] = [
  "--query-gpu=name,memory.total,memory.used",
  "--format=csv,noheader,nounits",
];

/** How long `nvidia-smi` may take (a wedged driver can hang it). */
const NVIDIA_SMI_TIMEOUT_MS = 10_000;

/**
 * The GPUs of `nvidia-smi --query-gpu=name,memory.total,memory.used
 * --format=csv,noheader,nounits` output, in its order. A GPU whose memory is not a number (e.g.
 * `[N/A]`, as MIG instances report it) is left out.
 *
 * @throws {SyntaxError} on a line that is not `name, total, used`.
 */
export function parseNvidiaSmiMemory(text: string): NvidiaGpuMemory[] {
  const gpus: NvidiaGpuMemory[] = [];
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (line === "") continue;
    const fields = line.split(",").map((s) => s.trim());
    if (fields.length !== 3 || fields[0] === "") {
      throw new SyntaxError(`nvidia-smi printed "${line}", not "name, total MiB, used MiB"`);
    }
    const [name, total, used] = fields as [string, string, string];
    const totalMiB = Number(total);
    const usedMiB = Number(used);
    if (!/^\d+(\.\d+)?$/.test(total) || !/^\d+(\.\d+)?$/.test(used) || totalMiB <= 0) continue;
    gpus.push({ name, totalMiB, usedMiB });
  }
  return gpus;
}

/** Runs `command` with `Deno.Command`, its output as text, killed after the timeout. */
export const runCommand: CommandRunner = async (command, args) => {
  const out = await new Deno.Command(command, {
    args: [...args],
    stdout: "piped",
    stderr: "null",
    signal: AbortSignal.timeout(NVIDIA_SMI_TIMEOUT_MS),
  }).output();
  return { code: out.code, stdout: new TextDecoder().decode(out.stdout) };
};

/**
 * The memory of the GPU behind `adapter`, or why it is unknown: a software adapter (its memory
 * is the host's), a vendor other than NVIDIA, or `nvidia-smi` missing, not allowed
 * (`--allow-run`), failing or listing no GPU with a memory figure. Of several GPUs, those whose
 * name matches the adapter's are candidates (all of them when none does: Vulkan and
 * `nvidia-smi` may spell a name differently); which one WebGPU took cannot be told apart among
 * candidates, so the one with the least free memory is read.
 */
export async function readDeviceMemory(
  adapter: AdapterSummary,
  run: CommandRunner = runCommand,
): Promise<DeviceMemoryReading> {
  if (isSoftwareAdapter(adapter)) {
    return { unknown: "a software adapter, whose memory is the host's" };
  }
  if (adapter.vendor !== NVIDIA_VENDOR && !/nvidia/i.test(adapter.description)) {
    return { unknown: "read through nvidia-smi on NVIDIA GPUs only" };
  }
  let gpus: NvidiaGpuMemory[];
  try {
    const out = await run("nvidia-smi", NVIDIA_SMI_ARGS);
    if (out.code !== 0) return { unknown: `nvidia-smi exited with code ${out.code}` };
    gpus = parseNvidiaSmiMemory(out.stdout);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return { unknown: "nvidia-smi not found" };
    if (error instanceof Deno.errors.NotCapable || error instanceof Deno.errors.PermissionDenied) {
      return { unknown: "running nvidia-smi is not allowed (--allow-run)" };
    }
    const message = error instanceof Error ? error.message : String(error);
    return { unknown: `nvidia-smi failed: ${message.split("\n")[0]}` };
  }
  if (gpus.length === 0) return { unknown: "nvidia-smi listed no GPU with a memory figure" };
  const name = adapter.description.toLowerCase();
  const named = gpus.filter((g) => name.includes(g.name.toLowerCase()));
  const candidates = named.length > 0 ? named : gpus;
  const least = candidates.reduce((a, g) =>
    g.totalMiB - g.usedMiB < a.totalMiB - a.usedMiB ? g : a
  );
  return {
    memory: {
      totalMiB: least.totalMiB,
      usedMiB: least.usedMiB,
      source: candidates.length === 1
        ? "nvidia-smi"
        : `nvidia-smi, the least free of ${candidates.length} GPUs`,
    },
  };
}
