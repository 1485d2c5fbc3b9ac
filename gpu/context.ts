/**
 * The GPU context: one adapter, one device, the limits the engine asked for, the weight dtype
 * chosen for this device, a pipeline cache (every pipeline is compiled once) and the single
 * place where device loss and uncaptured errors are turned into a {@linkcode GpuDeviceError}.
 *
 * @module
 */

import { GpuDeviceError, GpuUnavailableError } from "./errors.ts";
import {
  type KernelProfile,
  type KernelProfileChoice,
  type ResolvedKernelProfile,
  resolveKernelProfile,
} from "./kernel_profile.ts";
import type { DType } from "./dtype.ts";

/** Options for {@linkcode GpuContext.create}; every field is optional. */
export interface GpuContextOptions {
  /** Use f32 weights and KV cache even when `shader-f16` exists. */
  forceF32?: boolean;
  /**
   * Largest storage binding the engine will use, in bytes (at most the adapter's
   * `maxStorageBufferBindingSize`). Tests lower it to exercise split tensors on small inputs.
   */
  maxBindingBytes?: number;
  /** Adapter power preference; default "high-performance" (a real GPU over an integrated one). */
  powerPreference?: GPUPowerPreference;
  /** Kernel variants to run (gpu/kernel_profile.ts); default `auto`. */
  kernelProfile?: KernelProfileChoice;
}

/** What `main.ts info` prints and the server logs about the adapter. */
export interface AdapterSummary {
  readonly description: string;
  readonly vendor: string;
  readonly architecture: string;
  readonly device: string;
  readonly isFallback: boolean;
  readonly features: {
    readonly shaderF16: boolean;
    readonly timestampQuery: boolean;
    readonly subgroups: boolean;
  };
}

/** What `adapter` says of itself, as the engine logs it. */
export function adapterSummary(adapter: GPUAdapter): AdapterSummary {
  const info = adapter.info;
  return {
    description: info.description || "(unnamed adapter)",
    vendor: info.vendor,
    architecture: info.architecture,
    device: info.device,
    isFallback: (info as { isFallbackAdapter?: boolean }).isFallbackAdapter ?? false,
    features: {
      shaderF16: adapter.features.has("shader-f16"),
      timestampQuery: adapter.features.has("timestamp-query"),
      subgroups: adapter.features.has("subgroups" as GPUFeatureName),
    },
  };
}

/** The compute limits the engine requests: the adapter's own maximum for each. */
export const REQUESTED_LIMITS = [
  "maxBufferSize",
  "maxStorageBufferBindingSize",
  "maxUniformBufferBindingSize",
  "maxStorageBuffersPerShaderStage",
  "maxUniformBuffersPerShaderStage",
  "maxBindGroups",
  "maxBindingsPerBindGroup",
  "maxComputeWorkgroupStorageSize",
  "maxComputeInvocationsPerWorkgroup",
  "maxComputeWorkgroupSizeX",
  "maxComputeWorkgroupSizeY",
  "maxComputeWorkgroupSizeZ",
  "maxComputeWorkgroupsPerDimension",
  "maxTextureDimension2D",
  "maxTextureArrayLayers",
] as const;

/** Name of one of the {@linkcode REQUESTED_LIMITS}. */
export type RequestedLimit = typeof REQUESTED_LIMITS[number];

/** Owns the WebGPU device. Create one with {@linkcode GpuContext.create}. */
export class GpuContext {
  /** The device every buffer and pipeline belongs to. */
  readonly device: GPUDevice;
  /** Adapter name, vendor, fallback flag and features. */
  readonly adapter: AdapterSummary;
  /** The limits requested from (and granted by) the device. */
  readonly limits: Readonly<Record<RequestedLimit, number>>;
  /** Dtype of weights and KV cache on this device: f16 with `shader-f16`, unless forced f32. */
  readonly weightDtype: DType;
  /** Whether shaders may use `enable f16;` on this device. */
  readonly hasF16: boolean;
  /** Whether compute passes may carry `timestampWrites`. */
  readonly hasTimestamps: boolean;
  /** Largest storage binding used, in bytes (see {@linkcode GpuContextOptions.maxBindingBytes}). */
  readonly maxBindingBytes: number;
  /** Resolves with the first fatal error (device lost, uncaptured error); never rejects. */
  readonly failed: Promise<GpuDeviceError>;
  /** The kernel profile every kernel wrapper follows on this device. */
  readonly profile: KernelProfile;
  /** Why {@linkcode GpuContext.profile} was chosen ("auto: software adapter", "forced", ...). */
  readonly profileReason: string;

  #error: GpuDeviceError | undefined;
  #destroyed = false;
  #pipelines = new Map<string, GPUComputePipeline>();

  private constructor(
    device: GPUDevice,
    adapter: AdapterSummary,
    limits: Record<RequestedLimit, number>,
    options: GpuContextOptions,
    profile: ResolvedKernelProfile,
  ) {
    this.device = device;
    this.adapter = adapter;
    this.limits = limits;
    this.hasF16 = device.features.has("shader-f16");
    this.hasTimestamps = device.features.has("timestamp-query");
    this.weightDtype = this.hasF16 && !options.forceF32 ? "f16" : "f32";
    this.profile = profile.profile;
    this.profileReason = profile.reason;
    const bindingLimit = limits.maxStorageBufferBindingSize;
    this.maxBindingBytes = Math.min(options.maxBindingBytes ?? bindingLimit, bindingLimit);
    if (this.maxBindingBytes < 256 || this.maxBindingBytes % 4 !== 0) {
      throw new RangeError(
        `maxBindingBytes must be a multiple of 4 and at least 256: got ${this.maxBindingBytes}`,
      );
    }
    let report: (e: GpuDeviceError) => void = () => {};
    this.failed = new Promise((resolve) => (report = resolve));
    const fail = (message: string, cause?: unknown) => {
      if (this.#error !== undefined) return;
      this.#error = new GpuDeviceError(message, { cause });
      report(this.#error);
    };
    device.lost.then((info) => {
      if (!this.#destroyed) fail(`GPU device lost (${info.reason}): ${info.message}`);
    });
    device.addEventListener("uncapturederror", (event) => {
      const error = (event as GPUUncapturedErrorEvent).error;
      fail(`GPU error: ${error.message.split("\n")[0]}`, error);
    });
  }

  /**
   * Picks an adapter (a real GPU first, then any, including a software fallback), requests a
   * device with the adapter's maximum compute limits and `shader-f16` / `timestamp-query` where
   * present.
   *
   * @throws {GpuUnavailableError} when no adapter exists.
   * @throws {TypeError} when `options.kernelProfile` (or its environment variable) is not a
   *   profile.
   */
  static async create(options: GpuContextOptions = {}): Promise<GpuContext> {
    if (typeof navigator === "undefined" || navigator.gpu === undefined) {
      throw new GpuUnavailableError("WebGPU is not available in this runtime");
    }
    const adapter = (await navigator.gpu.requestAdapter({
      powerPreference: options.powerPreference ?? "high-performance",
    })) ?? (await navigator.gpu.requestAdapter());
    if (adapter === null) {
      throw new GpuUnavailableError(
        "No WebGPU adapter found: install a GPU driver or Mesa's lavapipe (apt-get install mesa-vulkan-drivers)",
      );
    }
    const limits = {} as Record<RequestedLimit, number>;
    for (const name of REQUESTED_LIMITS) limits[name] = adapter.limits[name];
    const wanted: GPUFeatureName[] = ["shader-f16", "timestamp-query"];
    const requiredFeatures = wanted.filter((f) => adapter.features.has(f));
    const summary = adapterSummary(adapter);
    // Decided before the device exists, so a bad choice leaks nothing.
    const profile = resolveKernelProfile(summary, options.kernelProfile);
    const device = await adapter.requestDevice({ requiredFeatures, requiredLimits: limits });
    return new GpuContext(device, summary, limits, options, profile);
  }

  /**
   * Whether kernels run their `cpu`-profile variants here (barrier-free, per-invocation: see
   * gpu/kernel_profile.ts). The profile, not the adapter, decides: it can be forced.
   */
  get isCpuProfile(): boolean {
    return this.profile === "cpu";
  }

  /** The fatal error, if one happened. */
  get error(): GpuDeviceError | undefined {
    return this.#error;
  }

  /** Throws the fatal error, if one happened. Call before encoding new work. */
  check(): void {
    if (this.#error !== undefined) throw this.#error;
  }

  /**
   * Returns the pipeline cached under `key`, compiling `code` (entry point `main`) on first use.
   * Keys name the kernel and its variant, e.g. `matmul/tiled/f16/bias`.
   */
  pipeline(
    key: string,
    code: () => string,
    constants?: Record<string, number>,
  ): GPUComputePipeline {
    let pipeline = this.#pipelines.get(key);
    if (pipeline === undefined) {
      const module = this.device.createShaderModule({ label: key, code: code() });
      pipeline = this.device.createComputePipeline({
        label: key,
        layout: "auto",
        compute: { module, entryPoint: "main", constants },
      });
      this.#pipelines.set(key, pipeline);
    }
    return pipeline;
  }

  /** Creates a GPU buffer; `size` is rounded up to a multiple of 4 bytes. */
  createBuffer(label: string, size: number, usage: GPUBufferUsageFlags): GPUBuffer {
    if (size > this.limits.maxBufferSize) {
      throw new RangeError(
        `Cannot create buffer ${label} of ${size} bytes: the device allows ${this.limits.maxBufferSize}`,
      );
    }
    return this.device.createBuffer({ label, size: Math.max(4, Math.ceil(size / 4) * 4), usage });
  }

  /** Destroys the device; later device loss is expected and not reported. */
  destroy(): void {
    this.#destroyed = true;
    this.#pipelines.clear();
    this.device.destroy();
  }
}

/** Usage flags of a storage buffer that can be written from the host and read back. */
export const STORAGE_RW = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST |
  GPUBufferUsage.COPY_SRC;
