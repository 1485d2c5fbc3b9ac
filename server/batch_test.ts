/**
 * `POST /batch/test`: the user's batching experiment (seed 000). A mock engine is built for the
 * requested scheduler, batch size and per-step latency, `num_requests` requests are fired at it
 * at once, and each request's server-side latency (submission to its last output) is reported
 * with the same fields as the user's original endpoint, plus `scheduler`
 * ({@linkcode batchTestEndpoint}; without a {@linkcode BatchTestFactory} the endpoint answers 501).
 *
 * @module
 */

import type { EngineClient } from "../engine/engine_api.ts";
import { LLMEngine } from "../engine/llm_engine.ts";
import { samplingParams } from "../scheduler/sampling_params.ts";
import type { ServerContext } from "./context.ts";
import { ApiError, type BatchTestRequest, batchTestRequestSchema, parseBody } from "./protocol.ts";
import { readJson } from "./read_json.ts";

/** What the `/batch/test` hook receives to build its mock engine. */
export interface BatchTestConfig {
  /** Which batching policy the mock engine uses. */
  scheduler: "static" | "dynamic" | "continuous";
  /** Most requests per batch (the engine's `max_num_seqs`). */
  batchSize: number;
  /** Simulated duration of one engine step (one batch forward pass), in ms. */
  latencyMs: number;
}

/** Builds a fresh mock engine for one `/batch/test` call; it is shut down afterwards. */
export type BatchTestFactory = (config: BatchTestConfig) => EngineClient;

/**
 * The factory `serve` uses: a mock-executor engine with the requested scheduler and batch size,
 * each step taking `latencyMs` whatever its size, `max_model_len` 4096.
 */
export const mockBatchTestFactory: BatchTestFactory = (c) =>
  LLMEngine.createMock({
    scheduler: c.scheduler,
    maxNumSeqs: c.batchSize,
    // The baselines' batch; continuous batching bounds its batch by maxNumSeqs alone.
    ...(c.scheduler === "continuous" ? {} : { maxBatchSize: c.batchSize }),
    mockBaseMs: c.latencyMs,
    mockPerTokenMs: 0,
    maxModelLen: 4096,
  });

/** The response of `/batch/test`: exactly seed 000's fields, plus `scheduler`. */
export interface BatchTestResult {
  batch_size: number;
  num_requests: number;
  total_requests: number;
  successful: number;
  failed: number;
  /** Latency statistics over the successful requests (ms, 2 decimals); null when none succeeded. */
  avg_server_latency_ms: number | null;
  min_server_latency_ms: number | null;
  max_server_latency_ms: number | null;
  p50_server_latency_ms: number | null;
  p90_server_latency_ms: number | null;
  p99_server_latency_ms: number | null;
  /** First submission to last completion (ms, 2 decimals). */
  total_time_ms: number;
  /** Successful requests per second of `total_time_ms` (2 decimals). */
  throughput_requests_per_sec: number;
  scheduler: "static" | "dynamic" | "continuous";
}

const round2 = (x: number): number => Math.round(x * 100) / 100;

/** The `p`-th percentile (0..100) of ascending `sorted`, linearly interpolated (numpy's default). */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) throw new RangeError("Cannot take a percentile of no values");
  const pos = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(pos);
  const hi = Math.min(lo + 1, sorted.length - 1);
  return sorted[lo]! + (sorted[hi]! - sorted[lo]!) * (pos - lo);
}

/**
 * `POST /batch/test`: runs the experiment with the engine `factory` builds (501 without one, 503
 * while the server drains); the response counts as in flight until it is answered.
 */
export async function batchTestEndpoint(
  ctx: ServerContext,
  factory: BatchTestFactory | undefined,
  req: Request,
): Promise<Response> {
  if (factory === undefined) {
    throw new ApiError(501, "/batch/test is not enabled on this server", {
      code: "not_implemented",
    });
  }
  const { lifecycle } = ctx;
  if (lifecycle.draining) {
    throw new ApiError(503, "The server is shutting down", { code: "server_shutting_down" });
  }
  const body = parseBody(
    batchTestRequestSchema,
    await readJson(req, ctx.maxBody, ctx.readTimeoutMs),
  );
  const { ac, done } = lifecycle.track(req);
  try {
    return Response.json(await runBatchTest(factory, body, ac.signal));
  } finally {
    done();
  }
}

/**
 * Runs the experiment. Each request has `prompt_len` prompt tokens (ids spread over the mock
 * vocabulary) and generates exactly `output_len` tokens (greedy, EOS ignored).
 *
 * @throws {ApiError} 400 when prompt_len + output_len exceeds the mock model's max_model_len.
 */
export async function runBatchTest(
  factory: BatchTestFactory,
  body: BatchTestRequest,
  signal?: AbortSignal,
): Promise<BatchTestResult> {
  const engine = factory({
    scheduler: body.scheduler,
    batchSize: body.batch_size,
    latencyMs: body.latency_ms,
  });
  try {
    const { maxModelLen, vocabSize } = engine.model;
    if (body.prompt_len + body.output_len > maxModelLen) {
      throw new ApiError(
        400,
        `prompt_len + output_len = ${
          body.prompt_len + body.output_len
        } exceeds the mock model's max_model_len ${maxModelLen}`,
        { param: "prompt_len", code: "invalid_value" },
      );
    }
    const params = samplingParams({
      temperature: 0,
      maxTokens: body.output_len,
      minTokens: body.output_len,
      ignoreEos: true,
    });
    const span = Math.max(1, vocabSize - 1);
    const t0 = performance.now();
    const one = async (i: number): Promise<number | null> => {
      const start = performance.now();
      const promptTokenIds = Array.from(
        { length: body.prompt_len },
        (_, j) => 1 + ((i * 31 + j * 7) % span),
      );
      try {
        let finish: string | null = null;
        const stream = engine.generate(
          { requestId: `batch-test-${i}`, promptTokenIds, params },
          signal,
        );
        for await (const out of stream) {
          if (out.finishReason !== null) finish = out.finishReason;
        }
        return finish === "stop" || finish === "length" ? performance.now() - start : null;
      } catch {
        return null;
      }
    };
    const latencies = await Promise.all(
      Array.from({ length: body.num_requests }, (_, i) => one(i)),
    );
    const totalMs = performance.now() - t0;
    const ok = latencies.filter((x): x is number => x !== null).sort((a, b) => a - b);
    const stat = (f: () => number): number | null => (ok.length === 0 ? null : round2(f()));
    return {
      batch_size: body.batch_size,
      num_requests: body.num_requests,
      total_requests: latencies.length,
      successful: ok.length,
      failed: latencies.length - ok.length,
      avg_server_latency_ms: stat(() => ok.reduce((a, b) => a + b, 0) / ok.length),
      min_server_latency_ms: stat(() => ok[0]!),
      max_server_latency_ms: stat(() => ok[ok.length - 1]!),
      p50_server_latency_ms: stat(() => percentile(ok, 50)),
      p90_server_latency_ms: stat(() => percentile(ok, 90)),
      p99_server_latency_ms: stat(() => percentile(ok, 99)),
      total_time_ms: round2(totalMs),
      throughput_requests_per_sec: totalMs > 0 ? round2(ok.length / (totalMs / 1000)) : 0,
      scheduler: body.scheduler,
    };
  } finally {
    await engine.shutdown(0);
  }
}
