/**
 * Reading and writing the safetensors format
 * (https://huggingface.co/docs/safetensors): an 8-byte little-endian u64 header length `N`,
 * `N` bytes of JSON header (`{ name: { dtype, shape, data_offsets: [begin, end] }, ...,
 * "__metadata__"?: { string: string } }`, padded with spaces), then the raw little-endian tensor
 * data; `data_offsets` are relative to the start of the data section.
 *
 * Both directions stream: {@linkcode writeSafetensors} asks each tensor for its bytes only when
 * it writes it, and {@linkcode SafetensorsFile.readTensorChunks} reads a tensor in bounded chunks
 * of whole rows into reused buffers, so host memory stays bounded by the chunk size whatever the
 * file size. The header is read and validated in `safetensors_header.ts`.
 *
 * @module
 */

import type { DType } from "../../gpu/dtype.ts";
import { CheckpointError } from "./errors.ts";
import { E4M3_VALUES } from "./fp8.ts";
import {
  DTYPE_BYTES,
  product,
  readExactly,
  readHeader,
  type TensorInfo,
  validShape,
} from "./safetensors_header.ts";

/** Element types this engine can read from and write to a safetensors file. */
export type SafetensorsDType = "F32" | "F16" | "BF16";

/** A tensor for {@linkcode writeSafetensors}. */
export interface TensorToWrite {
  /** Tensor name, unique in the file (e.g. `model.layers.0.self_attn.q_proj.weight`). */
  name: string;
  /**
   * Element type of `data` (F8_E4M3: `float8_e4m3fn` bytes, engine/model/fp8.ts; I32 / I64: a
   * packed-integer checkpoint's words and shapes, engine/model/packed_int.ts).
   */
  dtype: SafetensorsDType | "F8_E4M3" | "I32" | "I64";
  /** Shape, outermost dimension first (row-major). */
  shape: readonly number[];
  /**
   * Raw little-endian bytes, `product(shape) * elementSize(dtype)` of them, produced lazily:
   * called once, when the tensor is written.
   */
  data: () => Uint8Array;
}

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** Element types {@linkcode SafetensorsFile.readTensorChunks} converts from. */
type ReadableDType = SafetensorsDType | "F8_E4M3";

function isReadable(dtype: string): dtype is ReadableDType {
  return dtype === "F32" || dtype === "F16" || dtype === "BF16" || dtype === "F8_E4M3";
}

/**
 * Converts host values to the raw little-endian bytes of a safetensors `dtype`
 * (F16 and BF16 round to nearest even). A helper for producing {@linkcode TensorToWrite.data}.
 */
export function encodeTensorData(values: ArrayLike<number>, dtype: SafetensorsDType): Uint8Array {
  switch (dtype) {
    case "F32":
      return new Uint8Array(Float32Array.from(values).buffer);
    case "F16":
      return new Uint8Array(Float16Array.from(values).buffer);
    case "BF16": {
      const f32 = Float32Array.from(values);
      const bits = new Uint32Array(f32.buffer);
      const out = new Uint16Array(f32.length);
      for (let i = 0; i < bits.length; i++) {
        const b = bits[i]!;
        if ((b & 0x7fffffff) > 0x7f800000) {
          out[i] = (b >>> 16) | 0x40; // NaN: keep it a (quiet) NaN
        } else {
          out[i] = (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
        }
      }
      return new Uint8Array(out.buffer);
    }
  }
}

async function writeAll(file: Deno.FsFile, bytes: Uint8Array): Promise<void> {
  let done = 0;
  while (done < bytes.length) done += await file.write(bytes.subarray(done));
}

/**
 * Writes `tensors` to a safetensors file at `path` (created or truncated), streaming tensor by
 * tensor: each tensor's `data()` is called only when it is written, so the whole file is never
 * held in memory. The JSON header is padded with spaces to a multiple of 8 bytes; `metadata`,
 * when given, is stored under `__metadata__`. Tensors are laid out in the order given.
 *
 * @throws {RangeError} for duplicate names, invalid shapes, or `data()` of the wrong length.
 */
export async function writeSafetensors(
  path: string,
  tensors: readonly TensorToWrite[],
  metadata?: Record<string, string>,
): Promise<void> {
  const header: Record<string, unknown> = {};
  if (metadata !== undefined) header["__metadata__"] = { ...metadata };
  const sizes: number[] = [];
  let offset = 0;
  for (const t of tensors) {
    if (t.name === "__metadata__" || Object.hasOwn(header, t.name)) {
      throw new RangeError(`Cannot write ${path}: duplicate or reserved tensor name "${t.name}"`);
    }
    if (!validShape(t.shape)) {
      throw new RangeError(
        `Cannot write ${path}: tensor "${t.name}" has invalid shape [${t.shape.join(", ")}]`,
      );
    }
    const size = product(t.shape) * DTYPE_BYTES[t.dtype]!;
    header[t.name] = { dtype: t.dtype, shape: [...t.shape], data_offsets: [offset, offset + size] };
    sizes.push(size);
    offset += size;
  }
  let json = JSON.stringify(header);
  let headerBytes = new TextEncoder().encode(json);
  const padded = Math.ceil(headerBytes.length / 8) * 8;
  if (padded !== headerBytes.length) {
    json += " ".repeat(padded - headerBytes.length);
    headerBytes = new TextEncoder().encode(json);
  }
  const prefix = new Uint8Array(8);
  new DataView(prefix.buffer).setBigUint64(0, BigInt(headerBytes.length), true);

  const file = await Deno.open(path, { write: true, create: true, truncate: true });
  try {
    await writeAll(file, prefix);
    await writeAll(file, headerBytes);
    for (let i = 0; i < tensors.length; i++) {
      const t = tensors[i]!;
      const bytes = t.data();
      if (bytes.length !== sizes[i]) {
        throw new RangeError(
          `Cannot write ${path}: tensor "${t.name}" [${t.shape.join(", ")}] ${t.dtype} needs ${
            sizes[i]
          } bytes, data() gave ${bytes.length}`,
        );
      }
      await writeAll(file, bytes);
    }
  } finally {
    file.close();
  }
}

/** Options for {@linkcode SafetensorsFile.readTensorChunks}. */
export interface ChunkOptions {
  /** Element type of the yielded data (f32 or f16); default f32. */
  targetDtype?: DType;
  /**
   * Upper bound, in bytes, of every buffer used while reading (the raw read buffer, any
   * conversion buffer and the yielded array); default 4 MiB. A chunk holds at least one row, so
   * a single row larger than this makes a chunk of exactly one row.
   */
  chunkBytes?: number;
}

/**
 * A chunk of whole rows of a tensor. A tensor of shape `[..., cols]` is seen as a row-major
 * `[rows, cols]` matrix with `cols` its last dimension and `rows` the product of the others
 * (1 for a 1-D tensor, whose single row is the whole tensor).
 */
export interface TensorChunk {
  /** Index of the first row in this chunk. */
  readonly rowStart: number;
  /** Number of rows in this chunk. */
  readonly rows: number;
  /** Elements per row (the tensor's last dimension). */
  readonly cols: number;
  /**
   * `rows * cols` values, row-major, of the requested target dtype. The array is REUSED by the
   * next chunk: consume it (e.g. GpuMatrix.writeRows) or copy it before iterating on.
   */
  readonly data: Float32Array | Float16Array;
}

/**
 * An open safetensors file: its validated header, with tensor data read on demand in bounded
 * chunks. Opening reads only the header. Call {@linkcode close} when done.
 */
export class SafetensorsFile {
  /** Path the file was opened from. */
  readonly path: string;
  /** The `__metadata__` map (empty when absent). */
  readonly metadata: Readonly<Record<string, string>>;
  /** Every tensor in the file, by name, in header order. */
  readonly tensors: ReadonlyMap<string, TensorInfo>;
  #file: Deno.FsFile;

  private constructor(
    path: string,
    file: Deno.FsFile,
    metadata: Record<string, string>,
    tensors: Map<string, TensorInfo>,
  ) {
    this.path = path;
    this.#file = file;
    this.metadata = metadata;
    this.tensors = tensors;
  }

  /**
   * Opens `path` and validates its header: header length within the file, valid JSON, every
   * tensor with a known dtype, a valid shape, `data_offsets` inside the data section, of size
   * `product(shape) * elementSize(dtype)`, and not overlapping another tensor.
   *
   * @throws {CheckpointError} one line starting with `path` when any check fails.
   */
  static async open(path: string): Promise<SafetensorsFile> {
    if (!LITTLE_ENDIAN) throw new CheckpointError(`${path}: big-endian hosts are not supported`);
    let file: Deno.FsFile;
    try {
      file = await Deno.open(path, { read: true });
    } catch (e) {
      throw new CheckpointError(`${path}: cannot open (${e instanceof Error ? e.message : e})`, {
        cause: e,
      });
    }
    try {
      const { metadata, tensors } = await readHeader(file, path);
      return new SafetensorsFile(path, file, metadata, tensors);
    } catch (e) {
      file.close();
      throw e;
    }
  }

  /**
   * The tensor called `name`.
   *
   * @throws {CheckpointError} `"<name>: tensor not found in <path>"`.
   */
  tensor(name: string): TensorInfo {
    const info = this.tensors.get(name);
    if (info === undefined) throw new CheckpointError(`${name}: tensor not found in ${this.path}`);
    return info;
  }

  /**
   * Streams tensor `name` as chunks of whole rows (see {@linkcode TensorChunk}) converted to
   * `targetDtype`: BF16 -> f32 exactly, F16 -> f32 exactly, F32 -> f16 and BF16 -> f16 (via f32)
   * rounding to nearest even, F8_E4M3 -> f32 or f16 exactly (the bytes' own values: an FP8
   * weight's scales are applied by engine/model/checkpoint.ts). Reads with seek + read into
   * reused buffers; every buffer stays within `chunkBytes` (unless one row is larger), so peak
   * memory is a few chunks.
   *
   * @throws {CheckpointError} for a missing tensor, an unsupported dtype (naming both) or a file
   * that became shorter than its header says.
   */
  async *readTensorChunks(
    name: string,
    options: ChunkOptions = {},
  ): AsyncGenerator<TensorChunk, void, undefined> {
    const info = this.tensor(name);
    const target = options.targetDtype ?? "f32";
    const chunkBytes = options.chunkBytes ?? 4 << 20;
    if (!Number.isSafeInteger(chunkBytes) || chunkBytes < 1) {
      throw new RangeError(`Cannot read ${name}: chunkBytes must be a positive integer`);
    }
    const src = info.dtype;
    if (!isReadable(src)) {
      throw new CheckpointError(
        `${name}: unsupported dtype ${src} in ${this.path} (supported: F32, F16, BF16, F8_E4M3)`,
      );
    }
    const cols = info.shape.length === 0 ? 1 : info.shape[info.shape.length - 1]!;
    const totalElems = product(info.shape);
    if (totalElems === 0) return;
    const rowsTotal = totalElems / cols;
    const srcSize = DTYPE_BYTES[src]!;
    const dstSize = target === "f16" ? 2 : 4;
    const viaF32 = src === "BF16" && target === "f16";
    const widest = Math.max(srcSize, dstSize, viaF32 ? 4 : 0);
    const rowsPerChunk = Math.max(1, Math.min(rowsTotal, Math.floor(chunkBytes / (cols * widest))));
    const maxElems = rowsPerChunk * cols;

    // Reused buffers. When source and target types match, the data is read straight into the
    // output array.
    const same = (src === "F32" && target === "f32") || (src === "F16" && target === "f16");
    const out = target === "f16" ? new Float16Array(maxElems) : new Float32Array(maxElems);
    const raw = same
      ? new Uint8Array(out.buffer, 0, maxElems * srcSize)
      : new Uint8Array(maxElems * srcSize);
    const tmp = viaF32 ? new Float32Array(maxElems) : undefined;

    for (let row = 0; row < rowsTotal; row += rowsPerChunk) {
      const rows = Math.min(rowsPerChunk, rowsTotal - row);
      const elems = rows * cols;
      const bytes = raw.subarray(0, elems * srcSize);
      await readExactly(this.#file, this.path, info.fileOffset + row * cols * srcSize, bytes);
      const dst = out.subarray(0, elems);
      if (!same) {
        if (src === "BF16") {
          const halves = new Uint16Array(raw.buffer, 0, elems);
          const f32 = tmp ?? dst;
          if (!(f32 instanceof Float32Array)) throw new TypeError("unreachable");
          const bits = new Uint32Array(f32.buffer, 0, elems);
          for (let i = 0; i < elems; i++) bits[i] = halves[i]! << 16;
          if (tmp !== undefined) dst.set(tmp.subarray(0, elems));
        } else if (src === "F8_E4M3") {
          for (let i = 0; i < elems; i++) dst[i] = E4M3_VALUES[raw[i]!]!;
        } else if (src === "F16") {
          dst.set(new Float16Array(raw.buffer, 0, elems));
        } else {
          dst.set(new Float32Array(raw.buffer, 0, elems));
        }
      }
      yield { rowStart: row, rows, cols, data: dst };
    }
  }

  /**
   * Reads a whole tensor into a new array of `targetDtype` (row-major). Meant for small tensors
   * (norm weights, biases); stream large ones with {@linkcode readTensorChunks}.
   */
  async readTensor(name: string, targetDtype: DType = "f32"): Promise<Float32Array | Float16Array> {
    const info = this.tensor(name);
    const n = product(info.shape);
    const result = targetDtype === "f16" ? new Float16Array(n) : new Float32Array(n);
    for await (const chunk of this.readTensorChunks(name, { targetDtype })) {
      result.set(chunk.data, chunk.rowStart * chunk.cols);
    }
    return result;
  }

  /**
   * The raw little-endian bytes of tensor `name`, whole (for the small packed tensors of
   * quantized checkpoints: int32 codes, zero points, group indices).
   */
  async readBytes(name: string): Promise<Uint8Array> {
    const info = this.tensor(name);
    const bytes = new Uint8Array(info.byteLength);
    await readExactly(this.#file, this.path, info.fileOffset, bytes);
    return bytes;
  }

  /** Closes the file. */
  close(): void {
    this.#file.close();
  }
}
