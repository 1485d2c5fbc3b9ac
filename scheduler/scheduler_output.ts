/**
 * The plain-data contract between a scheduler and the model runner: what one step computes.
 *
 * It is the executor's only source on the request lifecycle (as vLLM v1's `SchedulerOutput`):
 * the executor first drops its per-request state of every id in `finished` and `aborted`, then
 * registers each of `newRequests` (prompt and parameters, e.g. for the repetition penalty),
 * which lists a request in the step that schedules it for the first time, before any step
 * refers to it. It then executes the step in this order:
 * 1. every `swappedOut` copy (GPU block -> host slot), then every `swappedIn` copy (host slot
 *    -> GPU block), in list order: a block freed by a swap-out may be refilled by a swap-in or
 *    by this step's forward pass;
 * 2. one forward pass over the concatenation of `scheduled[i].tokenIds`, writing each token's
 *    K/V to its `slotMapping` slot and attending over positions [0, positionStart + numTokens)
 *    of its request through its `blockTable`;
 * 3. one sampled token for every request with `samplesToken`, kept on the GPU per request (the
 *    next step's {@linkcode SAMPLED_TOKEN} entries read it) and read back to the host later;
 *    and the log-probabilities of the prompt positions in each `promptLogprobs`.
 *
 * @module
 */

import type { SamplingParams } from "./sampling_params.ts";

/**
 * Marker in {@linkcode ScheduledRequest.tokenIds}: "the token most recently sampled for this
 * request" (see {@linkcode ScheduledRequest.sampledFrom}), whose id is not known on the host
 * yet (asynchronous scheduling). It can only be a request's last fed token in a step.
 */
export const SAMPLED_TOKEN = -1;

/** One request's share of a step. */
export interface ScheduledRequest {
  /** The request's id. */
  readonly requestId: string;
  /**
   * The request's sequence (`Sequence.order`): unique for the scheduler's lifetime, so a step's
   * results never reach a later request that reuses the id of one that ended meanwhile.
   */
  readonly order: number;
  /** Tokens computed this step (>= 1): a decode step is 1, a prefill chunk is more. */
  readonly numTokens: number;
  /** The numTokens token ids to feed, each a vocabulary id or {@linkcode SAMPLED_TOKEN}. */
  readonly tokenIds: readonly number[];
  /** Position of tokenIds[0] in the sequence (tokens before it have their KV computed). */
  readonly positionStart: number;
  /**
   * Physical KV block ids of the whole sequence so far (block i: positions [i*B, (i+1)*B)): the
   * sequence's own array, handed over without a copy (O(1) per step, however long the
   * sequence). It is valid for this step; later steps only append to the same array while the
   * sequence keeps its blocks, and a table rebuilt after a preemption or a swap is a new array,
   * so a consumer may keep what it has seen of an array (the model runner's block-table rows,
   * engine/block_table_rows.ts). Copy it to keep this step's table.
   */
  readonly blockTable: readonly number[];
  /** numTokens KV slots, slot = blockTable[p / B] * B + p % B for p = positionStart + i. */
  readonly slotMapping: readonly number[];
  /** True when this step reaches the sequence's end, so a token is sampled from its last row. */
  readonly samplesToken: boolean;
  /**
   * True on the first step after an admission from the waiting queue (new request or resumed
   * after recompute preemption): per-request runner state (sampler, penalties) must be reset.
   */
  readonly isNew: boolean;
  /** Leading tokens reused from the prefix cache at this admission (0 when not isNew). */
  readonly numCachedTokens: number;
  /** The request's sampling parameters (same object every step). */
  readonly params: SamplingParams;
  /**
   * Row of this request's sampled token in this step's sampler output (index among the
   * `samplesToken` entries of `scheduled`, in order), or -1 when it samples nothing.
   */
  readonly sampleRow: number;
  /**
   * Where a {@linkcode SAMPLED_TOKEN} in tokenIds comes from: the step that sampled it and its
   * `sampleRow` there; null when tokenIds holds no marker. With at most one step in flight
   * (step n's results applied before step n+2 is scheduled) `step` is always this step - 1.
   */
  readonly sampledFrom: { readonly step: number; readonly row: number } | null;
  /**
   * Prompt log-probabilities this step computes for the request (`params.promptLogprobs`):
   * absent or null when none.
   */
  readonly promptLogprobs?: PromptLogprobRows | null;
}

/**
 * The prompt positions of a step's chunk whose log-probabilities the sampler computes: fed
 * tokens `first`, `first + 1`, ... of the chunk, scoring the prompt token that follows each.
 * They are rows of the step's sampler after every sampled row, in `scheduled` order.
 */
export interface PromptLogprobRows {
  /** Index in the chunk's `tokenIds` of the first such position. */
  readonly first: number;
  /** `targets[j]`: the prompt token at position `positionStart + first + j + 1`. */
  readonly targets: readonly number[];
  /** Most likely tokens to return per position (`params.promptLogprobs`). */
  readonly topLogprobs: number;
}

/** A request scheduled for the first time: what the executor keeps about it until it ends. */
export interface NewRequestData {
  /** The request's id (unique among live requests; an ended id may come back as a new one). */
  readonly requestId: string;
  /** The prompt's token ids. */
  readonly promptTokenIds: readonly number[];
  /** The request's sampling parameters (the same object as in its `ScheduledRequest`s). */
  readonly params: SamplingParams;
}

/** A request swapped out this step and its copies (GPU block -> host slot), in block order. */
export interface SwappedOutRequest {
  readonly requestId: string;
  readonly copies: readonly { readonly gpuBlock: number; readonly hostSlot: number }[];
}

/** A request swapped in this step and its copies (host slot -> GPU block), in block order. */
export interface SwappedInRequest {
  readonly requestId: string;
  readonly copies: readonly { readonly hostSlot: number; readonly gpuBlock: number }[];
}

/** Everything one scheduling step decided. */
export interface SchedulerOutput {
  /** Step number, 1, 2, ... (updates must be applied in this order). */
  readonly step: number;
  /**
   * Requests in `scheduled` for the first time since they were added, in `scheduled` order
   * (a request resumed after a preemption is not new again).
   */
  readonly newRequests: readonly NewRequestData[];
  /** Requests computed this step, running decodes first, then resumed, then new prefills. */
  readonly scheduled: readonly ScheduledRequest[];
  /** Sum of scheduled[i].numTokens (<= maxNumBatchedTokens). */
  readonly totalTokens: number;
  /** KV block size B used in slotMapping. */
  readonly blockSize: number;
  /** Ids preempted by recompute this step (KV freed; they will be prefilled again). */
  readonly preempted: readonly string[];
  /** Requests swapped out this step, with their copies. */
  readonly swappedOut: readonly SwappedOutRequest[];
  /** Requests swapped in this step, with their copies. */
  readonly swappedIn: readonly SwappedInRequest[];
  /**
   * Ids that finished (stop, length) since the previous step, including ids never scheduled;
   * the executor drops their state before it registers `newRequests`.
   */
  readonly finished: readonly string[];
  /** Ids aborted since the previous step (likewise). */
  readonly aborted: readonly string[];
}

/** Whether `output` has device work: tokens to compute or blocks to swap. */
export function hasDeviceWork(output: SchedulerOutput): boolean {
  return output.scheduled.length > 0 || output.swappedOut.length > 0 ||
    output.swappedIn.length > 0;
}

/**
 * Whether `output` lists ended requests: an executor must see it even when it has no device
 * work, as it learns the request lifecycle from the outputs alone.
 */
export function endsRequests(output: SchedulerOutput): boolean {
  return output.finished.length > 0 || output.aborted.length > 0;
}

/** What a step's results did to one request (returned by `updateFromOutput`). */
export interface RequestUpdate {
  /** The request's id. */
  readonly requestId: string;
  /** Token ids that became known (one per step today). */
  readonly newTokenIds: readonly number[];
  /** Set when the request finished with these tokens. */
  readonly finishReason: "stop" | "length" | null;
  /** The stop token id, when one ended the request. */
  readonly stopReason: number | null;
}
