/**
 * Loading a checkpoint's architecture onto the runner's bind targets: GPT-2, or the
 * Llama-family decoder (with its RoPE table), refusing weights the config does not account for.
 *
 * @module
 */

import { type GpuContext, STORAGE_RW } from "../../gpu/context.ts";
import type { Checkpoint } from "../model/checkpoint.ts";
import { ropeInvFreq } from "../model/config.ts";
import { CheckpointError } from "../model/errors.ts";
import type { WeightLoader } from "../model/weight_loader.ts";
import type { KvCacheAllocator, ModelTargets } from "./bind_targets.ts";
import { DecoderModel } from "./decoder.ts";
import { Gpt2Model } from "./gpt2.ts";
import type { Model } from "./model.ts";

/**
 * Loads the checkpoint's architecture (GPT-2 or the Llama-family decoder, whose RoPE table is
 * added to `own`) and refuses a checkpoint with weights the config does not account for. Each
 * architecture calls `kvCache` once, after its weights are loaded and before it binds its
 * attention.
 */
export async function loadModel(
  ctx: GpuContext,
  ck: Checkpoint,
  loader: WeightLoader,
  targets: ModelTargets,
  own: { destroy(): void }[],
  kvCache: KvCacheAllocator,
): Promise<Model> {
  const c = ck.config;
  let model: Model;
  if (c.arch === "GPT2LMHeadModel") {
    model = await Gpt2Model.load(c, loader, targets, kvCache);
  } else {
    const inv = Float32Array.from(ropeInvFreq(c));
    const invFreq = ctx.createBuffer("rope.invFreq", inv.byteLength, STORAGE_RW);
    ctx.device.queue.writeBuffer(invFreq, 0, inv);
    own.push(invFreq);
    model = await DecoderModel.load(c, loader, targets, kvCache, invFreq);
  }
  const unused = await loader.unusedWeights(c.tieWordEmbeddings);
  if (unused.length > 0) {
    model.destroy();
    throw new CheckpointError(
      `${ck.dir}: ${unused.length} weight(s) the ${c.arch} config does not account for: ${
        unused.slice(0, 4).join(", ")
      }${unused.length > 4 ? ", ..." : ""} (a setting such as attention_bias missing from ` +
        `config.json, or another model's file); refusing to run without them`,
    );
  }
  return model;
}
