/**
 * What the benchmark commands (`bench:batching`, `bench:prefill-decode`, `bench:serve`) share at
 * their edge: the error for bad command-line input and the line sinks tests capture.
 *
 * @module
 */

/** Bad command-line input: reported as one line, exit status 2. */
export class UsageError extends Error {
  override name = "UsageError";
}

/** Where a benchmark's lines go (tests capture them). */
export interface BenchIo {
  log(line: string): void;
  err(line: string): void;
}
