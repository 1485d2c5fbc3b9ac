/**
 * Runs `main.ts` in a child Deno process, as a user would from the shell.
 *
 * @module
 */

const MAIN = new URL("../../main.ts", import.meta.url).pathname;

/** Exit code and decoded output of one `main.ts` run. */
export interface MainResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs `deno run -A main.ts ...args` with `XDG_RUNTIME_DIR=/tmp` plus `env`. */
export async function runMain(
  args: readonly string[],
  env: Record<string, string> = {},
): Promise<MainResult> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MAIN, ...args],
    env: { XDG_RUNTIME_DIR: "/tmp", ...env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decode = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, stdout: decode(out.stdout), stderr: decode(out.stderr) };
}
