/**
 * The layers import downward only. Every import of every source file (tests and benchmarks
 * excepted: they sit on top and may use anything) is parsed, resolved and checked against
 * {@linkcode LAYERS}; an upward edge fails the test, naming the file, the import and both layers.
 */

import assert from "node:assert/strict";
import { dirname, join, normalize, relative } from "node:path";

const ROOT = normalize(join(dirname(new URL(import.meta.url).pathname), ".."));

/**
 * Bottom to top. A file belongs to the first layer with a matching prefix (longest prefixes are
 * listed first where they overlap). The README's "Layout" section says the same in prose.
 */
export const LAYERS: readonly { readonly name: string; readonly paths: readonly string[] }[] = [
  { name: "gpu (WebGPU runtime)", paths: ["gpu/"] },
  { name: "kernels", paths: ["kernels/"] },
  {
    name: "model (checkpoints, tokenizer, architectures, their buffers)",
    paths: [
      "engine/model/",
      "engine/models/",
      "engine/step_buffers.ts",
      "engine/block_table_rows.ts",
      "engine/kv_cache.ts",
      "engine/forward_batch.ts",
      "engine/tokenizer.ts",
      "engine/chat_template.ts",
      "engine/detokenizer.ts",
    ],
  },
  { name: "scheduler (CPU policy, plain request types)", paths: ["scheduler/"] },
  {
    name: "runner (model runner, sampler, executors)",
    paths: [
      "engine/model_runner.ts",
      "engine/model_runner_options.ts",
      "engine/step_options.ts",
      "engine/deferred_readbacks.ts",
      "engine/step_inputs.ts",
      "engine/sampler.ts",
      "engine/sampled_rows.ts",
      "engine/logits_process_lists.ts",
      "engine/executors/",
    ],
  },
  { name: "engine (request lifecycle, input processing)", paths: ["engine/"] },
  { name: "server and tools", paths: ["server/", "tools/"] },
  { name: "cli", paths: ["cli/", "main.ts"] },
];

/** The layer index of a repository path, or -1 for files outside the layering. */
function layerOf(path: string): number {
  return LAYERS.findIndex((l) => l.paths.some((p) => path === p || path.startsWith(p)));
}

async function* sourceFiles(dir: string): AsyncGenerator<string> {
  for await (const e of Deno.readDir(join(ROOT, dir))) {
    const path = dir === "" ? e.name : `${dir}/${e.name}`;
    if (e.isDirectory) yield* sourceFiles(path);
    else if (e.isFile && path.endsWith(".ts")) yield path;
  }
}

const IMPORT =
  /(?:^|\n)\s*(?:import|export)\b[^"';]*?\bfrom\s*["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g;

/** The relative imports of `text`, as written. */
export function importsOf(text: string): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(IMPORT)) {
    const spec = m[1] ?? m[2]!;
    if (spec.startsWith(".")) out.push(spec);
  }
  return out;
}

Deno.test("importsOf() finds static, re-export and dynamic imports, and only relative ones", () => {
  const text = [
    'import { a } from "./a.ts";',
    'import type { B } from "../b/b.ts";',
    'export { c } from "./c.ts";',
    'import src from "./k.wgsl" with { type: "text" };',
    'import { z } from "zod";',
    "const m = await import('../m.ts');",
    "import {\n  x,\n  y,\n} from './xy.ts';",
  ].join("\n");
  assert.deepEqual(importsOf(text), [
    "./a.ts",
    "../b/b.ts",
    "./c.ts",
    "./k.wgsl",
    "../m.ts",
    "./xy.ts",
  ]);
});

Deno.test("every layer imports only from itself or the layers below it", async () => {
  const upward: string[] = [];
  let files = 0;
  let edges = 0;
  const roots = ["gpu", "kernels", "engine", "scheduler", "server", "tools", "cli"];
  const all: string[] = ["main.ts"];
  for (const r of roots) for await (const f of sourceFiles(r)) all.push(f);
  for (const file of all) {
    const from = layerOf(file);
    assert.notEqual(from, -1, `${file} belongs to no layer: add it to LAYERS`);
    files++;
    const text = await Deno.readTextFile(join(ROOT, file));
    for (const spec of importsOf(text)) {
      const target = relative(ROOT, normalize(join(ROOT, dirname(file), spec)));
      const to = layerOf(target);
      edges++;
      if (to === -1) {
        upward.push(`${file} imports ${spec}: ${target} belongs to no layer`);
      } else if (to > from) {
        upward.push(
          `${file} imports ${spec}: ${LAYERS[from]!.name} (layer ${from}) must not import ` +
            `${LAYERS[to]!.name} (layer ${to})`,
        );
      }
    }
  }
  assert.ok(files > 100 && edges > 300, `${files} files, ${edges} imports: the walk found too few`);
  assert.deepEqual(upward, [], `upward imports:\n${upward.join("\n")}`);
});
