/**
 * What the model bench sets up before it measures: the `--matmul-variant` override, and the
 * model directory (the one given, checked, or the qwen3-0.6b preset generated into a temporary
 * directory).
 *
 * @module
 */

import { checkModelDir } from "../../cli/engine_flags.ts";
import { Matmul, type MatmulVariant } from "../../kernels/matmul.ts";
import { MATMUL_VARIANTS } from "./options.ts";

/**
 * For A/B runs: makes every matmul of the runners loaded afterwards use `variant` instead of the
 * policy's choice. Returns the variant, or undefined (nothing changed) when none is given.
 *
 * @throws {TypeError} when `variant` is not one of {@linkcode MATMUL_VARIANTS}.
 */
export function forceMatmulVariant(variant: string | undefined): MatmulVariant | undefined {
  if (variant === undefined) return undefined;
  const forced = MATMUL_VARIANTS.find((v) => v === variant);
  if (forced === undefined) {
    throw new TypeError(`--matmul-variant must be one of ${MATMUL_VARIANTS.join(", ")}`);
  }
  const choose = Matmul.prototype.choose;
  // Every other argument passes through (the uniform X capacity, the word layout).
  Matmul.prototype.choose = function (...args: Parameters<typeof choose>) {
    args[4] = forced;
    return choose.apply(this, args);
  };
  return forced;
}

/** Generates the qwen3-0.6b preset (random bf16 weights, 1.2 GB) into a new temporary dir. */
async function generateModel(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "model_bench_" });
  const tool = new URL("../../tools/make_model.ts", import.meta.url).pathname;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", tool, "--out", dir, "--preset", "qwen3-0.6b", "--dtype", "bf16"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`make-model failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  return dir;
}

/**
 * The model directory: `model` when given (exits 1 with one `error:` line when it is not a
 * model directory), else the generated preset (`generated`: the caller deletes it).
 */
export async function modelDirectory(
  model: string | undefined,
): Promise<{ dir: string; generated: boolean }> {
  if (model === undefined) return { dir: await generateModel(), generated: true };
  try {
    await checkModelDir(model);
  } catch (error) {
    console.error(`error: ${error instanceof Error ? error.message : error}`);
    Deno.exit(1);
  }
  return { dir: model, generated: false };
}
