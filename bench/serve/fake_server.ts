/**
 * A fake OpenAI-compatible completions server on loopback, for testing the serving benchmark
 * without a model: `GET /health`, `GET /v1/models`, streaming `POST /v1/completions` that emits
 * `max_tokens` one-token chunks (" t0", " t1", ...), a usage chunk when asked, and
 * `data: [DONE]`. Timing is simulated: at most `slots` requests are served at once (the rest
 * queue, like a server's max_num_seqs), the first token comes `ttftMs` after a request gets a
 * slot, then one token every `itlMs + itlPerActiveMs * (active requests - 1)`. With
 * `preemptEvery`, `GET /metrics` also reports a `vllm:num_preemptions_total` that counts one
 * preemption per that many finished completions (else /metrics is a 404, as on a server without
 * one).
 *
 * Run alone: `deno run -A bench/serve/fake_server.ts [--port 8000]` prints `Listening on URL`.
 *
 * @module
 */

/** Options for {@linkcode startFakeServer}. */
export interface FakeServerOptions {
  /** Model id listed by /v1/models. Default "fake-model". */
  readonly modelId?: string;
  /** Requests served at once; more wait for a slot. Default Infinity. */
  readonly slots?: number;
  /** Delay from getting a slot to the first token, ms. Default 5. */
  readonly ttftMs?: number;
  /** Gap between tokens of a lone request, ms. Default 2. */
  readonly itlMs?: number;
  /** Extra gap per other active request, ms. Default 0. */
  readonly itlPerActiveMs?: number;
  /** Port; default 0 (any free port). */
  readonly port?: number;
  /** Serve `/metrics`, counting one preemption per this many finished completions. */
  readonly preemptEvery?: number;
}

/** A running fake server. */
export interface FakeServer {
  /** Base URL, e.g. "http://127.0.0.1:41234". */
  readonly url: string;
  /** Completion requests received so far. */
  readonly received: () => number;
  /** Stops listening and waits for the server to finish. */
  close(): Promise<void>;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const encoder = new TextEncoder();

/** An OpenAI-style error response. */
function errorResponse(status: number, message: string): Response {
  return Response.json({ error: { message, type: "invalid_request_error", code: status } }, {
    status,
  });
}

/** The server's slots: at most `size` requests generate at once, the rest wait in order. */
class Slots {
  /** Requests generating now. */
  active = 0;
  #waiting: (() => void)[] = [];

  constructor(readonly size: number) {}

  /** Waits for a free slot and takes it. */
  async acquire(): Promise<void> {
    while (this.active >= this.size) {
      await new Promise<void>((resolve) => this.#waiting.push(resolve));
    }
    this.active++;
  }

  /** Gives a slot back to the first waiter. */
  release(): void {
    this.active--;
    this.#waiting.shift()?.();
  }
}

/** What a completion request asks for. */
interface CompletionAsk {
  readonly maxTokens: number;
  /** Prompt length: array items, or whitespace-separated words of a string. */
  readonly promptTokens: number;
  /** `stream_options.include_usage`. */
  readonly includeUsage: boolean;
}

/** The request body's fields, or the error response for a bad body or an unknown model. */
async function readCompletionAsk(req: Request, modelId: string): Promise<CompletionAsk | Response> {
  let body: unknown;
  try {
    body = await req.json();
  } catch {
    return errorResponse(400, "body is not JSON");
  }
  if (typeof body !== "object" || body === null) return errorResponse(400, "body is not an object");
  const b: Record<string, unknown> = { ...body };
  if (b.model !== modelId) {
    return errorResponse(404, `The model '${String(b.model)}' does not exist.`);
  }
  const prompt = b.prompt;
  const so = b.stream_options;
  return {
    maxTokens: typeof b.max_tokens === "number" ? b.max_tokens : 16,
    promptTokens: Array.isArray(prompt)
      ? prompt.length
      : typeof prompt === "string"
      ? prompt.split(/\s+/).filter((w) => w !== "").length
      : 0,
    includeUsage: typeof so === "object" && so !== null && "include_usage" in so &&
      so.include_usage === true,
  };
}

/** One streamed completion: its id, what was asked, and the simulated timing. */
interface Generation {
  readonly id: string;
  readonly modelId: string;
  readonly ask: CompletionAsk;
  readonly slots: Slots;
  readonly ttftMs: number;
  readonly itlMs: number;
  readonly itlPerActiveMs: number;
  /** Whether the client went away. */
  readonly cancelled: () => boolean;
  /** Called once the completion has streamed its last chunk. */
  readonly finished: () => void;
}

/** Streams `g`'s chunks into `controller`: a slot, the tokens, the usage chunk, `[DONE]`. */
async function generate(
  g: Generation,
  controller: ReadableStreamDefaultController<Uint8Array>,
): Promise<void> {
  const { id, modelId, ask, slots } = g;
  const chunk = (payload: unknown) => encoder.encode(`data: ${JSON.stringify(payload)}\n\n`);
  await slots.acquire();
  try {
    await sleep(g.ttftMs);
    for (let i = 0; i < ask.maxTokens && !g.cancelled(); i++) {
      if (i > 0) await sleep(g.itlMs + g.itlPerActiveMs * (slots.active - 1));
      controller.enqueue(chunk({
        id,
        object: "text_completion",
        model: modelId,
        choices: [{
          index: 0,
          text: ` t${i}`,
          finish_reason: i === ask.maxTokens - 1 ? "length" : null,
        }],
      }));
    }
    if (ask.includeUsage && !g.cancelled()) {
      controller.enqueue(chunk({
        id,
        object: "text_completion",
        model: modelId,
        choices: [],
        usage: {
          prompt_tokens: ask.promptTokens,
          completion_tokens: ask.maxTokens,
          total_tokens: ask.promptTokens + ask.maxTokens,
        },
      }));
    }
    if (!g.cancelled()) {
      controller.enqueue(encoder.encode("data: [DONE]\n\n"));
      controller.close();
      g.finished();
    }
  } catch {
    // The client went away (enqueue on a cancelled stream).
  } finally {
    slots.release();
  }
}

/** Starts the fake server on 127.0.0.1. */
export function startFakeServer(options: FakeServerOptions = {}): FakeServer {
  const modelId = options.modelId ?? "fake-model";
  const slots = new Slots(options.slots ?? Infinity);
  let received = 0;
  let finished = 0;

  const completions = async (req: Request): Promise<Response> => {
    const ask = await readCompletionAsk(req, modelId);
    if (ask instanceof Response) return ask;
    received++;
    let cancelled = false;
    const generation: Generation = {
      id: `cmpl-${received}`,
      modelId,
      ask,
      slots,
      ttftMs: options.ttftMs ?? 5,
      itlMs: options.itlMs ?? 2,
      itlPerActiveMs: options.itlPerActiveMs ?? 0,
      cancelled: () => cancelled,
      finished: () => finished++,
    };
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        // Not awaited: chunks must flow while the simulated generation runs.
        void generate(generation, controller);
      },
      cancel() {
        cancelled = true;
      },
    });
    return new Response(stream, { headers: { "content-type": "text/event-stream" } });
  };

  const server = Deno.serve(
    { hostname: "127.0.0.1", port: options.port ?? 0, onListen: () => {} },
    (req) => {
      const path = new URL(req.url).pathname;
      if (req.method === "GET" && path === "/health") return new Response(null, { status: 200 });
      if (req.method === "GET" && path === "/v1/models") {
        return Response.json({ object: "list", data: [{ id: modelId, object: "model" }] }, {
          headers: { server: "fake-openai-server" },
        });
      }
      if (req.method === "POST" && path === "/v1/completions") return completions(req);
      const every = options.preemptEvery;
      if (req.method === "GET" && path === "/metrics" && every !== undefined) {
        const n = Math.floor(finished / every);
        return new Response(
          "# TYPE vllm:num_preemptions_total counter\n" +
            `vllm:num_preemptions_total{model_name="${modelId}"} ${n}.0\n`,
          { headers: { "content-type": "text/plain; version=0.0.4" } },
        );
      }
      return errorResponse(404, `no route ${req.method} ${path}`);
    },
  );
  const url = `http://127.0.0.1:${server.addr.port}`;
  return { url, received: () => received, close: () => server.shutdown() };
}

if (import.meta.main) {
  const i = Deno.args.indexOf("--port");
  const port = i >= 0 ? Number(Deno.args[i + 1]) : 8000;
  const s = startFakeServer({ port, slots: 8, ttftMs: 20, itlMs: 5, itlPerActiveMs: 0.5 });
  console.log(`Listening on ${s.url}`);
}
