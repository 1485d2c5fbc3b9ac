/**
 * What the benchmark commands (`bench:batching`, `bench:prefill-decode`, `bench:serve`) share at
 * their edge: the error for bad command-line input and the line sinks tests capture.
 *
 * @module
 */

import { type KernelProfileChoice, parseKernelProfileChoice } from "../gpu/kernel_profile.ts";

/** Bad command-line input: reported as one line, exit status 2. */
export class UsageError extends Error {
  override name = "UsageError";
}

/** The value of a benchmark's `--kernel-profile` flag; a {@linkcode UsageError} when invalid. */
export function kernelProfileOption(value: string | undefined): KernelProfileChoice {
  try {
    return parseKernelProfileChoice(value);
  } catch (error) {
    throw new UsageError(error instanceof Error ? error.message : String(error));
  }
}

/** Where a benchmark's lines go (tests capture them). */
export interface BenchIo {
  log(line: string): void;
  err(line: string): void;
}
