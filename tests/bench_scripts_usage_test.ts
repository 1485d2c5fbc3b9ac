import assert from "node:assert/strict";
import { isPositiveInteger } from "../bench/bench_io.ts";

/** Runs `deno run -A <script> ...args` and returns its exit status, stdout and stderr. */
async function runScript(script: string, args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", script, ...args],
    env: { XDG_RUNTIME_DIR: "/tmp" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

Deno.test("isPositiveInteger() accepts decimal integers >= 1 only", () => {
  for (const ok of ["1", "64", "0512"]) assert.equal(isPositiveInteger(ok), true, ok);
  for (const bad of ["0", "", "-1", "1.5", "1e3", " 2", "x", "0x10"]) {
    assert.equal(isPositiveInteger(bad), false, bad);
  }
});

Deno.test("the measurement scripts print one error line and exit 2 when given bad flags", async () => {
  const cases: [string, string[], string][] = [
    [
      "bench/matmul_tune.ts",
      ["--kernel-profile", "gpu"],
      "error: Unknown option '--kernel-profile' (deno run -A bench/matmul_tune.ts)",
    ],
    [
      "bench/matmul_tune.ts",
      ["--m", "1,0"],
      'error: --m takes positive integers, got "1,0" (deno run -A bench/matmul_tune.ts)',
    ],
    [
      "bench/matmul_tune.ts",
      ["--shapes", "qkv,attn"],
      'error: --shapes takes qkv, o, gate_up, down, lm_head; got "attn" ' +
      "(deno run -A bench/matmul_tune.ts)",
    ],
    [
      "bench/matmul_tune.ts",
      ["--x-loads", "vec8"],
      "error: --x-loads must be vec4 or scalar, got 'vec8' (deno run -A bench/matmul_tune.ts)",
    ],
    [
      "bench/host_calls.ts",
      ["--batch", "0"],
      "error: --batch, --steps, --context and --max-model-len take positive integers " +
      "(deno run -A bench/host_calls.ts)",
    ],
    [
      "bench/host_calls.ts",
      ["--kernel-profile", "fast"],
      'error: --kernel-profile expects auto, cpu, gpu, got "fast" (deno run -A bench/host_calls.ts)',
    ],
    [
      "bench/dispatch_floor.ts",
      ["--dispatches", "1"],
      'error: --dispatches takes an integer >= 2, got "1" (deno run -A bench/dispatch_floor.ts)',
    ],
    [
      "bench/encode_floor.ts",
      ["--bindings"],
      "error: Option '--bindings <value>' argument missing (deno run -A bench/encode_floor.ts)",
    ],
    [
      "bench/encode_floor.ts",
      ["--bindings", "8", "--buffers", "4"],
      "error: --buffers must be at least --bindings: a dispatch binds distinct buffers " +
      "(deno run -A bench/encode_floor.ts)",
    ],
    [
      "bench/structured_output_bench.ts",
      ["extra"],
      "error: Unexpected argument 'extra'. This command does not take positional arguments " +
      "(deno run -A bench/structured_output_bench.ts)",
    ],
  ];
  for (const [script, args, line] of cases) {
    const out = await runScript(script, args);
    assert.equal(out.code, 2, `${script} ${args.join(" ")}: ${out.stderr}`);
    assert.equal(out.stderr, `${line}\n`, `${script} ${args.join(" ")}`);
    assert.equal(out.stdout, "", `${script} ${args.join(" ")}`);
  }
});
