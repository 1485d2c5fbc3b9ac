/**
 * The files of a Hugging Face checkpoint directory, as engine/model/checkpoint.ts opens them: its
 * JSON files, and its weights as one `model.safetensors` or as the shards that
 * `model.safetensors.index.json` lists (`weight_map`: tensor name -> shard file). Errors are
 * {@linkcode CheckpointError}s of one line, starting with the file concerned.
 *
 * @module
 */

import { join } from "node:path";
import { CheckpointError } from "./errors.ts";
import { SafetensorsFile } from "./safetensors.ts";

const SINGLE_FILE = "model.safetensors";
const INDEX_FILE = "model.safetensors.index.json";

/** The open weight files of a checkpoint, and which one holds each tensor (by stored name). */
export interface WeightFiles {
  readonly files: SafetensorsFile[];
  readonly byTensor: Map<string, SafetensorsFile>;
}

/**
 * Reads and parses the JSON file at `path`.
 *
 * @throws {CheckpointError} when it is missing, unreadable or not JSON.
 */
export async function readCheckpointJson(path: string): Promise<unknown> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    const why = e instanceof Deno.errors.NotFound
      ? "not found"
      : `cannot read (${e instanceof Error ? e.message : e})`;
    throw new CheckpointError(`${path}: ${why}`, { cause: e });
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new CheckpointError(
      `${path}: invalid JSON (${e instanceof Error ? e.message : e})`,
      { cause: e },
    );
  }
}

/**
 * Whether `path` is a file.
 *
 * @throws {CheckpointError} when it cannot be inspected (other than not existing).
 */
export async function fileExists(path: string): Promise<boolean> {
  try {
    return (await Deno.stat(path)).isFile;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw new CheckpointError(`${path}: cannot stat (${e instanceof Error ? e.message : e})`, {
      cause: e,
    });
  }
}

/**
 * Opens the weight files of the checkpoint in `dir`: `model.safetensors` when present, else the
 * shards of `model.safetensors.index.json`. Closes whatever it opened when it throws.
 *
 * @throws {CheckpointError} when there is neither, the index is invalid or points at a missing
 *   shard or at a tensor its shard lacks, or a file is not valid safetensors.
 */
export async function openWeightFiles(dir: string): Promise<WeightFiles> {
  const files: SafetensorsFile[] = [];
  const byTensor = new Map<string, SafetensorsFile>();
  try {
    const single = join(dir, SINGLE_FILE);
    const indexPath = join(dir, INDEX_FILE);
    if (await fileExists(single)) {
      const f = await SafetensorsFile.open(single);
      files.push(f);
      for (const name of f.tensors.keys()) byTensor.set(name, f);
    } else if (await fileExists(indexPath)) {
      await openShards(dir, indexPath, await readCheckpointJson(indexPath), files, byTensor);
    } else {
      throw new CheckpointError(`${dir}: no ${SINGLE_FILE} or ${INDEX_FILE} found`);
    }
  } catch (e) {
    for (const f of files) f.close();
    throw e;
  }
  return { files, byTensor };
}

/** Opens the shards `index` lists into `files`, and maps each tensor to its shard. */
async function openShards(
  dir: string,
  indexPath: string,
  index: unknown,
  files: SafetensorsFile[],
  byTensor: Map<string, SafetensorsFile>,
): Promise<void> {
  const weightMap = typeof index === "object" && index !== null
    ? Reflect.get(index, "weight_map")
    : undefined;
  if (typeof weightMap !== "object" || weightMap === null || Array.isArray(weightMap)) {
    throw new CheckpointError(`${indexPath}: missing or invalid "weight_map"`);
  }
  const shards = new Map<string, SafetensorsFile>();
  for (const [name, shard] of Object.entries(weightMap)) {
    if (typeof shard !== "string" || shard === "" || /[\\/]/.test(shard) || shard === "..") {
      throw new CheckpointError(
        `${indexPath}: weight_map entry "${name}" has an invalid shard file name ${
          JSON.stringify(shard)
        }`,
      );
    }
    let file = shards.get(shard);
    if (file === undefined) {
      const shardPath = join(dir, shard);
      if (!(await fileExists(shardPath))) {
        throw new CheckpointError(
          `${indexPath}: weight_map points at missing shard "${shard}" (for "${name}")`,
        );
      }
      file = await SafetensorsFile.open(shardPath);
      files.push(file);
      shards.set(shard, file);
    }
    if (!file.tensors.has(name)) {
      throw new CheckpointError(
        `${name}: listed in ${indexPath} for shard "${shard}" but not found in it`,
      );
    }
    byTensor.set(name, file);
  }
}
