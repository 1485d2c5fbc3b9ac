/**
 * What the server under test says about itself between levels: its cumulative preemption count,
 * read from its Prometheus `GET /metrics` (`vllm:num_preemptions_total`, the name vLLM and this
 * project's server both use). A level whose requests were preempted ran part of their prompts
 * and outputs twice (recompute) or through swap: its throughput and latencies then measure a KV
 * cache too small for the load as much as the engine, so the report says so.
 *
 * @module
 */

/** The Prometheus series counted (vLLM's name; server/metrics.ts). */
export const PREEMPTIONS_METRIC = "vllm:num_preemptions_total";

/**
 * The sum of every `vllm:num_preemptions_total` sample (one per model label set) in Prometheus
 * text `text`, or null when it has none.
 */
export function parsePreemptions(text: string): number | null {
  let total: number | null = null;
  for (const line of text.split("\n")) {
    if (!line.startsWith(PREEMPTIONS_METRIC)) continue;
    const rest = line.slice(PREEMPTIONS_METRIC.length);
    // The name must end here: a label set, or the value after a space.
    if (rest[0] !== "{" && rest[0] !== " ") continue;
    const value = Number(rest.slice(rest.lastIndexOf("}") + 1).trim().split(/\s+/)[0]);
    if (Number.isFinite(value)) total = (total ?? 0) + value;
  }
  return total;
}

/**
 * The server's cumulative preemptions (see {@linkcode parsePreemptions}), or null when its
 * `/metrics` is missing, fails, or has no such series (another server, or one behind a proxy that
 * hides it).
 */
export async function preemptionsTotal(baseUrl: string): Promise<number | null> {
  try {
    const res = await fetch(`${baseUrl}/metrics`, { signal: AbortSignal.timeout(5_000) });
    const text = await res.text();
    return res.ok ? parsePreemptions(text) : null;
  } catch {
    return null;
  }
}
