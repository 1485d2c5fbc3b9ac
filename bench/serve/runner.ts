/**
 * Runs one benchmark level: a fixed number of requests either kept `concurrency` in flight at a
 * time (closed loop, like a pool of clients), or sent at planned arrival times (open loop,
 * Poisson or gamma gaps) with an optional cap on requests in flight.
 *
 * @module
 */

import type { RequestResult } from "./metrics.ts";
import type { ProgressBar } from "./progress.ts";
import { streamCompletion } from "./sse_client.ts";
import type { PlannedRequest } from "./workload.ts";

/** Where and how requests are sent. */
export interface ClientConfig {
  /** Server base URL, without "/v1". */
  readonly baseUrl: string;
  /** The `model` field of every request. */
  readonly model: string;
  readonly ignoreEos: boolean;
  readonly temperature: number;
  /** Per-request deadline, milliseconds. */
  readonly timeoutMs: number;
}

/** One level of the sweep. */
export interface LevelPlan {
  /** Requests in flight (closed loop), or the cap in open-loop mode; null = no cap. */
  readonly concurrency: number | null;
  /** Send times in ms from the level start (open loop); undefined = closed loop. */
  readonly arrivalsMs?: readonly number[];
  readonly requests: readonly PlannedRequest[];
}

/** The raw outcome of a level. */
export interface LevelRun {
  /** Wall-clock start. */
  readonly startedAt: Date;
  /** First send to last completion, milliseconds. */
  readonly durationMs: number;
  /** One per request, in workload order (`results[i]` answers `plan.requests[i]`). */
  readonly results: RequestResult[];
}

/** Sends one planned request and returns its timings (without the streamed text). */
async function send(
  client: ClientConfig,
  req: PlannedRequest,
  epochMs: number,
): Promise<RequestResult> {
  const { text: _text, ...result } = await streamCompletion(
    {
      baseUrl: client.baseUrl,
      model: client.model,
      prompt: req.prompt,
      promptTokens: req.promptTokens,
      maxTokens: req.maxTokens,
      ignoreEos: client.ignoreEos,
      temperature: client.temperature,
      timeoutMs: client.timeoutMs,
    },
    req.index,
    epochMs,
  );
  return result;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Runs `plan` against the server; never throws for failed requests (they are results). */
export async function runLevel(
  plan: LevelPlan,
  client: ClientConfig,
  progress?: ProgressBar,
): Promise<LevelRun> {
  const n = plan.requests.length;
  if (plan.concurrency !== null && !(plan.concurrency >= 1)) {
    throw new RangeError(`Concurrency must be >= 1, got ${plan.concurrency}`);
  }
  if (plan.arrivalsMs === undefined && plan.concurrency === null) {
    throw new RangeError("A closed-loop level needs a concurrency");
  }
  if (plan.arrivalsMs !== undefined && plan.arrivalsMs.length !== n) {
    throw new RangeError(`Got ${plan.arrivalsMs.length} arrival times for ${n} requests`);
  }
  const results: RequestResult[] = new Array(n);
  const startedAt = new Date();
  const epoch = performance.now();
  const store = (i: number, r: RequestResult) => {
    results[i] = r;
    progress?.tick(r.ok);
  };

  if (plan.arrivalsMs === undefined) {
    let next = 0;
    const worker = async () => {
      while (next < n) {
        const i = next++;
        store(i, await send(client, plan.requests[i]!, epoch));
      }
    };
    await Promise.all(Array.from({ length: Math.min(plan.concurrency!, n) }, worker));
  } else {
    const cap = plan.concurrency ?? Infinity;
    let inFlight = 0;
    const waiters: (() => void)[] = [];
    const pending: Promise<void>[] = [];
    for (let i = 0; i < n; i++) {
      const wait = plan.arrivalsMs[i]! - (performance.now() - epoch);
      if (wait > 0) await sleep(wait);
      while (inFlight >= cap) await new Promise<void>((resolve) => waiters.push(resolve));
      inFlight++;
      pending.push(
        send(client, plan.requests[i]!, epoch).then((r) => {
          store(i, r);
          inFlight--;
          waiters.shift()?.();
        }),
      );
    }
    await Promise.all(pending);
  }
  return { startedAt, durationMs: performance.now() - epoch, results };
}
