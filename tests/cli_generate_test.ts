import assert from "node:assert/strict";
import { makeModel } from "../tools/make_model.ts";
import { ReferenceModel } from "./reference/model.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";
import { runMain } from "./support/cli.ts";

/** `main.ts generate ...args`. */
function generate(args: string[]) {
  return runMain(["generate", ...args]);
}

Deno.test(
  "main.ts generate --json batches several prompts and matches the float64 reference",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      const { seed, rng } = testSeed("cli generate");
      await makeModel({ out: dir, preset: "tiny-llama", dtype: "f32", seed: seed % 997 });
      const ref = await ReferenceModel.load(dir);
      const prompts = [3, 17, 40].map((n) => Array.from({ length: n }, () => rng.int(0, 500)));
      const r = await generate([
        "--model",
        dir,
        "--force-f32",
        ...prompts.flatMap((p) => ["--prompt-ids", p.join(",")]),
        "--max-tokens",
        "16",
        "--temperature",
        "0",
        "--ignore-eos",
        "--json",
      ]);
      assert.equal(r.code, 0, r.stderr);
      const lines = r.stdout.trim().split("\n").map((l) => JSON.parse(l));
      assert.equal(lines.length, 3);
      lines.forEach((line, i) => {
        assert.deepEqual(Object.keys(line), ["index", "token_ids", "text", "finish_reason"]);
        assert.equal(line.index, i);
        assert.equal(line.finish_reason, "length");
        assert.deepEqual(
          line.token_ids,
          ref.greedy(prompts[i]!, 16).map((s) => s.token),
          `seed ${seed} prompt ${i}`,
        );
      });
      // Streamed text (no --json) is the same text.
      const streamed = await generate([
        "--model",
        dir,
        "--force-f32",
        "--prompt-ids",
        prompts[0]!.join(","),
        "--max-tokens",
        "16",
        "--temperature",
        "0",
        "--ignore-eos",
      ]);
      assert.equal(streamed.code, 0, streamed.stderr);
      assert.equal(streamed.stdout, lines[0].text + "\n");
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

Deno.test("main.ts generate rejects bad flags with one line and no stack trace", async () => {
  for (
    const args of [
      ["--max-tokens", "x", "--prompt", "a"],
      ["--prompt-ids", "1,b"],
      ["--bogus"],
      [],
      ["--prompt", "a", "--scheduler", "nope", "--executor", "mock"],
      // Flags that would be ignored: a server's name; a model option of the mock executor.
      ["--prompt", "a", "--served-model-name", "x", "--executor", "mock"],
      ["--prompt", "a", "--executor", "mock", "--quantization", "int4"],
    ]
  ) {
    const r = await generate(args);
    // An unknown flag is a usage error (2); a bad value or a missing prompt, 1.
    assert.equal(r.code, args[0] === "--bogus" ? 2 : 1, `${args.join(" ")}: ${r.stderr}`);
    const errors = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
    assert.equal(errors.length, 1, `${args.join(" ")}: ${r.stderr}`);
    assert.doesNotMatch(r.stderr, /at .*\.ts:\d+/);
  }
});
