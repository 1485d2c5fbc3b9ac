/**
 * Adapter summaries as wgpu reports real adapters, for tests of what the engine decides from
 * them (kernel profile, GPU memory) without the adapter itself.
 *
 * @module
 */

import type { AdapterSummary } from "../../gpu/context.ts";

/** An adapter summary: every field empty or false but `over`'s, with shader-f16 and timestamps. */
export function fakeAdapter(over: Partial<AdapterSummary>): AdapterSummary {
  return {
    description: "",
    vendor: "",
    architecture: "",
    device: "",
    isFallback: false,
    features: { shaderF16: true, timestampQuery: true, subgroups: false },
    ...over,
  };
}

/** An NVIDIA H200 (vendor 0x10de) as wgpu describes it. */
export const H200_ADAPTER = fakeAdapter({
  description: "NVIDIA H200",
  vendor: "4318",
  device: "8995",
});
