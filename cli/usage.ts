/**
 * Command-line input errors of `main.ts` commands: an unknown flag, a missing value, a stray
 * argument. `main.ts` prints them as one line with a hint and exits with status 2 (1 is for
 * everything else), as the `bench:*` tasks do.
 *
 * @module
 */

import { parseArgs, type ParseArgsConfig } from "node:util";

/** Bad command-line input of a `main.ts` command (exit status 2). */
export class UsageError extends Error {
  override name = "UsageError";
}

/**
 * `parseArgs` (strict by default) whose own errors become one-line
 * {@linkcode UsageError}s ending with a hint to `main.ts <command> --help`.
 */
export function parseCommandArgs<T extends ParseArgsConfig>(
  command: string,
  config: T,
): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs<T>(config);
  } catch (error) {
    const message = (error instanceof Error ? error.message : String(error)).split("\n")[0];
    throw new UsageError(`${message} (see 'main.ts ${command} --help')`);
  }
}
