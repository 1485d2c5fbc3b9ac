/**
 * What the benchmark asks the server before it loads it: `GET /v1/models` (the model ids, the
 * vocabulary size when the server reports one, its `server` header), and the prompt-id range
 * that follows from that vocabulary.
 *
 * @module
 */

/** What GET /v1/models told. */
export interface ServerModels {
  /** The listed model ids. */
  readonly ids: string[];
  /** The first model's `vocab_size`, if given. */
  readonly vocabSize: number | null;
  /** The `server` response header, if any. */
  readonly server: string | null;
}

/** What is known of a server whose model list could not be read. */
export const NO_MODELS: ServerModels = { ids: [], vocabSize: null, server: null };

/**
 * The default prompt-id range for a served vocabulary of `vocabSize` ids (null: unknown):
 * 100..5000, cut to the vocabulary (all of it when it has at most 100 ids).
 */
export function defaultVocabRange(vocabSize: number | null): [number, number] {
  if (vocabSize === null) return [100, 5000];
  if (vocabSize <= 100) return [0, vocabSize - 1];
  return [100, Math.min(5000, vocabSize - 1)];
}

/** GET /v1/models: the listed ids, the first model's `vocab_size` if given, the `server` header. */
export async function fetchModels(url: string): Promise<ServerModels> {
  const res = await fetch(`${url}/v1/models`, { signal: AbortSignal.timeout(30_000) });
  const body: unknown = await res.json().catch(() => null);
  if (res.status !== 200) throw new Error(`GET ${url}/v1/models answered ${res.status}`);
  const ids: string[] = [];
  let vocabSize: number | null = null;
  if (typeof body === "object" && body !== null && "data" in body && Array.isArray(body.data)) {
    for (const m of body.data) {
      if (typeof m === "object" && m !== null && "id" in m && typeof m.id === "string") {
        ids.push(m.id);
        const v = (m as { vocab_size?: unknown }).vocab_size;
        if (vocabSize === null && typeof v === "number" && Number.isInteger(v) && v > 0) {
          vocabSize = v;
        }
      }
    }
  }
  return { ids, vocabSize, server: res.headers.get("server") };
}
