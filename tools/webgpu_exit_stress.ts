/**
 * Counts how often `deno test` processes doing plain WebGPU work abort at exit, with wgpu's
 * default backends and with a `DENO_WEBGPU_BACKEND` list: the measurement behind the test tasks'
 * `DENO_WEBGPU_BACKEND=vulkan,metal,dx12` (README, "GPU").
 *
 * ```sh
 * deno run -A tools/webgpu_exit_stress.ts [--rounds 20] [--files 32] [--backends vulkan,metal,dx12]
 * ```
 *
 * Writes `--files` test files to a temporary directory, each requesting a device, compiling two
 * small compute pipelines (fresh constants, so the shader cache misses), dispatching them and
 * reading back. Each round runs `deno test -A .` in it, with and without `--parallel`, once with the
 * backends wgpu picks by default (`DENO_WEBGPU_BACKEND` removed from the environment) and once
 * with `--backends`; it prints each run's exit status as it goes, then the counts of runs that
 * failed (an abort at exit is status 134, SIGABRT).
 *
 * @module
 */

import { parseArgs } from "node:util";

const WORK = `// One test file's work: a device, two fresh pipelines, a dispatch each, a readback.
export async function work(tag: number): Promise<void> {
  const adapter = await navigator.gpu.requestAdapter();
  const device = await adapter!.requestDevice();
  const n = 1024;
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC;
  const buf = device.createBuffer({ size: n * 4, usage });
  const read = device.createBuffer({
    size: n * 4,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  for (let i = 0; i < 2; i++) {
    const code = \`@group(0) @binding(0) var<storage, read_write> o: array<f32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3u) {
  var a = f32(g.x) * \${Math.random().toFixed(12)} + \${tag}.0;
  for (var k = 0u; k < 64u; k++) { a = a * 1.0001 + sin(a); }
  o[g.x] = a;
}\`;
    const module = device.createShaderModule({ code });
    const p = device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" } });
    const bg = device.createBindGroup({
      layout: p.getBindGroupLayout(0),
      entries: [{ binding: 0, resource: { buffer: buf } }],
    });
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(p);
    pass.setBindGroup(0, bg);
    pass.dispatchWorkgroups(n / 64);
    pass.end();
    enc.copyBufferToBuffer(buf, 0, read, 0, n * 4);
    device.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    read.unmap();
  }
}
`;

const { values } = parseArgs({
  args: Deno.args,
  options: {
    rounds: { type: "string", default: "20" },
    files: { type: "string", default: "32" },
    backends: { type: "string", default: "vulkan,metal,dx12" },
  },
});
const rounds = Number(values.rounds);
const files = Number(values.files);
if (!Number.isInteger(rounds) || rounds < 1 || !Number.isInteger(files) || files < 1) {
  console.error("error: --rounds and --files must be positive integers");
  Deno.exit(2);
}

const dir = await Deno.makeTempDir({ prefix: "webgpu_exit_stress_" });
await Deno.writeTextFile(`${dir}/work.ts`, WORK);
for (let k = 0; k < files; k++) {
  await Deno.writeTextFile(
    `${dir}/w${k}_test.ts`,
    `import { work } from "./work.ts";\nDeno.test({ name: "w${k}", sanitizeResources: false, sanitizeOps: false, fn: () => work(${k}) });\n`,
  );
}

const adapter = await navigator.gpu?.requestAdapter();
console.log(
  `adapter: ${adapter?.info.description ?? "none"}; Deno ${Deno.version.deno}; ${
    new Date().toISOString()
  }`,
);
console.log(
  `command: deno run -A tools/webgpu_exit_stress.ts --rounds ${rounds} --files ${files} --backends ${values.backends}`,
);

const base = Deno.env.toObject();
delete base.DENO_WEBGPU_BACKEND;
const variants = [
  { name: "default backends", env: base },
  {
    name: `DENO_WEBGPU_BACKEND=${values.backends}`,
    env: { ...base, DENO_WEBGPU_BACKEND: values.backends },
  },
];
const modes = [["--parallel"], []];
const failed = new Map<string, number>();
for (let round = 1; round <= rounds; round++) {
  const line: string[] = [];
  for (const v of variants) {
    for (const mode of modes) {
      const key = `${v.name}, ${mode.length > 0 ? "--parallel" : "serial"}`;
      const out = await new Deno.Command(Deno.execPath(), {
        // From inside the directory, as a project without a deno.json would run its tests.
        args: ["test", "-A", ...mode, "."],
        cwd: dir,
        env: v.env,
        clearEnv: true,
        stdout: "null",
        stderr: "null",
      }).output();
      if (!out.success) failed.set(key, (failed.get(key) ?? 0) + 1);
      line.push(`${key}: ${out.code}`);
    }
  }
  console.log(`round ${round}: ${line.join("; ")}`);
}
for (const v of variants) {
  for (const mode of modes) {
    const key = `${v.name}, ${mode.length > 0 ? "--parallel" : "serial"}`;
    console.log(`${key}: ${failed.get(key) ?? 0} of ${rounds} runs failed`);
  }
}
await Deno.remove(dir, { recursive: true });
