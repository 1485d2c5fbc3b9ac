/**
 * Command-line entry point: `deno run -A main.ts <command> [flags]`.
 *
 * Commands: `info` (the GPU adapter, limits and features), `serve` (the HTTP server),
 * `generate` (offline generation) and `cluster` (replicas of `serve` behind nginx). Errors print one line (`error: ...`) and exit with status 2
 * for bad command-line input (an unknown flag or command), 1 otherwise.
 *
 * @module
 */

import { runCluster } from "./cli/cluster.ts";
import { runGenerate } from "./cli/generate.ts";
import { runInfo } from "./cli/info.ts";
import { parseKernelProfileChoice } from "./gpu/kernel_profile.ts";
import { parseQuantizationChoice } from "./gpu/quant.ts";
import { runServe } from "./cli/serve.ts";
import { parseCommandArgs, UsageError } from "./cli/usage.ts";

const USAGE = `usage: main.ts <command> [flags]

commands:
  info [--force-f32] [--kernel-profile auto|cpu|gpu] [--model DIR] [--quantization Q]
                       print the WebGPU adapter, the limits the engine requests, its features
                       and the kernel profile; with --model, the weight bytes on the device
  serve                start the OpenAI-compatible HTTP server (main.ts serve --help)
  generate             offline generation (main.ts generate --help)
  cluster              N replicas of serve behind nginx (main.ts cluster --help)`;

const INFO_USAGE =
  `usage: main.ts info [--force-f32] [--kernel-profile auto|cpu|gpu] [--model DIR] [--quantization Q]
  --force-f32                    report f32 weights even when shader-f16 exists
  --kernel-profile auto|cpu|gpu  the kernel profile to report (default auto: from the adapter)
  --model DIR|ORG/NAME           also load this model and print its weight bytes on the device
  --quantization auto|none|int8|int4  quantize its projections while loading (default auto:
                                 a GPTQ / AWQ / W4A16 checkpoint's own format, else none)`;

/** Runs the CLI with `argv` and returns the process exit code. */
export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case "info": {
      const { values } = parseCommandArgs("info", {
        args: rest,
        options: {
          "force-f32": { type: "boolean", default: false },
          "kernel-profile": { type: "string", default: "auto" },
          model: { type: "string" },
          quantization: { type: "string" },
          help: { type: "boolean", default: false },
        },
      });
      if (values.help) {
        console.log(INFO_USAGE);
        return 0;
      }
      const quantization = parseQuantizationChoice(values.quantization ?? "auto");
      if (values.quantization !== undefined && values.model === undefined) {
        throw new TypeError("--quantization applies to the model of --model: info loads none");
      }
      return await runInfo({
        forceF32: values["force-f32"],
        kernelProfile: parseKernelProfileChoice(values["kernel-profile"]),
        ...(values.model !== undefined ? { model: values.model } : {}),
        quantization,
      });
    }
    case "generate":
      return await runGenerate(rest);
    case "serve":
      return await runServe(rest);
    case "cluster":
      return await runCluster(rest);
    case undefined:
    case "help":
    case "--help":
    case "-h":
      console.log(USAGE);
      return command === undefined ? 2 : 0;
    default:
      throw new UsageError(`unknown command '${command}' (try: info, serve, generate, cluster)`);
  }
}

if (import.meta.main) {
  let code: number;
  try {
    code = await main(Deno.args);
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    console.error(`error: ${message.split("\n")[0]}`);
    code = error instanceof UsageError ? 2 : 1;
  }
  Deno.exit(code);
}
