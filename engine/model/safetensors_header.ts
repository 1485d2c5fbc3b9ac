/**
 * The safetensors header: the 8-byte little-endian length prefix and the JSON header it
 * announces, read from an open file and validated (dtype, shape, `data_offsets` inside the data
 * section, of the right size and not overlapping) into a {@linkcode TensorInfo} per tensor. Also
 * the format's dtype sizes and the exact-read helper shared with the tensor reader in
 * `safetensors.ts`.
 *
 * @module
 */

import { CheckpointError } from "./errors.ts";

/** Bytes per element of every dtype the safetensors format defines (used to validate sizes). */
export const DTYPE_BYTES: Readonly<Record<string, number>> = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  F8_E4M3: 1,
  F8_E5M2: 1,
  I16: 2,
  U16: 2,
  F16: 2,
  BF16: 2,
  I32: 4,
  U32: 4,
  F32: 4,
  I64: 8,
  U64: 8,
  F64: 8,
};

/** Largest header accepted (the format's own limit is 100 MB). */
const MAX_HEADER_BYTES = 100_000_000;

/** `shape` as error messages write it: `[a, b]`. */
export function shapeText(shape: readonly number[]): string {
  return `[${shape.join(", ")}]`;
}

/** Number of elements of a tensor of `shape` (1 for a scalar). */
export function product(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/** Whether every dimension of `shape` is a non-negative safe integer. */
export function validShape(shape: readonly unknown[]): shape is number[] {
  return shape.every((d) => typeof d === "number" && Number.isSafeInteger(d) && d >= 0);
}

/** Where one tensor lives in a safetensors file. */
export interface TensorInfo {
  readonly name: string;
  /** Element type in the file (any safetensors dtype; only F32, F16 and BF16 can be read). */
  readonly dtype: string;
  readonly shape: readonly number[];
  /** Absolute byte offset of the tensor's data in the file. */
  readonly fileOffset: number;
  /** Bytes of data: `product(shape) * elementSize(dtype)`. */
  readonly byteLength: number;
}

/**
 * Reads exactly `into.length` bytes of `file` starting at byte `position`.
 *
 * @throws {CheckpointError} `"<path>: truncated file (...)"` when the file ends first.
 */
export async function readExactly(
  file: Deno.FsFile,
  path: string,
  position: number,
  into: Uint8Array,
): Promise<void> {
  await file.seek(position, Deno.SeekMode.Start);
  let done = 0;
  while (done < into.length) {
    const n = await file.read(into.subarray(done));
    if (n === null) {
      throw new CheckpointError(
        `${path}: truncated file (needed ${into.length} bytes at offset ${position}, got ${done})`,
      );
    }
    done += n;
  }
}

/**
 * Reads and validates the header of the safetensors file `file` (opened from `path`): the 8-byte
 * length prefix, checked against the file size and {@linkcode MAX_HEADER_BYTES}, then the JSON
 * header (see `SafetensorsFile.open` in `safetensors.ts` for the checks). Leaves the file
 * open.
 *
 * @throws {CheckpointError} one line starting with `path` when any check fails.
 */
export async function readHeader(
  file: Deno.FsFile,
  path: string,
): Promise<{ metadata: Record<string, string>; tensors: Map<string, TensorInfo> }> {
  const { size } = await file.stat();
  if (size < 8) {
    throw new CheckpointError(
      `${path}: truncated safetensors file (${size} bytes, the header length alone needs 8)`,
    );
  }
  const prefix = new Uint8Array(8);
  await readExactly(file, path, 0, prefix);
  const headerLen = new DataView(prefix.buffer).getBigUint64(0, true);
  if (headerLen > BigInt(size - 8)) {
    throw new CheckpointError(
      `${path}: header length ${headerLen} exceeds the file size of ${size} bytes (truncated or not a safetensors file)`,
    );
  }
  if (headerLen > BigInt(MAX_HEADER_BYTES)) {
    throw new CheckpointError(
      `${path}: header length ${headerLen} exceeds the ${MAX_HEADER_BYTES}-byte limit`,
    );
  }
  const n = Number(headerLen);
  const headerBytes = new Uint8Array(n);
  await readExactly(file, path, 8, headerBytes);
  const dataStart = 8 + n;
  return parseHeader(path, headerBytes, dataStart, size - dataStart);
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Where one tensor's data lies in the data section (to check for overlaps). */
interface Span {
  readonly name: string;
  readonly begin: number;
  readonly end: number;
}

/**
 * Parses and validates the JSON header `bytes` of the file at `path`, whose data section starts
 * at byte `dataStart` and holds `dataLength` bytes.
 */
function parseHeader(
  path: string,
  bytes: Uint8Array,
  dataStart: number,
  dataLength: number,
): { metadata: Record<string, string>; tensors: Map<string, TensorInfo> } {
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (e) {
    throw new CheckpointError(
      `${path}: corrupt safetensors header (${e instanceof Error ? e.message : e})`,
      { cause: e },
    );
  }
  if (!isRecord(json)) {
    throw new CheckpointError(`${path}: corrupt safetensors header (not a JSON object)`);
  }
  let metadata: Record<string, string> = {};
  const spans: Span[] = [];
  const tensors = new Map<string, TensorInfo>();
  for (const [name, entry] of Object.entries(json)) {
    if (name === "__metadata__") {
      metadata = parseMetadata(path, entry);
      continue;
    }
    const info = parseTensor(path, name, entry, dataLength);
    spans.push({ name, begin: info.begin, end: info.begin + info.byteLength });
    tensors.set(name, {
      name,
      dtype: info.dtype,
      shape: info.shape,
      fileOffset: dataStart + info.begin,
      byteLength: info.byteLength,
    });
  }
  checkNoOverlap(path, spans);
  return { metadata, tensors };
}

/** The `__metadata__` entry: a map of strings. */
function parseMetadata(path: string, entry: unknown): Record<string, string> {
  if (!isRecord(entry)) {
    throw new CheckpointError(`${path}: corrupt safetensors header (__metadata__ not an object)`);
  }
  const metadata: Record<string, string> = {};
  for (const [k, v] of Object.entries(entry)) {
    if (typeof v !== "string") {
      throw new CheckpointError(
        `${path}: corrupt safetensors header (__metadata__.${k} is not a string)`,
      );
    }
    metadata[k] = v;
  }
  return metadata;
}

/**
 * One tensor's entry, validated: a known dtype, a valid shape, and `data_offsets` inside the
 * data section of `dataLength` bytes spanning exactly the bytes the shape needs.
 */
function parseTensor(
  path: string,
  name: string,
  entry: unknown,
  dataLength: number,
): { dtype: string; shape: number[]; begin: number; byteLength: number } {
  const bad = (why: string) =>
    new CheckpointError(`${path}: corrupt safetensors header: tensor "${name}" ${why}`);
  if (!isRecord(entry)) throw bad("is not an object");
  const { dtype, shape, data_offsets: offsets } = entry;
  if (typeof dtype !== "string") throw bad("has no dtype");
  const esize = DTYPE_BYTES[dtype];
  if (esize === undefined) throw bad(`has unknown dtype ${JSON.stringify(dtype)}`);
  if (!Array.isArray(shape) || !validShape(shape)) throw bad("has an invalid shape");
  if (
    !Array.isArray(offsets) || offsets.length !== 2 ||
    !offsets.every((o) => typeof o === "number" && Number.isSafeInteger(o) && o >= 0)
  ) {
    throw bad("has invalid data_offsets");
  }
  const begin: number = offsets[0];
  const end: number = offsets[1];
  if (begin > end || end > dataLength) {
    throw bad(
      `has data_offsets [${begin}, ${end}] outside the data section of ${dataLength} bytes`,
    );
  }
  const expected = product(shape) * esize;
  if (end - begin !== expected) {
    throw bad(
      `has ${end - begin} bytes of data, but shape [${
        shape.join(", ")
      }] ${dtype} needs ${expected}`,
    );
  }
  return { dtype, shape, begin, byteLength: expected };
}

/** Throws when two tensors' data overlap (`spans` is sorted in place). */
function checkNoOverlap(path: string, spans: Span[]): void {
  spans.sort((a, b) => a.begin - b.begin || a.end - b.end);
  for (let i = 1; i < spans.length; i++) {
    const prev = spans[i - 1]!;
    const cur = spans[i]!;
    if (cur.begin < prev.end) {
      throw new CheckpointError(
        `${path}: corrupt safetensors header: tensors "${prev.name}" [${prev.begin}, ${prev.end}] and "${cur.name}" [${cur.begin}, ${cur.end}] overlap`,
      );
    }
  }
}
