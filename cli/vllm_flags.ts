/**
 * `vllm serve` arguments that `main.ts serve` accepts where this server does what they ask, so
 * that a vLLM command line (a shell script, a systemd unit, a Docker or Kubernetes manifest)
 * runs unchanged: the model as a positional argument, several `--served-model-name`s, `--seed`,
 * vLLM's spellings of the prefix caching and chunked prefill switches, parallel sizes of 1 (also
 * as `-tp 1`, `-pp 1`), `--enforce-eager`, `--trust-remote-code`, `--disable-log-requests`,
 * `--disable-log-stats`, `--enable-auto-tool-choice` and `--tool-call-parser hermes`. Values
 * this server cannot honour (several GPUs, another tool-call format) are refused in one line,
 * never ignored. `--dtype`, `--kv-cache-dtype` and `--chat-template` are engine flags
 * (cli/engine_flags.ts), shared with `generate`.
 *
 * @module
 */

import { UsageError } from "./usage.ts";

/** `parseArgs` options of the vLLM flags (see the module documentation). */
export const VLLM_SERVE_FLAGS = {
  seed: { type: "string" },
  "enable-prefix-caching": { type: "boolean" },
  "no-enable-prefix-caching": { type: "boolean" },
  "enable-chunked-prefill": { type: "boolean" },
  "no-enable-chunked-prefill": { type: "boolean" },
  "disable-log-requests": { type: "boolean" },
  "disable-log-stats": { type: "boolean" },
  "tensor-parallel-size": { type: "string" },
  "pipeline-parallel-size": { type: "string" },
  "enforce-eager": { type: "boolean" },
  "trust-remote-code": { type: "boolean" },
  "enable-auto-tool-choice": { type: "boolean" },
  "tool-call-parser": { type: "string" },
} as const;

/** vLLM's short flags and the long ones they stand for. */
const SHORT_FLAGS: Readonly<Record<string, string>> = {
  "-tp": "--tensor-parallel-size",
  "-pp": "--pipeline-parallel-size",
};

/**
 * `args` in the form `parseArgs` reads: vLLM's `-tp` / `-pp` spelt out, and the names that follow
 * `--served-model-name`'s value taken out (vLLM's `--served-model-name NAME [NAME ...]`: every
 * argument up to the next flag), returned apart: the first name is the one the server reports,
 * every name is accepted in requests. Nothing after `--` is touched.
 */
export function normalizeVllmArgs(
  args: readonly string[],
): { args: string[]; moreNames: string[] } {
  const out: string[] = [];
  const moreNames: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const arg = SHORT_FLAGS[args[i]!] ?? args[i]!;
    out.push(arg);
    if (arg === "--") {
      out.push(...args.slice(i + 1));
      break;
    }
    if (arg !== "--served-model-name" && !arg.startsWith("--served-model-name=")) continue;
    if (arg === "--served-model-name" && i + 1 < args.length) out.push(args[++i]!);
    while (i + 1 < args.length && !args[i + 1]!.startsWith("-")) moreNames.push(args[++i]!);
  }
  return { args: out, moreNames };
}

/** The tool-call formats the server parses (server/tools.ts: Hermes / Qwen `<tool_call>`). */
export const TOOL_CALL_PARSERS = ["hermes"] as const;

/** Usage lines of the vLLM flags. */
export const VLLM_SERVE_FLAGS_USAGE =
  `vLLM's flags, accepted so that a 'vllm serve' command line runs unchanged:
  MODEL                          the model as the first argument, as --model
  --served-model-name NAME [NAME ...]   several names: the first is reported, all are accepted
  --seed N                       as --engine-seed
  --[no-]enable-prefix-caching, --[no-]enable-chunked-prefill
                                 both on by default (--no-prefix-caching, --no-chunked-prefill)
  --tensor-parallel-size 1, --pipeline-parallel-size 1 (-tp 1, -pp 1)
                                 one GPU per server (larger sizes are refused; for several GPUs
                                 run replicas: main.ts cluster)
  --enforce-eager                steps are always encoded as they run (no CUDA graphs here)
  --trust-remote-code            allowed, but no checkpoint code is ever run (the architectures
                                 are built in)
  --disable-log-requests, --disable-log-stats
                                 the server logs neither requests nor periodic statistics
  --enable-auto-tool-choice      tool_choice "auto" is always on
  --tool-call-parser hermes      the tool-call format answers are parsed for (the only one)`;

type Values = { [K in keyof typeof VLLM_SERVE_FLAGS]?: string | boolean } & {
  model?: string | boolean;
  "engine-seed"?: string | boolean;
  "no-prefix-caching"?: string | boolean;
  "no-chunked-prefill"?: string | boolean;
};

/** The engine flag values that vLLM's arguments stand for. */
export interface VllmEngineFlagValues {
  model?: string;
  "engine-seed"?: string;
  "no-prefix-caching"?: boolean;
  "no-chunked-prefill"?: boolean;
}

/** vLLM's on / off switches and the engine's `--no-*` flag each pair stands for. */
const SWITCHES = [
  ["prefix-caching", "no-prefix-caching"],
  ["chunked-prefill", "no-chunked-prefill"],
] as const;

/**
 * The engine flag values the vLLM arguments stand for (`model`, `engine-seed`,
 * `no-prefix-caching`, `no-chunked-prefill`), after checking the others.
 *
 * @throws {UsageError} for more than one positional argument, a positional model beside a
 *   different `--model`, `--seed` beside a different `--engine-seed`, a switch both on and off,
 *   a parallel size other than 1, a KV cache dtype other than `auto`, or a tool-call parser
 *   other than {@linkcode TOOL_CALL_PARSERS}.
 */
export function vllmServeFlagValues(
  values: Values,
  positionals: readonly string[],
): VllmEngineFlagValues {
  const out: VllmEngineFlagValues = {};
  if (positionals.length > 1) {
    throw new UsageError(
      `Unexpected arguments ${positionals.slice(1).map((p) => `'${p}'`).join(", ")}: ` +
        `serve takes one model (see 'main.ts serve --help')`,
    );
  }
  const model = positionals[0];
  if (model !== undefined) {
    if (typeof values.model === "string" && values.model !== model) {
      throw new UsageError(`Two models given: '${model}' and --model ${values.model}`);
    }
    out.model = model;
  }
  const seed = values.seed;
  if (typeof seed === "string") {
    const engineSeed = values["engine-seed"];
    if (typeof engineSeed === "string" && engineSeed !== seed) {
      throw new UsageError(`--seed ${seed} contradicts --engine-seed ${engineSeed}`);
    }
    out["engine-seed"] = seed;
  }
  for (const [name, engineFlag] of SWITCHES) {
    const on = values[`enable-${name}`] === true;
    const off = values[`no-enable-${name}`] === true || values[engineFlag] === true;
    if (on && off) {
      throw new UsageError(
        `--enable-${name} contradicts --${
          values[engineFlag] === true ? engineFlag : `no-enable-${name}`
        }`,
      );
    }
    if (off) out[engineFlag] = true;
  }
  for (const flag of ["tensor-parallel-size", "pipeline-parallel-size"] as const) {
    const size = values[flag];
    if (typeof size === "string" && Number(size) !== 1) {
      throw new UsageError(
        `--${flag} ${size}: this server runs a model on one GPU; for several GPUs run one ` +
          `replica per GPU behind nginx (main.ts cluster)`,
      );
    }
  }
  const parser = values["tool-call-parser"];
  if (
    typeof parser === "string" && !(TOOL_CALL_PARSERS as readonly string[]).includes(parser)
  ) {
    throw new UsageError(
      `--tool-call-parser ${parser}: the server parses ${
        TOOL_CALL_PARSERS.join(", ")
      } tool calls (<tool_call> blocks) only`,
    );
  }
  return out;
}
