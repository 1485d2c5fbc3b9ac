/**
 * Every command explains itself: `--help` prints its usage on stdout and exits 0; an unknown
 * flag prints one line (with a hint to `--help`) on stderr and exits 2, never a stack trace.
 */

import assert from "node:assert/strict";

const ROOT = new URL("..", import.meta.url).pathname;

/** The commands and tasks, as a user runs them (the deno.json task's script and command). */
const COMMANDS: readonly (readonly string[])[] = [
  ["main.ts", "info"],
  ["main.ts", "serve"],
  ["main.ts", "generate"],
  ["main.ts", "cluster"],
  ["tools/make_model.ts"],
  ["bench/batching.ts"],
  ["bench/prefill_decode.ts"],
  ["bench/serve.ts"],
  ["bench/model_bench.ts"],
  ["bench/prompt_logprobs_bench.ts"],
];

async function run(args: readonly string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", ...args],
    cwd: ROOT,
    env: { XDG_RUNTIME_DIR: "/tmp" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

for (const command of COMMANDS) {
  const name = command.join(" ");
  Deno.test(`${name} --help prints its usage and exits 0`, async () => {
    const r = await run([...command, "--help"]);
    assert.equal(r.code, 0, `${name}: ${r.stderr}`);
    assert.match(r.stdout, /^usage: /m, name);
    assert.doesNotMatch(r.stderr, /\bat .*\.ts:\d+/, `${name}: no stack trace`);
  });
  Deno.test(`${name} with an unknown flag prints one line and exits 2`, async () => {
    const r = await run([...command, "--no-such-flag"]);
    assert.equal(r.code, 2, `${name}: ${r.stderr}`);
    const lines = r.stderr.split("\n").filter((l) => l.trim() !== "" && !/XDG_RUNTIME_DIR/.test(l));
    assert.equal(lines.length, 1, `${name}: ${r.stderr}`);
    assert.match(lines[0]!, /no-such-flag/);
    assert.match(lines[0]!, /--help|usage:/, `${name}: a hint to the usage`);
    assert.doesNotMatch(r.stderr, /\bat .*\.ts:\d+/, `${name}: no stack trace`);
  });
}

Deno.test("serve and generate say the same one line for a --model that is not a model directory", async () => {
  const lines: string[] = [];
  for (const command of [["serve"], ["generate", "--prompt", "hi"]]) {
    const r = await run(["main.ts", ...command, "--model", "/no/such/dir"]);
    assert.equal(r.code, 1, r.stderr);
    const errors = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
    assert.equal(errors.length, 1, r.stderr);
    lines.push(errors[0]!);
  }
  assert.equal(lines[0], lines[1]);
  assert.equal(
    lines[0],
    "error: /no/such/dir is not a model directory (no such directory); --model takes a Hugging " +
      "Face checkpoint directory",
  );
});

Deno.test("the bench tasks say the same one line for a --model that is not a model directory", async () => {
  for (const script of ["bench/model_bench.ts", "bench/prefill_decode.ts"]) {
    const r = await run([script, "--model", "/no/such/dir"]);
    assert.equal(r.code, 1, `${script}: ${r.stderr}`);
    const errors = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
    assert.deepEqual(errors, [
      "error: /no/such/dir is not a model directory (no such directory); --model takes a Hugging " +
      "Face checkpoint directory",
    ], script);
  }
});

Deno.test("bench:model refuses flags that others would make ignored, with one line and exit 2", async () => {
  const cases: [string[], string][] = [
    [
      ["--no-breakdown", "--breakdown-batches", "1"],
      "error: --breakdown-batches and --breakdown-prefill need the breakdown",
    ],
    [
      ["--no-breakdown", "--breakdown-prefill", "64"],
      "error: --breakdown-batches and --breakdown-prefill need the breakdown",
    ],
    [
      ["--overlap", "off", "--readback-batch", "2"],
      "error: --readback-batch applies to overlapped steps, not --overlap off",
    ],
  ];
  for (const [flags, line] of cases) {
    const r = await run(["bench/model_bench.ts", ...flags]);
    assert.equal(r.code, 2, `${flags.join(" ")}: ${r.stderr}`);
    assert.deepEqual(r.stderr.trim().split("\n"), [line], flags.join(" "));
  }
});

Deno.test("serve refuses an engine flag its executor would ignore before it binds a port", async () => {
  const r = await run([
    "main.ts",
    "serve",
    "--port",
    "0",
    "--executor",
    "mock",
    "--quantization",
    "int4",
  ]);
  assert.equal(r.code, 1, r.stderr);
  assert.doesNotMatch(r.stdout + r.stderr, /Listening on/);
  assert.deepEqual(r.stderr.trim().split("\n"), [
    "error: Invalid engine option quantization: it applies to the webgpu executor, not executor mock",
  ]);
});

Deno.test("cluster refuses --nginx with --no-nginx, with one line and exit 2", async () => {
  const r = await run(["main.ts", "cluster", "--no-nginx", "--nginx", "/usr/sbin/nginx"]);
  assert.equal(r.code, 2, r.stderr);
  const errors = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
  assert.equal(errors.length, 1, r.stderr);
  assert.match(errors[0]!, /^error: --nginx names the binary to start: not with --no-nginx/);
  assert.doesNotMatch(r.stdout, /Listening|Replicas/);
});
