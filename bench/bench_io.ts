/**
 * What the benchmark commands (`bench:batching`, `bench:prefill-decode`, `bench:serve`) and the
 * measurement scripts (`bench/matmul_tune.ts`, `bench/host_calls.ts`, ...) share at their edge:
 * the error for bad command-line input, the strict flag parser and its checks, the default output
 * folder, and the line sinks tests capture.
 *
 * @module
 */

import { parseArgs, type ParseArgsOptionsConfig } from "node:util";
import { type KernelProfileChoice, parseKernelProfileChoice } from "../gpu/kernel_profile.ts";

/** Bad command-line input: reported as one line, exit status 2. */
export class UsageError extends Error {
  override name = "UsageError";
}

/**
 * Reports a {@linkcode UsageError} of benchmark `task` and returns the exit status: a message
 * starting with "usage:" is the requested help (stdout, 0); anything else is one line and a hint
 * (stderr, 2).
 */
export function reportUsage(error: UsageError, io: BenchIo, task: string): number {
  if (error.message.startsWith("usage:")) {
    io.log(error.message);
    return 0;
  }
  io.err(`error: ${error.message.split("\n")[0]} (see 'deno task ${task} --help')`);
  return 2;
}

/**
 * Runs a benchmark's entry point: its exit status, or 1 with one `error:` line for anything it
 * throws (a model directory that is not one, an unreachable server), never a stack trace.
 */
export async function runMain(run: () => Promise<number>): Promise<number> {
  try {
    return await run();
  } catch (error) {
    console.error(
      `error: ${(error instanceof Error ? error.message : String(error)).split("\n")[0]}`,
    );
    return 1;
  }
}

/** What `parse` returns; anything it throws becomes a {@linkcode UsageError} with its message. */
export function orUsageError<T>(parse: () => T): T {
  try {
    return parse();
  } catch (error) {
    throw new UsageError(error instanceof Error ? error.message : String(error));
  }
}

/**
 * The flag values of `argv` (strict: unknown flags and positionals are a {@linkcode UsageError}
 * carrying parseArgs' message).
 */
export function parseFlags<const T extends ParseArgsOptionsConfig>(argv: string[], options: T) {
  return orUsageError(() =>
    parseArgs({ args: argv, strict: true, allowPositionals: false, options }).values
  );
}

/**
 * The flag values of a measurement script run as `deno run -A <script>` (not a `deno task`), as
 * {@linkcode parseFlags} parses them; bad input (an unknown flag, a positional, a missing value, or
 * what `check` throws for the values) prints one `error:` line naming the script and exits with
 * status 2, never a stack trace.
 */
export function scriptFlags<const T extends ParseArgsOptionsConfig>(
  script: string,
  argv: string[],
  options: T,
  check: (values: ReturnType<typeof parseFlags<T>>) => void = () => {},
): ReturnType<typeof parseFlags<T>> {
  try {
    const values = parseFlags(argv, options);
    check(values);
    return values;
  } catch (error) {
    const message = (error instanceof Error ? error.message : String(error)).split("\n")[0];
    console.error(`error: ${message} (deno run -A ${script})`);
    Deno.exit(2);
  }
}

/** Whether `text` is a decimal integer >= 1 (a flag's value). */
export function isPositiveInteger(text: string): boolean {
  return /^[0-9]+$/.test(text) && Number(text) >= 1;
}

/** `value` when it is one of `allowed`; else a {@linkcode UsageError} naming `--flag`. */
export function oneOf<const T extends readonly string[]>(
  flag: string,
  value: string,
  allowed: T,
): T[number] {
  if (!allowed.includes(value)) {
    throw new UsageError(`--${flag} must be ${allowed.join(" or ")}, got '${value}'`);
  }
  return value as T[number];
}

/** The default output folder of a run named `name`: bench/results/NAME-<time>/ (git-ignored). */
export function resultsDir(name: string): string {
  return `bench/results/${name}-${new Date().toISOString().replace(/[:.]/g, "-")}`;
}

/** The value of a benchmark's `--kernel-profile` flag; a {@linkcode UsageError} when invalid. */
export function kernelProfileOption(value: string | undefined): KernelProfileChoice {
  return orUsageError(() => parseKernelProfileChoice(value));
}

/** Where a benchmark's lines go (tests capture them). */
export interface BenchIo {
  log(line: string): void;
  err(line: string): void;
}
