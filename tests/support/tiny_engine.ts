/**
 * The real engine on a random-weight tiny Qwen3 (f32 weights), for tests of what requests do on
 * the WebGPU executor.
 */

import { LLMEngine } from "../../engine/llm_engine.ts";
import { makeModel } from "../../tools/make_model.ts";

/**
 * Runs `fn` with an engine on a freshly generated tiny-qwen3 checkpoint (weights drawn with
 * `seed`), then shuts it down.
 */
export async function withTinyEngine(
  fn: (engine: LLMEngine) => Promise<void>,
  seed = 5,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "tiny_engine_" });
  try {
    await makeModel({ out: dir, preset: "tiny-qwen3", dtype: "f32", seed });
    const engine = await LLMEngine.create({ model: dir, showProgress: false, forceF32: true });
    try {
      await fn(engine);
    } finally {
      await engine.shutdown();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}
