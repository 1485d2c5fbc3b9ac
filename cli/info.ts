/**
 * `main.ts info`: what the engine sees of the GPU — the adapter (name, vendor, fallback or
 * not), the limits it will request, the optional features, and the dtype weights will use.
 * With `--model DIR` it also loads the model (with `--quantization`) and prints its weight bytes
 * on the device, and what they would be unquantized.
 *
 * @module
 */

import { GpuContext, REQUESTED_LIMITS } from "../gpu/context.ts";
import { type DeviceMemoryReading, readDeviceMemory } from "../gpu/device_memory.ts";
import type { KernelProfileChoice } from "../gpu/kernel_profile.ts";
import type { QuantizationChoice } from "../gpu/quant.ts";
import { ModelRunner } from "../engine/model_runner.ts";
import { resolveModelDir } from "./engine_flags.ts";
import { cachedTunings, kernelTuningCachePath } from "../engine/kernel_tuning.ts";
import { DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_KV_CACHE_MIB } from "../engine/kv_cache_size.ts";

/** Formats a byte count as an exact integer plus MiB/GiB when large. */
function formatLimit(name: string, value: number): string {
  const isBytes = /Size$/.test(name);
  if (!isBytes || value < 1 << 20) return value.toLocaleString("en-US");
  const unit = value >= 1 << 30 ? [1 << 30, "GiB"] as const : [1 << 20, "MiB"] as const;
  return `${value.toLocaleString("en-US")} (${(value / unit[0]).toFixed(1)} ${unit[1]})`;
}

/** PCI vendor ids wgpu reports, by name. */
const VENDORS: Record<string, string> = {
  "4318": "NVIDIA",
  "4098": "AMD",
  "32902": "Intel",
  "5140": "Qualcomm",
  "4203": "Apple",
  "65541": "Mesa (software)",
};

/** Builds the report printed by `main.ts info` for a context. */
export function describeContext(ctx: GpuContext): string {
  const a = ctx.adapter;
  const yes = (b: boolean) => (b ? "yes" : "no");
  const kind = a.isFallback ? "software fallback adapter (no GPU found)" : "hardware adapter";
  const lines = [
    `Adapter:   ${a.description}`,
    `Vendor:    ${VENDORS[a.vendor] ?? "unknown"} (id ${a.vendor || "?"})${
      a.architecture ? `, architecture ${a.architecture}` : ""
    }`,
    `Kind:      ${kind}`,
    "Features:",
    `  shader-f16       ${yes(a.features.shaderF16)}`,
    `  timestamp-query  ${yes(a.features.timestampQuery)}`,
    `  subgroups        ${yes(a.features.subgroups)}`,
    `Weights:   ${ctx.weightDtype} (KV cache ${ctx.weightDtype}; activations f32)`,
    `Kernels:   ${ctx.profile} profile (${ctx.profileReason})`,
    "Limits requested (the adapter's maximum):",
    ...REQUESTED_LIMITS.map((n) => `  ${n.padEnd(36)} ${formatLimit(n, ctx.limits[n])}`),
  ];
  return lines.join("\n");
}

const f = (n: number) => n.toLocaleString("en-US");

/** The report's line on the GPU's memory (what the KV cache is sized from by default). */
export function describeMemory(reading: DeviceMemoryReading): string {
  if (!("memory" in reading)) {
    return `Memory:    unknown (${reading.unknown}): the KV cache takes --kv-cache-memory, ` +
      `default ${f(DEFAULT_KV_CACHE_MIB)} MiB`;
  }
  const m = reading.memory;
  return `Memory:    ${f(m.totalMiB)} MiB, ${f(m.usedMiB)} MiB in use (${m.source}): the engine ` +
    `may use --gpu-memory-utilization of it (default ${DEFAULT_GPU_MEMORY_UTILIZATION} of the ` +
    "memory free at start-up), the KV " +
    "cache what the model leaves";
}

/** Runs `info`: prints the report, returns the exit code. */
export async function runInfo(
  args: {
    forceF32: boolean;
    kernelProfile?: KernelProfileChoice;
    model?: string;
    quantization?: QuantizationChoice;
  },
): Promise<number> {
  const ctx = await GpuContext.create({
    forceF32: args.forceF32,
    ...(args.kernelProfile !== undefined ? { kernelProfile: args.kernelProfile } : {}),
  });
  try {
    console.log(describeContext(ctx));
    console.log(describeMemory(await readDeviceMemory(ctx.adapter)));
    const path = kernelTuningCachePath();
    const cached = await cachedTunings(ctx, path);
    console.log(
      `Tuning:    ${
        ctx.profile === "gpu"
          ? `${cached?.entries ?? 0} measured kernel tuning(s) for this adapter in ${path}` +
            (cached !== null && cached.entries > 0 ? `, newest ${cached.newest}` : "") +
            ' (--kernel-tuning, README "Kernel profiles")'
          : "none under the cpu profile"
      }`,
    );
    if (args.model !== undefined) {
      const dir = await resolveModelDir(args.model);
      const choice = args.quantization ?? "auto";
      const runner = await ModelRunner.load(ctx, dir, {
        maxTokens: 16,
        maxSeqs: 1,
        maxModelLen: 16,
        blockSize: 16,
        numKvBlocks: 1,
        showProgress: false,
        quantization: choice,
      });
      const { device, unquantized, notes, quantization } = runner.weights;
      runner.destroy();
      const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
      console.log(
        `Model:     ${dir}\n` +
          `Weights on the device: ${mib(device)} (${device.toLocaleString("en-US")} bytes), ` +
          `quantization ${quantization}${choice === "auto" ? " (auto)" : ""}` +
          (quantization === "none"
            ? ""
            : `; unquantized (${ctx.weightDtype}): ${mib(unquantized)}, ratio ${
              (device / unquantized).toFixed(3)
            }`),
      );
      for (const note of notes) console.log(`  ${note}`);
    }
  } finally {
    ctx.destroy();
  }
  return 0;
}
