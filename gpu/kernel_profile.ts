/**
 * The kernel profile: which family of kernel variants a device runs. The one place that decides
 * it from the adapter (`auto`), and the override every command offers (`--kernel-profile`).
 *
 * | profile | for | variants (see docs/kernels.md) |
 * | --- | --- | --- |
 * | `cpu` | software adapters (Mesa lavapipe / llvmpipe, SwiftShader, any fallback adapter) | barrier-free, one output block per invocation (`unrolled` / `blocked` matmul, `unrolled` attention, small sampling workgroups): barriers and divergent loads are expensive on a CPU |
 * | `gpu` | discrete and integrated GPUs | workgroup reductions and shared-memory tiles (`gemv` / `tiled` matmul, `workgroup` attention, wide sampling workgroups) |
 *
 * Either profile runs on any adapter (both are tested end to end on lavapipe); only speed
 * differs. `auto` picks `cpu` for a software adapter, else `gpu`. The environment variable
 * {@linkcode KERNEL_PROFILE_ENV} sets the default of `auto` (CI runs the whole-model tests
 * under each profile with it).
 *
 * @module
 */

import type { AdapterSummary } from "./context.ts";

/** A family of kernel variants. */
export type KernelProfile = "cpu" | "gpu";

/** What a user may ask for: a profile, or `auto` (decided from the adapter). */
export type KernelProfileChoice = "auto" | KernelProfile;

/** The accepted values of `--kernel-profile`. */
export const KERNEL_PROFILE_CHOICES: readonly KernelProfileChoice[] = ["auto", "cpu", "gpu"];

/** Environment variable whose value (`auto`, `cpu`, `gpu`) replaces an `auto` choice. */
export const KERNEL_PROFILE_ENV = "WEBGPU_LLM_KERNEL_PROFILE";

/**
 * `value` as a profile choice (a command-line flag's value).
 *
 * @throws {TypeError} naming `flag` when it is not one of {@linkcode KERNEL_PROFILE_CHOICES}.
 */
export function parseKernelProfileChoice(
  value: string | undefined,
  flag = "--kernel-profile",
): KernelProfileChoice {
  if (value === undefined) return "auto";
  if (!isKernelProfileChoice(value)) {
    throw new TypeError(`${flag} expects ${KERNEL_PROFILE_CHOICES.join(", ")}, got "${value}"`);
  }
  return value;
}

/** Whether `value` is one of {@linkcode KERNEL_PROFILE_CHOICES}. */
export function isKernelProfileChoice(value: unknown): value is KernelProfileChoice {
  return typeof value === "string" && (KERNEL_PROFILE_CHOICES as readonly string[]).includes(value);
}

/**
 * Whether the adapter is a CPU rasteriser (Mesa lavapipe / llvmpipe, SwiftShader, or any adapter
 * flagged as a fallback).
 */
export function isSoftwareAdapter(adapter: AdapterSummary): boolean {
  return adapter.isFallback ||
    /llvmpipe|lavapipe|swiftshader|\bcpu\b/i.test(
      `${adapter.description} ${adapter.device} ${adapter.architecture}`,
    );
}

/** The profile and why it was chosen (printed at start-up and by `info`). */
export interface ResolvedKernelProfile {
  readonly profile: KernelProfile;
  /** e.g. "auto: software adapter", "forced by --kernel-profile", "forced by WEBGPU_LLM_KERNEL_PROFILE". */
  readonly reason: string;
}

function envChoice(): KernelProfileChoice | undefined {
  let value: string | undefined;
  try {
    value = Deno.env.get(KERNEL_PROFILE_ENV);
  } catch {
    return undefined; // no --allow-env: the variable does not apply
  }
  if (value === undefined || value === "") return undefined;
  if (!isKernelProfileChoice(value)) {
    throw new TypeError(
      `${KERNEL_PROFILE_ENV} must be one of ${KERNEL_PROFILE_CHOICES.join(", ")}, got "${value}"`,
    );
  }
  return value;
}

/**
 * The profile for `adapter` given the user's `choice` (default `auto`): a forced profile wins;
 * `auto` takes {@linkcode KERNEL_PROFILE_ENV} when set, else `cpu` for a software adapter and
 * `gpu` otherwise.
 *
 * @throws {TypeError} when the choice or the environment variable is not a profile.
 */
export function resolveKernelProfile(
  adapter: AdapterSummary,
  choice: KernelProfileChoice = "auto",
): ResolvedKernelProfile {
  if (!isKernelProfileChoice(choice)) {
    throw new TypeError(
      `The kernel profile must be one of ${KERNEL_PROFILE_CHOICES.join(", ")}, got "${choice}"`,
    );
  }
  if (choice !== "auto") return { profile: choice, reason: "forced" };
  const env = envChoice();
  if (env !== undefined && env !== "auto") {
    return { profile: env, reason: `forced by ${KERNEL_PROFILE_ENV}` };
  }
  return isSoftwareAdapter(adapter)
    ? { profile: "cpu", reason: "auto: software adapter" }
    : { profile: "gpu", reason: "auto: hardware adapter" };
}
