import assert from "node:assert/strict";
import { join } from "node:path";
import { CheckpointError } from "../engine/model/errors.ts";
import {
  encodeTensorData,
  SafetensorsFile,
  type TensorToWrite,
  writeSafetensors,
} from "../engine/model/safetensors.ts";
import { bf16Value, roundToBf16 } from "./reference/safetensors.ts";
import { testSeed } from "./support/random.ts";

/** Runs `fn` with a fresh temporary directory, removed afterwards. */
async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "safetensors_test_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** Asserts `promise` rejects with a one-line CheckpointError whose message starts with `start`. */
async function assertCheckpointError(
  promise: Promise<unknown>,
  start: string,
  includes: string,
): Promise<void> {
  await assert.rejects(promise, (e: unknown) => {
    assert.ok(e instanceof CheckpointError, `expected CheckpointError, got ${e}`);
    assert.ok(!e.message.includes("\n"), `message is not one line: ${e.message}`);
    assert.ok(e.message.startsWith(start), `"${e.message}" does not start with "${start}"`);
    assert.ok(e.message.includes(includes), `"${e.message}" does not mention "${includes}"`);
    return true;
  });
}

/** A raw safetensors file with an arbitrary header object and `dataBytes` zero bytes of data. */
async function writeRaw(path: string, header: unknown, dataBytes: number): Promise<void> {
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (json.length % 8)) % 8);
  const h = new TextEncoder().encode(json);
  const bytes = new Uint8Array(8 + h.length + dataBytes);
  new DataView(bytes.buffer).setBigUint64(0, BigInt(h.length), true);
  bytes.set(h, 8);
  await Deno.writeFile(path, bytes);
}

async function readAll(
  file: SafetensorsFile,
  name: string,
  targetDtype: "f32" | "f16",
  chunkBytes: number,
): Promise<number[]> {
  const out: number[] = [];
  for await (const chunk of file.readTensorChunks(name, { targetDtype, chunkBytes })) {
    assert.equal(chunk.rowStart * chunk.cols, out.length, `${name}: chunks out of order`);
    for (const v of chunk.data) out.push(v);
  }
  return out;
}

function product(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

function sameBits(a: number, b: number): boolean {
  return Object.is(a, b);
}

Deno.test("writeSafetensors() produces the layout of the format: padded header, relative offsets, metadata", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "layout.safetensors");
    await writeSafetensors(path, [
      {
        name: "a",
        dtype: "F32",
        shape: [2, 3],
        data: () => encodeTensorData([1, 2, 3, 4, 5, 6], "F32"),
      },
      { name: "b", dtype: "F16", shape: [3], data: () => encodeTensorData([1, 2, 3], "F16") },
    ], { format: "pt" });
    const bytes = await Deno.readFile(path);
    const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
    assert.equal(n % 8, 0, "header length is a multiple of 8");
    const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
    assert.deepEqual(header, {
      __metadata__: { format: "pt" },
      a: { dtype: "F32", shape: [2, 3], data_offsets: [0, 24] },
      b: { dtype: "F16", shape: [3], data_offsets: [24, 30] },
    });
    assert.equal(bytes.length, 8 + n + 30);
    assert.deepEqual([...new Float32Array(bytes.slice(8 + n, 8 + n + 24).buffer)], [
      1,
      2,
      3,
      4,
      5,
      6,
    ]);
  });
});

Deno.test("writeSafetensors() rejects data() of the wrong length and duplicate names", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "bad.safetensors");
    await assert.rejects(
      writeSafetensors(path, [{
        name: "x",
        dtype: "F32",
        shape: [4],
        data: () => new Uint8Array(12),
      }]),
      /tensor "x" \[4\] F32 needs 16 bytes, data\(\) gave 12/,
    );
    const t: TensorToWrite = { name: "x", dtype: "F16", shape: [1], data: () => new Uint8Array(2) };
    await assert.rejects(writeSafetensors(path, [t, t]), /duplicate or reserved tensor name "x"/);
  });
});

Deno.test("SafetensorsFile round-trips F32, F16 and BF16 tensors of several shapes to f32 and f16", async () => {
  const { seed, rng } = testSeed("safetensors round trip");
  await withTempDir(async (dir) => {
    const path = join(dir, "rt.safetensors");
    const shapes: number[][] = [[], [1], [7], [5, 3], [33, 17], [2, 3, 4], [0, 4]];
    const written: { name: string; dtype: string; shape: number[]; values: number[] }[] = [];
    const toWrite: TensorToWrite[] = [];
    for (const dtype of ["F32", "F16", "BF16"] as const) {
      for (const shape of shapes) {
        const n = product(shape);
        let values: number[];
        let bytes: Uint8Array;
        if (dtype === "BF16") {
          // Random bit patterns cover normals, subnormals, zeros and infinities, both signs.
          const bits = new Uint16Array(n);
          for (let i = 0; i < n; i++) {
            let b = rng.int(0, 0xffff);
            if (((b >> 7) & 0xff) === 0xff && (b & 0x7f) !== 0) b &= 0xff80; // no NaN: infinity
            bits[i] = b;
          }
          if (n >= 4) bits.set([0x0000, 0x8000, 0x0001, 0x7f80], 0);
          values = Array.from(bits, bf16Value);
          bytes = new Uint8Array(bits.buffer);
        } else {
          const raw = rng.normals(n, 3);
          values = dtype === "F16" ? Array.from(Float16Array.from(raw)) : Array.from(raw);
          bytes = encodeTensorData(raw, dtype);
        }
        const name = `t.${dtype}.${shape.join("x") || "scalar"}`;
        written.push({ name, dtype, shape, values });
        toWrite.push({ name, dtype, shape, data: () => bytes });
      }
    }
    await writeSafetensors(path, toWrite, { seed: String(seed) });
    const file = await SafetensorsFile.open(path);
    try {
      assert.equal(file.metadata["seed"], String(seed));
      assert.equal(file.tensors.size, written.length);
      for (const w of written) {
        const info = file.tensor(w.name);
        assert.equal(info.dtype, w.dtype);
        assert.deepEqual(info.shape, w.shape);
        for (const chunkBytes of [8, 64, 1 << 20]) {
          const ctx = `seed ${seed} ${w.name} chunkBytes=${chunkBytes}`;
          const f32 = await readAll(file, w.name, "f32", chunkBytes);
          assert.equal(f32.length, w.values.length, ctx);
          // Every conversion to f32 is exact: compare bit for bit (Object.is tells -0 from 0).
          for (let i = 0; i < f32.length; i++) {
            assert.ok(
              sameBits(f32[i]!, w.values[i]!),
              `${ctx} f32 [${i}]: ${f32[i]} != ${w.values[i]}`,
            );
          }
          const f16 = await readAll(file, w.name, "f16", chunkBytes);
          const expected16 = Array.from(Float16Array.from(w.values));
          for (let i = 0; i < f16.length; i++) {
            assert.ok(
              sameBits(f16[i]!, expected16[i]!),
              `${ctx} f16 [${i}]: ${f16[i]} != ${expected16[i]}`,
            );
          }
        }
      }
      const whole = await file.readTensor("t.BF16.33x17", "f32");
      const ref = written.find((w) => w.name === "t.BF16.33x17")!.values;
      assert.ok(whole.every((v, i) => sameBits(v, ref[i]!)), `seed ${seed} readTensor BF16`);
    } finally {
      file.close();
    }
  });
});

Deno.test("encodeTensorData() rounds f32 to BF16 to nearest even, bit-exactly against the reference", () => {
  const { seed, rng } = testSeed("bf16 encode");
  const values: number[] = [0, -0, 1, -1, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 2 ** -130, 3.0e38];
  for (let i = 0; i < 2000; i++) values.push(rng.normal() * 10 ** rng.int(-30, 30));
  const f32 = Array.from(Float32Array.from(values));
  const bytes = encodeTensorData(f32, "BF16");
  const bits = new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.length / 2);
  for (let i = 0; i < f32.length; i++) {
    const want = roundToBf16(f32[i]!);
    const got = bf16Value(bits[i]!);
    assert.ok(sameBits(got, want), `seed ${seed} [${i}] ${f32[i]}: got ${got}, expected ${want}`);
  }
});

Deno.test("readTensorChunks() streams a 64 MiB tensor in 1 MiB chunks of whole rows with reused buffers", async () => {
  const { seed, rng } = testSeed("safetensors streaming");
  await withTempDir(async (dir) => {
    const path = join(dir, "big.safetensors");
    const rows = 16451;
    const cols = 1021; // rows of 4084 bytes: 1 MiB is not a whole number of rows
    const offset = rng.int(0, 1000);
    const valueAt = (i: number) => ((i * 7 + offset) % 65536) - 32768.5;
    await writeSafetensors(path, [
      { name: "small", dtype: "F32", shape: [3], data: () => encodeTensorData([1, 2, 3], "F32") },
      {
        name: "big",
        dtype: "F32",
        shape: [rows, cols],
        data: () => {
          const a = new Float32Array(rows * cols);
          for (let i = 0; i < a.length; i++) a[i] = valueAt(i);
          return new Uint8Array(a.buffer);
        },
      },
    ]);
    assert.ok((await Deno.stat(path)).size > 64 << 20);
    const file = await SafetensorsFile.open(path);
    try {
      for (const target of ["f32", "f16"] as const) {
        const chunkBytes = 1 << 20;
        let next = 0;
        let buffer: ArrayBufferLike | undefined;
        let chunks = 0;
        for await (
          const chunk of file.readTensorChunks("big", { targetDtype: target, chunkBytes })
        ) {
          const ctx = `seed ${seed} ${target} chunk ${chunks}`;
          assert.ok(chunk.data.byteLength <= chunkBytes, `${ctx}: ${chunk.data.byteLength} bytes`);
          assert.ok(chunk.data.buffer.byteLength <= chunkBytes, `${ctx}: backing buffer too large`);
          buffer ??= chunk.data.buffer;
          assert.equal(chunk.data.buffer, buffer, `${ctx}: buffer not reused`);
          assert.equal(chunk.cols, cols);
          assert.equal(chunk.rowStart * cols, next, ctx);
          assert.equal(chunk.data.length, chunk.rows * cols, ctx);
          const d = chunk.data;
          const round = target === "f16" ? new Float16Array(d.length) : new Float32Array(d.length);
          for (let i = 0; i < d.length; i++) round[i] = valueAt(next + i);
          for (let i = 0; i < d.length; i++) {
            if (d[i] !== round[i]) {
              assert.fail(`${ctx} element ${next + i}: got ${d[i]}, expected ${round[i]}`);
            }
          }
          next += d.length;
          chunks++;
        }
        assert.equal(next, rows * cols, `seed ${seed} ${target}: all elements`);
        assert.ok(chunks >= 64, `${target}: ${chunks} chunks`);
      }
    } finally {
      file.close();
    }
  });
});

Deno.test("SafetensorsFile.open() rejects truncated files and corrupt headers with one-line errors naming the file", async () => {
  await withTempDir(async (dir) => {
    const good = join(dir, "good.safetensors");
    await writeSafetensors(good, [
      { name: "w", dtype: "F32", shape: [4, 4], data: () => new Uint8Array(64) },
    ]);
    const bytes = await Deno.readFile(good);

    const p = (name: string) => join(dir, name);
    await Deno.writeFile(p("tiny"), bytes.subarray(0, 5));
    await assertCheckpointError(SafetensorsFile.open(p("tiny")), p("tiny"), "truncated");

    await Deno.writeFile(p("cut"), bytes.subarray(0, bytes.length - 10));
    await assertCheckpointError(
      SafetensorsFile.open(p("cut")),
      p("cut"),
      "outside the data section",
    );

    const long = bytes.slice();
    new DataView(long.buffer).setBigUint64(0, BigInt(bytes.length), true);
    await Deno.writeFile(p("hdrlen"), long);
    await assertCheckpointError(
      SafetensorsFile.open(p("hdrlen")),
      p("hdrlen"),
      "exceeds the file size",
    );

    const corrupt = bytes.slice();
    corrupt[9] = 0x7b; // '{' where a '"' was
    await Deno.writeFile(p("json"), corrupt);
    await assertCheckpointError(
      SafetensorsFile.open(p("json")),
      p("json"),
      "corrupt safetensors header",
    );

    await writeRaw(p("range"), { w: { dtype: "F32", shape: [4], data_offsets: [8, 24] } }, 16);
    await assertCheckpointError(
      SafetensorsFile.open(p("range")),
      p("range"),
      "outside the data section",
    );

    await writeRaw(p("overlap"), {
      a: { dtype: "F32", shape: [4], data_offsets: [0, 16] },
      b: { dtype: "F32", shape: [4], data_offsets: [8, 24] },
    }, 24);
    await assertCheckpointError(SafetensorsFile.open(p("overlap")), p("overlap"), "overlap");

    await writeRaw(p("size"), { w: { dtype: "F16", shape: [4], data_offsets: [0, 16] } }, 16);
    await assertCheckpointError(SafetensorsFile.open(p("size")), p("size"), "needs 8");

    await writeRaw(p("dtype"), { w: { dtype: "Q4", shape: [4], data_offsets: [0, 2] } }, 2);
    await assertCheckpointError(SafetensorsFile.open(p("dtype")), p("dtype"), `unknown dtype "Q4"`);

    await writeRaw(p("shape"), { w: { dtype: "F32", shape: [-1], data_offsets: [0, 4] } }, 4);
    await assertCheckpointError(SafetensorsFile.open(p("shape")), p("shape"), "invalid shape");

    await assertCheckpointError(SafetensorsFile.open(p("absent")), p("absent"), "cannot open");
  });
});

Deno.test("readTensorChunks() rejects unsupported dtypes and missing tensors, naming the tensor", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "i64.safetensors");
    await writeRaw(path, {
      position_ids: { dtype: "I64", shape: [2], data_offsets: [0, 16] },
      w: { dtype: "F32", shape: [1], data_offsets: [16, 20] },
    }, 20);
    const file = await SafetensorsFile.open(path);
    try {
      await assertCheckpointError(
        file.readTensor("position_ids"),
        "position_ids",
        "unsupported dtype I64",
      );
      await assertCheckpointError(file.readTensor("nope"), "nope", "not found");
      assert.deepEqual([...(await file.readTensor("w"))], [0]);
    } finally {
      file.close();
    }
  });
});
