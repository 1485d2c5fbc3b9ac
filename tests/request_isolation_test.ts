/**
 * One request failing inside a step (a bug in its per-request state, injected here by making
 * the real WebGPU executor unable to sample it) ends that request alone: the others finish with
 * the tokens they get when run alone, the engine stays healthy, no KV block leaks, and the next
 * request succeeds; over HTTP the failed request is a 500 JSON body (or an SSE error event and
 * `[DONE]`) while a concurrent one is a 200.
 */

import assert from "node:assert/strict";
import { RequestFailedError, type RequestOutput } from "../engine/engine_api.ts";
import { WebGpuExecutor } from "../engine/executors/webgpu_executor.ts";
import type { LLMEngine } from "../engine/llm_engine.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import type { ScheduledRequest } from "../scheduler/scheduler_output.ts";
import { startServer } from "../server/server.ts";
import { GPU_TEST } from "./support/gpu.ts";
import { withTinyEngine } from "./support/tiny_engine.ts";

/**
 * Makes the executor's per-request sampling throw for the requests `isVictim` picks (checked
 * on each request's first scheduled chunk), from their `fromStep`-th sampled step on: a stand-in
 * for any per-request bug. Returns the restorer.
 */
function injectFailure(isVictim: (r: ScheduledRequest) => boolean, fromStep: number): () => void {
  const original = WebGpuExecutor.prototype.samplingOf;
  const victims = new Map<string, number>();
  WebGpuExecutor.prototype.samplingOf = function (r, contextLen) {
    if (r.positionStart === 0 && isVictim(r)) victims.set(r.requestId, 0);
    const n = victims.get(r.requestId);
    if (n !== undefined && r.samplesToken) {
      victims.set(r.requestId, n + 1);
      if (n + 1 >= fromStep) throw new RangeError(`injected failure for ${r.requestId}`);
    }
    return original.call(this, r, contextLen);
  };
  return () => (WebGpuExecutor.prototype.samplingOf = original);
}

async function collect(stream: AsyncIterable<RequestOutput>): Promise<number[]> {
  const ids: number[] = [];
  for await (const o of stream) ids.push(...o.tokenIds);
  return ids;
}

const PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8], [2, 7, 1, 8]];
const params = samplingParams({ temperature: 0, maxTokens: 8, ignoreEos: true });

/** The engine on a tiny-qwen3 checkpoint with weight seed 11. */
function withEngine(fn: (engine: LLMEngine) => Promise<void>): Promise<void> {
  return withTinyEngine(fn, 11);
}

Deno.test(
  "LLMEngine ends only the request that fails inside a step, on the WebGPU executor",
  GPU_TEST,
  async () => {
    await withEngine(async (engine) => {
      const gen = (id: string, prompt: number[]) =>
        collect(engine.generate({ requestId: id, promptTokenIds: prompt, params }));
      const alone: number[][] = [];
      for (const [i, p] of PROMPTS.entries()) alone.push(await gen(`alone-${i}`, p));
      const restore = injectFailure((r) => r.requestId.startsWith("victim"), 3);
      try {
        const victim = gen("victim", [4, 4, 4, 4, 4, 4]);
        const others = PROMPTS.map((p, i) => gen(`other-${i}`, p));
        await assert.rejects(victim, (e: unknown) => {
          assert.ok(e instanceof RequestFailedError, String(e));
          assert.equal(e.requestId, "victim");
          assert.match(e.message, /injected failure for victim/);
          return true;
        });
        assert.deepEqual(await Promise.all(others), alone);
        assert.equal(engine.error, null);
        // A victim failing at its first sampled step (the prefill step) too.
        await assert.rejects(gen("victim-2", [1, 2, 3]), RequestFailedError);
      } finally {
        restore();
      }
      const stats = engine.stats();
      assert.equal(stats.numRunning, 0);
      assert.equal(stats.numWaiting, 0);
      assert.equal(stats.kvBlocksUsed, 0);
      assert.deepEqual(await gen("next", PROMPTS[0]!), alone[0]);
      assert.equal(engine.error, null);
    });
  },
);

Deno.test(
  "the server answers a request that fails inside a step with 500 or an SSE error event while others get 200",
  GPU_TEST,
  async () => {
    await withEngine(async (engine) => {
      const errors: unknown[] = [];
      const server = startServer(engine, { port: 0, onError: (e) => errors.push(e) });
      // The server names engine requests itself: the victims are the prompts starting with 77.
      // They fail at their 10th sampled step: late enough for the stream to have started (the
      // server waits for each choice's first output, and a few steps run ahead of it).
      const restore = injectFailure((r) => r.tokenIds[0] === 77, 10);
      try {
        const post = (body: Record<string, unknown>) =>
          fetch(`${server.url}/v1/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ max_tokens: 16, temperature: 0, ignore_eos: true, ...body }),
          });
        const [bad, good, badStream] = await Promise.all([
          post({ prompt: [77, 1, 2] }),
          post({ prompt: [5, 6, 7] }),
          post({ prompt: [77, 3, 4], stream: true }),
        ]);
        assert.equal(good.status, 200);
        const goodBody = await good.json();
        assert.equal(goodBody.usage.completion_tokens, 16);
        assert.equal(bad.status, 500, await bad.clone().text());
        const badBody = await bad.json();
        assert.equal(badBody.error.code, "internal_error");
        assert.match(badBody.error.message, /RequestFailedError/);
        assert.equal(badStream.status, 200);
        const events = (await badStream.text()).split("\n\n").filter((e) => e !== "");
        assert.equal(events.at(-1), "data: [DONE]");
        const last = JSON.parse(events.at(-2)!.slice(6));
        assert.match(last.error.message, /RequestFailedError/);
        assert.equal(errors.length, 2, "both failures reported to onError");
        const health = await fetch(`${server.url}/health`);
        await health.body?.cancel();
        assert.equal(health.status, 200);
        assert.equal(engine.stats().kvBlocksUsed, 0);
      } finally {
        restore();
        await server.shutdown(0);
      }
    });
  },
);
