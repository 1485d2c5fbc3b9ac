import assert from "node:assert/strict";
import { join } from "node:path";
import {
  type CommandRunner,
  NVIDIA_SMI_ARGS,
  parseNvidiaSmiMemory,
  readDeviceMemory,
} from "../gpu/device_memory.ts";
import { H200_ADAPTER } from "./support/adapter.ts";

const H200 = H200_ADAPTER;

/** A runner that prints `stdout` (exit `code`) and records its calls. */
function fakeRun(stdout: string, code = 0): CommandRunner & { calls: string[][] } {
  const calls: string[][] = [];
  const run = (command: string, args: readonly string[]) => {
    calls.push([command, ...args]);
    return Promise.resolve({ code, stdout });
  };
  return Object.assign(run, { calls });
}

Deno.test("parseNvidiaSmiMemory() reads each GPU's name, total and used MiB, leaving out [N/A]", () => {
  const text = "NVIDIA H200, 143771, 612\nNVIDIA A100-SXM4-80GB, 81920, [N/A]\n\n" +
    "NVIDIA GeForce RTX 4090 , 24564 , 1021.5\n";
  assert.deepEqual(parseNvidiaSmiMemory(text), [
    { name: "NVIDIA H200", totalMiB: 143_771, usedMiB: 612 },
    { name: "NVIDIA GeForce RTX 4090", totalMiB: 24_564, usedMiB: 1021.5 },
  ]);
  assert.deepEqual(parseNvidiaSmiMemory(""), []);
  assert.throws(
    () => parseNvidiaSmiMemory("No devices were found"),
    (e) =>
      e instanceof SyntaxError &&
      e.message === 'nvidia-smi printed "No devices were found", not "name, total MiB, used MiB"',
  );
});

Deno.test("readDeviceMemory() reads an NVIDIA adapter's memory with nvidia-smi", async () => {
  const run = fakeRun("NVIDIA H200, 143771, 612\n");
  assert.deepEqual(await readDeviceMemory(H200, run), {
    memory: { totalMiB: 143_771, usedMiB: 612, source: "nvidia-smi" },
  });
  assert.deepEqual(run.calls, [["nvidia-smi", ...NVIDIA_SMI_ARGS]]);
});

Deno.test("readDeviceMemory() takes the least free of the GPUs that could be the adapter", async () => {
  const list = "NVIDIA H200, 143771, 90000\nNVIDIA L4, 23034, 22000\nNVIDIA H200, 143771, 100\n";
  // Two H200s: WebGPU's cannot be told apart, so the one with less free memory; the L4 is not it.
  assert.deepEqual(await readDeviceMemory(H200, fakeRun(list)), {
    memory: { totalMiB: 143_771, usedMiB: 90_000, source: "nvidia-smi, the least free of 2 GPUs" },
  });
  // No name matches (Vulkan and nvidia-smi may spell it differently): every GPU is a candidate.
  const other = { ...H200, description: "NVIDIA Graphics Device" };
  assert.deepEqual(await readDeviceMemory(other, fakeRun(list)), {
    memory: { totalMiB: 23_034, usedMiB: 22_000, source: "nvidia-smi, the least free of 3 GPUs" },
  });
});

Deno.test("readDeviceMemory() gives the reason when the memory is unknown, running nothing where it cannot apply", async () => {
  const lavapipe = {
    ...H200,
    description: "llvmpipe (LLVM 19.1.1, 256 bits)",
    vendor: "65541",
    device: "0",
  };
  const amd = { ...H200, description: "AMD Radeon RX 7900 XTX (RADV NAVI31)", vendor: "4098" };
  for (
    const [adapter, why] of [
      [lavapipe, "a software adapter, whose memory is the host's"],
      [{ ...H200, isFallback: true }, "a software adapter, whose memory is the host's"],
      [amd, "read through nvidia-smi on NVIDIA GPUs only"],
    ] as const
  ) {
    const run = fakeRun("NVIDIA H200, 143771, 612\n");
    assert.deepEqual(await readDeviceMemory(adapter, run), { unknown: why });
    assert.deepEqual(run.calls, [], adapter.description);
  }
  assert.deepEqual(await readDeviceMemory(H200, fakeRun("", 9)), {
    unknown: "nvidia-smi exited with code 9",
  });
  assert.deepEqual(await readDeviceMemory(H200, fakeRun("NVIDIA H200, [N/A], [N/A]\n")), {
    unknown: "nvidia-smi listed no GPU with a memory figure",
  });
  assert.deepEqual(await readDeviceMemory(H200, fakeRun("No devices were found\n")), {
    unknown:
      'nvidia-smi failed: nvidia-smi printed "No devices were found", not "name, total MiB, used MiB"',
  });
  for (
    const [error, why] of [
      [new Deno.errors.NotFound("Failed to spawn 'nvidia-smi'"), "nvidia-smi not found"],
      [
        new Deno.errors.NotCapable("Requires run access"),
        "running nvidia-smi is not allowed (--allow-run)",
      ],
      [
        new DOMException("Signal timed out.", "TimeoutError"),
        "nvidia-smi failed: Signal timed out.",
      ],
    ] as const
  ) {
    const throwing: CommandRunner = () => Promise.reject(error);
    assert.deepEqual(await readDeviceMemory(H200, throwing), { unknown: why });
  }
});

Deno.test("readDeviceMemory() runs the nvidia-smi found on PATH", async () => {
  const dir = await Deno.makeTempDir({ prefix: "fake_nvidia_smi_" });
  const path = Deno.env.get("PATH") ?? "";
  try {
    const script = join(dir, "nvidia-smi");
    // Prints its arguments' memory query, as nvidia-smi answers it, only when asked for it.
    await Deno.writeTextFile(
      script,
      `#!/bin/sh\n[ "$*" = "${NVIDIA_SMI_ARGS.join(" ")}" ] || exit 4\n` +
        'echo "NVIDIA H200, 143771, 2100"\n',
    );
    await Deno.chmod(script, 0o755);
    Deno.env.set("PATH", `${dir}:${path}`);
    assert.deepEqual(await readDeviceMemory(H200), {
      memory: { totalMiB: 143_771, usedMiB: 2100, source: "nvidia-smi" },
    });
    await Deno.writeTextFile(script, "#!/bin/sh\nexit 3\n");
    assert.deepEqual(await readDeviceMemory(H200), { unknown: "nvidia-smi exited with code 3" });
    // None on PATH at all.
    Deno.env.set("PATH", join(dir, "empty"));
    assert.deepEqual(await readDeviceMemory(H200), { unknown: "nvidia-smi not found" });
  } finally {
    Deno.env.set("PATH", path);
    await Deno.remove(dir, { recursive: true });
  }
});
