/**
 * Domain errors of the GPU runtime. Each carries a one-line message fit for a CLI or an HTTP
 * error body; the original cause, when there is one, is kept in `cause`.
 *
 * @module
 */

/** No WebGPU adapter could be obtained (no GPU, no Vulkan/GL driver, or WebGPU disabled). */
export class GpuUnavailableError extends Error {
  override name = "GpuUnavailableError";
}

/**
 * The device was lost or reported an uncaptured error (validation, out of memory, internal).
 * Once raised, the device is unusable: the engine must fail in-flight requests and stop.
 */
export class GpuDeviceError extends Error {
  override name = "GpuDeviceError";
}
