/**
 * The grammar worker of structured outputs (engine/structured_output/grammar_worker.ts): a
 * compile past `--grammar-compile-timeout-s` is a 400 while the other constrained requests go on
 * (their matchers rebuilt in a new worker, with the same masks), and a request is scheduled only
 * once its next mask is back.
 */

import assert from "node:assert/strict";
import { LLMEngine } from "../engine/llm_engine.ts";
import { StructuredOutputs } from "../engine/structured_output/structured_outputs.ts";
import { startServer } from "../server/server.ts";
import type { StructuredOutputSpec } from "../scheduler/sampling_params.ts";
import { makeModel } from "../tools/make_model.ts";
import { tinyTokenizer } from "./support/fake_engine.ts";
import { GPU_TEST } from "./support/gpu.ts";

/**
 * A regex xgrammar takes long to compile: 8,000 alternatives repeated up to 20 times (about
 * 60,000 characters; 2,000 alternatives took 0.36 s on this project's machine, 2026-11-25).
 */
const SLOW_REGEX = `(${Array.from({ length: 8000 }, (_, i) => `a${i}b`).join("|")}){1,20}`;

const step = (id: string) => ({ scheduled: [{ requestId: id, samplesToken: true }] }) as never;

/** The allowed ids of a mask. */
function allowed(mask: Uint32Array): number[] {
  const ids: number[] = [];
  for (let t = 0; t < mask.length * 32; t++) if ((mask[t >> 5]! >>> (t & 31)) & 1) ids.push(t);
  return ids;
}

Deno.test("StructuredOutputs rebuilds the other matchers when a compile runs past its limit", async () => {
  const tok = await tinyTokenizer();
  const eos = [tok.eosTokenId ?? 0];
  const so = new StructuredOutputs(tok, tok.size, eos, { compileTimeoutS: 0.2 });
  const fresh = new StructuredOutputs(tok, tok.size, eos);
  const spec: StructuredOutputSpec = { kind: "regex", pattern: "[a-z]{1,8}( [a-z]{1,8}){0,6}" };
  try {
    await so.admit("a", spec, "p");
    assert.ok(so.ready("a"));
    // Feed a few allowed tokens, always the highest id allowed (a deterministic walk).
    const fed: number[] = [];
    for (let i = 0; i < 3; i++) {
      const t = allowed(so.masks(step("a"))!.get("a")!).filter((id) => !eos.includes(id)).at(-1)!;
      so.accept("a", [t]);
      assert.equal(so.ready("a"), false, "the next mask is computed in the worker");
      fed.push(t);
      await so.settled();
    }
    const before = so.masks(step("a"))!.get("a")!;
    await assert.rejects(
      so.admit("slow", { kind: "regex", pattern: SLOW_REGEX }, "structured_outputs.regex"),
      (e: Error & { param?: string }) =>
        e.name === "InvalidParameterError" && e.param === "structured_outputs.regex" &&
        /took longer than 0.2 s/.test(e.message),
    );
    // "a" lives on in a new worker: the same mask once rebuilt, and it goes on.
    assert.equal(so.ready("a"), false, "rebuilding");
    while (!so.ready("a")) await new Promise((r) => setTimeout(r, 5));
    assert.deepEqual(so.masks(step("a"))!.get("a"), before);
    const next = allowed(before).filter((id) => !eos.includes(id))[0]!;
    so.accept("a", [next]);
    await so.settled();
    await fresh.admit("b", spec, "p");
    fresh.accept("b", [...fed, next]);
    await fresh.settled();
    assert.deepEqual(so.masks(step("a"))!.get("a"), fresh.masks(step("b"))!.get("b"));
  } finally {
    so.close();
    fresh.close();
  }
});

Deno.test("StructuredOutputs.release() rejects an admission still compiling", async () => {
  const tok = await tinyTokenizer();
  const so = new StructuredOutputs(tok, tok.size, [tok.eosTokenId ?? 0]);
  try {
    const admission = so.admit("slow", { kind: "regex", pattern: SLOW_REGEX }, "p");
    so.release("slow");
    await assert.rejects(admission, RangeError, "ended while its grammar compiled");
    assert.equal(so.active, false);
  } finally {
    so.close();
  }
});

Deno.test(
  "a grammar that compiles past --grammar-compile-timeout-s is a 400; other requests go on",
  GPU_TEST,
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed: 5 });
      const engine = await LLMEngine.create({
        model: dir,
        showProgress: false,
        forceF32: true,
        grammarCompileTimeoutS: 0.2,
      });
      const server = startServer(engine, { port: 0, onError: () => {} });
      const post = async (body: object) => {
        const res = await fetch(`${server.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ prompt: "x", ...body }),
        });
        return { status: res.status, json: await res.json() };
      };
      try {
        const choices = ["red", "green", "blue"];
        const [constrained, free, slow] = await Promise.all([
          post({ max_tokens: 8, structured_outputs: { choice: choices } }),
          post({ max_tokens: 24, ignore_eos: true }),
          post({ max_tokens: 8, structured_outputs: { regex: SLOW_REGEX } }),
        ]);
        assert.equal(slow.status, 400, JSON.stringify(slow.json));
        assert.equal(slow.json.error.param, "structured_outputs.regex");
        assert.match(slow.json.error.message, /took longer than 0\.2 s/);
        assert.ok(choices.includes(constrained.json.choices[0].text), constrained.json);
        assert.equal(free.json.usage.completion_tokens, 24);
        // Constrained requests after it run in the new worker.
        const after = await post({ max_tokens: 8, structured_outputs: { choice: choices } });
        assert.ok(choices.includes(after.json.choices[0].text), after.json);
        assert.equal(engine.stats().numRunning, 0);
      } finally {
        await server.shutdown(0);
        await engine.shutdown();
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);
