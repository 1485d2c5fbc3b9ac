/**
 * The kernel profile: one decision from the adapter (`auto`), overridden by the option or the
 * environment variable, followed by every kernel wrapper and reported by `info` and the engine.
 */

import assert from "node:assert/strict";
import { GpuContext } from "../gpu/context.ts";
import {
  isSoftwareAdapter,
  KERNEL_PROFILE_ENV,
  parseKernelProfileChoice,
  resolveKernelProfile,
} from "../gpu/kernel_profile.ts";
import { LLMEngine } from "../engine/llm_engine.ts";
import { describeContext } from "../cli/info.ts";
import { defaultMatmulPolicy } from "../kernels/matmul.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import { makeModel } from "../tools/make_model.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { fakeAdapter } from "./support/adapter.ts";

const adapter = fakeAdapter;

const H100 = adapter({ description: "NVIDIA H100 80GB HBM3", vendor: "4318" });
const LAVAPIPE = adapter({ description: "llvmpipe (LLVM 15.0.6, 256 bits)", device: "0" });

/** Runs `fn` with the profile variable set to `value` (or unset), restoring it after. */
function withEnv<T>(value: string | undefined, fn: () => T): T {
  const before = Deno.env.get(KERNEL_PROFILE_ENV);
  if (value === undefined) Deno.env.delete(KERNEL_PROFILE_ENV);
  else Deno.env.set(KERNEL_PROFILE_ENV, value);
  try {
    return fn();
  } finally {
    if (before === undefined) Deno.env.delete(KERNEL_PROFILE_ENV);
    else Deno.env.set(KERNEL_PROFILE_ENV, before);
  }
}

Deno.test("resolveKernelProfile() picks cpu for software adapters and gpu for hardware ones", () => {
  withEnv(undefined, () => {
    assert.deepEqual(resolveKernelProfile(LAVAPIPE), {
      profile: "cpu",
      reason: "auto: software adapter",
    });
    assert.equal(resolveKernelProfile(adapter({ isFallback: true })).profile, "cpu");
    assert.equal(
      resolveKernelProfile(adapter({ description: "SwiftShader Device" })).profile,
      "cpu",
    );
    assert.equal(resolveKernelProfile(adapter({ architecture: "cpu" })).profile, "cpu");
    assert.deepEqual(resolveKernelProfile(H100), {
      profile: "gpu",
      reason: "auto: hardware adapter",
    });
    assert.equal(isSoftwareAdapter(H100), false);
  });
});

Deno.test("resolveKernelProfile() lets the option beat the environment and the environment beat auto", () => {
  withEnv("gpu", () => {
    assert.equal(resolveKernelProfile(LAVAPIPE).profile, "gpu");
    assert.match(resolveKernelProfile(LAVAPIPE).reason, new RegExp(KERNEL_PROFILE_ENV));
    assert.deepEqual(resolveKernelProfile(LAVAPIPE, "cpu"), { profile: "cpu", reason: "forced" });
  });
  withEnv("auto", () => assert.equal(resolveKernelProfile(H100).profile, "gpu"));
  withEnv("", () => assert.equal(resolveKernelProfile(LAVAPIPE).profile, "cpu"));
  withEnv("fast", () => assert.throws(() => resolveKernelProfile(H100), /must be one of/));
  assert.throws(
    // deno-lint-ignore no-explicit-any
    () => resolveKernelProfile(H100, "tpu" as any),
    TypeError,
  );
  assert.equal(parseKernelProfileChoice(undefined), "auto");
  assert.equal(parseKernelProfileChoice("gpu"), "gpu");
  assert.throws(() => parseKernelProfileChoice("GPU"), /--kernel-profile expects auto, cpu, gpu/);
});

Deno.test(
  "GpuContext.create() follows a forced profile, and kernels and info follow the context",
  GPU_TEST,
  async () => {
    for (const profile of ["cpu", "gpu"] as const) {
      const ctx = await GpuContext.create({ kernelProfile: profile });
      try {
        assert.equal(ctx.profile, profile);
        assert.equal(ctx.isCpuProfile, profile === "cpu");
        assert.equal(defaultMatmulPolicy(ctx), profile);
        assert.match(describeContext(ctx), new RegExp(`Kernels: +${profile} profile \\(forced\\)`));
      } finally {
        ctx.destroy();
      }
    }
    await assert.rejects(
      // deno-lint-ignore no-explicit-any
      () => GpuContext.create({ kernelProfile: "x" as any }),
      TypeError,
    );
  },
);

Deno.test(
  "LLMEngine.create() logs the kernel profile and steps in flight, and runs the model under either one",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      await makeModel({ out: dir, preset: "tiny-llama", dtype: "f32", seed: 5 });
      const outputs: number[][] = [];
      for (const kernelProfile of ["cpu", "gpu"] as const) {
        const lines: string[] = [];
        // Under the gpu profile, more steps in flight than the runner's default 7 (its ring grows).
        const inFlight = kernelProfile === "gpu" ? 12 : 7;
        const engine = await LLMEngine.create(
          {
            model: dir,
            kernelProfile,
            showProgress: false,
            forceF32: true,
            ...(kernelProfile === "gpu" ? { maxInFlight: inFlight } : {}),
          },
          (l) => lines.push(l),
        );
        try {
          assert.ok(
            lines.some((l) => l.includes(`kernel profile ${kernelProfile} (forced)`)),
            lines.join("\n"),
          );
          assert.ok(
            lines.some((l) => l.startsWith(`Steps in flight: up to ${inFlight}`)),
            lines.join("\n"),
          );
          const ids: number[] = [];
          for await (
            const o of engine.generate({
              requestId: "a",
              promptTokenIds: [3, 1, 4, 1, 5, 9, 2, 6],
              params: samplingParams({ temperature: 0, maxTokens: 6, ignoreEos: true }),
            })
          ) ids.push(...o.tokenIds);
          outputs.push(ids);
        } finally {
          await engine.shutdown();
        }
      }
      // Same greedy tokens from both kernel families (f32 weights; float64 parity is tested per
      // profile by the whole suite under WEBGPU_LLM_KERNEL_PROFILE=gpu).
      assert.deepEqual(outputs[0], outputs[1]);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);
