import assert from "node:assert/strict";
import { GpuContext, STORAGE_RW } from "../gpu/context.ts";
import { GpuDeviceError } from "../gpu/errors.ts";
import { GpuMatrix } from "../gpu/tensor.ts";
import { ParamArena } from "../gpu/params.ts";
import { ReadbackRing, readBuffer } from "../gpu/readback.ts";
import { MAX_TIMED_PASSES, PassClock, timePassesEach } from "../gpu/timer.ts";
import { GPU_TEST, readF32, testContext, upload } from "./support/gpu.ts";
import { testSeed } from "./support/random.ts";

Deno.test(
  "GpuMatrix.create() splits rows across parts when a binding limit is forced",
  GPU_TEST,
  async () => {
    const ctx = await testContext({ maxBindingBytes: 1024 });
    for (const dtype of ["f32", "f16"] as const) {
      const { seed, rng } = testSeed(`split ${dtype}`);
      const rows = 37;
      const cols = 33; // odd: f16 rows are padded to 34
      const data = rng.array(rows * cols);
      const m = GpuMatrix.fromArray(ctx, "w", data, rows, cols, dtype);
      const stride = dtype === "f16" ? 34 : 33;
      assert.equal(m.rowStride, stride);
      const rowBytes = stride * (dtype === "f16" ? 2 : 4);
      const perPart = Math.floor(1024 / rowBytes);
      assert.equal(m.parts.length, Math.ceil(rows / perPart), `seed ${seed}`);
      let row = 0;
      for (const part of m.parts) {
        assert.equal(part.rowStart, row);
        assert.ok(part.rows * rowBytes <= 1024);
        const bytes = await readBuffer(ctx, part.buffer, 0, part.rows * rowBytes);
        const got = dtype === "f16" ? new Float16Array(bytes) : new Float32Array(bytes);
        for (let r = 0; r < part.rows; r++) {
          for (let c = 0; c < stride; c++) {
            const expected = c < cols
              ? (dtype === "f16"
                ? Math.fround(new Float16Array([data[(row + r) * cols + c]!])[0]!)
                : data[(row + r) * cols + c]!)
              : 0;
            assert.equal(
              got[r * stride + c],
              expected,
              `seed ${seed} ${dtype} row ${row + r} col ${c}`,
            );
          }
        }
        row += part.rows;
      }
      assert.equal(row, rows);
      m.destroy();
    }
  },
);

Deno.test("GpuMatrix.writeRows() streams chunks that straddle parts", GPU_TEST, async () => {
  const ctx = await testContext({ maxBindingBytes: 256 });
  const { seed, rng } = testSeed("writeRows");
  const rows = 23;
  const cols = 8; // 32 bytes per f32 row: 8 rows per part
  const data = rng.array(rows * cols);
  const m = GpuMatrix.create(ctx, "w", rows, cols, "f32");
  for (let r = 0; r < rows; r += 5) {
    m.writeRows(ctx.device.queue, r, data.subarray(r * cols, Math.min(rows, r + 5) * cols));
  }
  const all: number[] = [];
  for (const part of m.parts) all.push(...(await readF32(ctx, part.buffer, part.rows * cols)));
  assert.deepEqual(all, Array.from(data), `seed ${seed}`);
  assert.throws(() => m.writeRows(ctx.device.queue, 20, data.subarray(0, 4 * cols)), RangeError);
  assert.throws(() => m.writeRows(ctx.device.queue, 0, data.subarray(0, 7)), RangeError);
  m.destroy();
});

Deno.test("GpuMatrix.create() rejects a row larger than one binding", GPU_TEST, async () => {
  const ctx = await testContext({ maxBindingBytes: 256 });
  assert.throws(() => GpuMatrix.create(ctx, "w", 2, 100, "f32"), /exceeds the binding limit/);
});

const PARAMS_TO_BUFFER = `
struct P { a: u32, b: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(1) fn main() { out[0] = f32(p.a); out[1] = p.b; }`;

Deno.test("ParamArena.flush() uploads every written slot in one write", GPU_TEST, async () => {
  const ctx = await testContext();
  const arena = new ParamArena(ctx, 8);
  const pipeline = ctx.pipeline("test/params", () => PARAMS_TO_BUFFER);
  const outs = [0, 1, 2].map(() => upload(ctx, new Float32Array(2).fill(NaN)));
  const groups = outs.map((out) => {
    const slot = arena.allocate();
    const group = ctx.device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: [{ binding: 0, resource: slot.binding }, { binding: 1, resource: { buffer: out } }],
    });
    return { slot, group };
  });
  groups.forEach(({ slot }, i) => slot.setU32(0, 10 + i).setF32(1, 0.5 * i));
  const encoder = ctx.device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  pass.setPipeline(pipeline);
  for (const { group } of groups) {
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(1);
  }
  pass.end();
  arena.flush();
  ctx.device.queue.submit([encoder.finish()]);
  for (let i = 0; i < 3; i++) {
    assert.deepEqual(Array.from(await readF32(ctx, outs[i]!)), [10 + i, 0.5 * i]);
  }
  assert.equal(arena.used, 3);
  for (let i = 3; i < 8; i++) arena.allocate();
  assert.throws(() => arena.allocate(), /all 8 are in use/);
  arena.destroy();
});

Deno.test(
  "ParamArena.flush() uploads only the slots whose values changed since the last flush",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const arena = new ParamArena(ctx, 4);
    const slots = [0, 1, 2, 3].map(() => arena.allocate());
    const writes: number[] = [];
    const write = GPUQueue.prototype.writeBuffer;
    GPUQueue.prototype.writeBuffer = function (this: GPUQueue, ...args) {
      writes.push(Number(args[4] ?? 0));
      return write.apply(this, args);
    };
    try {
      slots.forEach((slot, i) => slot.setU32(0, 7, i).setF32(2, -0.5));
      arena.flush();
      // The same values again: nothing to upload.
      slots.forEach((slot, i) => slot.setU32(0, 7, i).setF32(2, -0.5));
      arena.flush();
      // One word of slot 2 changes: that slot alone (256 bytes).
      slots.forEach((slot, i) => slot.setU32(0, 7, i).setF32(2, i === 2 ? 0.25 : -0.5));
      arena.flush();
      // -0 is a change from 0 (its bits differ).
      slots[1]!.setF32(3, -0);
      arena.flush();
    } finally {
      GPUQueue.prototype.writeBuffer = write;
    }
    assert.deepEqual(writes, [4 * 256, 256, 256]);
    arena.destroy();
  },
);

Deno.test(
  "ReadbackRing keeps several readbacks in flight and reuses staging buffers",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const ring = new ReadbackRing(ctx, 16, 3);
    const src = upload(ctx, new Uint32Array([1, 2, 3, 4, 5, 6, 7, 8]));
    const pending = [];
    for (let step = 0; step < 3; step++) {
      const encoder = ctx.device.createCommandEncoder();
      const r = ring.encode(encoder, src, step * 8, 8);
      ctx.device.queue.submit([encoder.finish()]);
      pending.push(r.start());
    }
    assert.equal(ring.inFlight, 3);
    const encoder = ctx.device.createCommandEncoder();
    assert.throws(() => ring.encode(encoder, src, 0, 8), /3 of 3 already in flight/);
    encoder.copyBufferToBuffer(src, 0, ctx.createBuffer("dummy", 4, STORAGE_RW), 0, 4);
    ctx.device.queue.submit([encoder.finish()]);
    const results = await Promise.all(pending.map((p) => p.data));
    assert.deepEqual(results.map((b) => Array.from(new Uint32Array(b))), [[1, 2], [3, 4], [5, 6]]);
    assert.equal(ring.inFlight, 0);
    // A fourth readback reuses a staging buffer instead of creating one.
    const enc2 = ctx.device.createCommandEncoder();
    const r = ring.encode(enc2, src, 24, 8);
    ctx.device.queue.submit([enc2.finish()]);
    assert.deepEqual(Array.from(new Uint32Array(await r.start().data)), [7, 8]);
    ring.destroy();
  },
);

Deno.test(
  "GpuContext reports an uncaptured GPU error once, as a GpuDeviceError",
  GPU_TEST,
  async () => {
    const ctx = await GpuContext.create();
    try {
      // A dispatch without a pipeline is a validation error nobody captures.
      const encoder = ctx.device.createCommandEncoder();
      const pass = encoder.beginComputePass();
      pass.dispatchWorkgroups(1);
      pass.end();
      ctx.device.queue.submit([encoder.finish()]);
      const error = await ctx.failed;
      assert.ok(error instanceof GpuDeviceError);
      assert.match(error.message, /^GPU error: /);
      assert.throws(() => ctx.check(), GpuDeviceError);
      assert.equal(ctx.error, error);
    } finally {
      ctx.destroy();
    }
  },
);

Deno.test(
  "PassClock.medianMs() measures Infinity for a kernel the adapter refuses, and the context lives on",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const arena = new ParamArena(ctx, 1);
    const clock = new PassClock(ctx, arena, 2);
    const run = (pipeline: GPUComputePipeline) => (pass: GPUComputePassEncoder) => {
      pass.setPipeline(pipeline);
      pass.dispatchWorkgroups(1);
    };
    try {
      // A shader that does not compile (a float into a u32): a validation error, in the scopes.
      const bad = await clock.medianMs(() => {
        const code = "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }";
        return run(ctx.device.createComputePipeline({
          layout: "auto",
          compute: { module: ctx.device.createShaderModule({ code }), entryPoint: "main" },
        }));
      });
      assert.equal(bad, Infinity);
      assert.equal(clock.failures.length, 1, clock.failures.join("; "));
      ctx.check();
      const good = await clock.medianMs(() =>
        run(ctx.pipeline("timer-test/noop", () => "@compute @workgroup_size(1) fn main() {}"))
      );
      assert.ok(Number.isFinite(good) && good >= 0, `${good} ms`);
      assert.equal(clock.failures.length, 1);
      // An exception of the setup itself is not a GPU error: it propagates.
      await assert.rejects(
        () =>
          clock.medianMs(() => {
            throw new RangeError("bad setup");
          }),
        /bad setup/,
      );
      ctx.check();
    } finally {
      arena.destroy();
    }
  },
);

/** A kernel that spins `iterations` LCG steps per invocation of 4 workgroups of 64 (heavy). */
function spinKernel(ctx: GpuContext, iterations: number) {
  const code = `@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3u) {
  var x = g.x;
  for (var i = 0u; i < ${iterations}u; i++) { x = x * 1664525u + 1013904223u; }
  out[g.x] = x;
}`;
  const pipeline = ctx.pipeline(`timer-test/spin${iterations}`, () => code);
  const out = ctx.createBuffer("spin-out", 4 * 256, STORAGE_RW);
  const group = ctx.device.createBindGroup({
    layout: pipeline.getBindGroupLayout(0),
    entries: [{ binding: 0, resource: { buffer: out } }],
  });
  return {
    encode: (pass: GPUComputePassEncoder) => {
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(4);
    },
    destroy: () => out.destroy(),
  };
}

Deno.test(
  "PassClock.medianMsEach() times each candidate as itself, in the order given",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const arena = new ParamArena(ctx, 1);
    const clock = new PassClock(ctx, arena, 3);
    const light = spinKernel(ctx, 1);
    const heavy = spinKernel(ctx, 200_000);
    try {
      const ms = await clock.medianMsEach([
        () => light.encode,
        () => heavy.encode,
        () => light.encode,
        () => heavy.encode,
      ]);
      assert.equal(ms.length, 4);
      assert.ok(ms.every((t) => Number.isFinite(t) && t >= 0), ms.join(", "));
      // Times swapped between candidates (or one candidate's passes read as another's) fail this.
      for (const h of [1, 3]) {
        for (const l of [0, 2]) assert.ok(ms[h]! > 5 * ms[l]!, `heavy ${ms[h]} vs light ${ms[l]}`);
      }
      assert.equal(clock.method, ctx.hasTimestamps ? "timestamp-query" : "host clock / 3 passes");
      assert.deepEqual(clock.failures, []);
    } finally {
      light.destroy();
      heavy.destroy();
      arena.destroy();
    }
  },
);

Deno.test(
  "PassClock.medianMsEach() measures Infinity for the candidates the adapter refuses and times the others",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const arena = new ParamArena(ctx, 1);
    const clock = new PassClock(ctx, arena, 2);
    const good = spinKernel(ctx, 1);
    const badCode = "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }";
    try {
      const ms = await clock.medianMsEach([
        () => good.encode,
        // Does not compile: refused in its own setup's scopes.
        () => {
          const module = ctx.device.createShaderModule({ code: badCode });
          const pipeline = ctx.device.createComputePipeline({
            layout: "auto",
            compute: { module, entryPoint: "main" },
          });
          return (pass) => {
            pass.setPipeline(pipeline);
            pass.dispatchWorkgroups(1);
          };
        },
        () => good.encode,
        // Compiles, but its dispatch exceeds the grid limit: the submission of all of them fails
        // validation, so each is timed alone again.
        () => (pass) => {
          good.encode(pass);
          pass.dispatchWorkgroups(ctx.device.limits.maxComputeWorkgroupsPerDimension + 1);
        },
        () => good.encode,
      ]);
      assert.deepEqual(ms.map(Number.isFinite), [true, false, true, false, true], ms.join(", "));
      assert.equal(clock.failures.length, 2, clock.failures.join("; "));
      ctx.check();
      // An exception of a setup itself is not a GPU error: it propagates.
      await assert.rejects(
        () =>
          clock.medianMsEach([() => good.encode, () => {
            throw new RangeError("bad setup");
          }]),
        /bad setup/,
      );
      ctx.check();
    } finally {
      good.destroy();
      arena.destroy();
    }
  },
);

Deno.test(
  "timePassesEach() splits candidates over submissions when their passes exceed one query set",
  GPU_TEST,
  async () => {
    const ctx = await testContext();
    const light = spinKernel(ctx, 1);
    const heavy = spinKernel(ctx, 20_000);
    try {
      // 1,024 timed passes each: two candidates per submission, so three submissions.
      const repeats = 1024;
      assert.equal(Math.floor(MAX_TIMED_PASSES / repeats), 2);
      const t = await timePassesEach(
        ctx,
        [light.encode, light.encode, heavy.encode, light.encode, heavy.encode],
        { warmup: 1, repeats },
      );
      assert.equal(t.length, 5);
      for (const x of t) assert.ok(Number.isFinite(x.medianMs) && x.minMs <= x.medianMs);
      for (const h of [2, 4]) {
        for (const l of [0, 1, 3]) assert.ok(t[h]!.medianMs > 5 * t[l]!.medianMs);
      }
    } finally {
      light.destroy();
      heavy.destroy();
    }
  },
);
