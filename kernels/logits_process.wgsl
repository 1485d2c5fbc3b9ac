// logits_process: OpenAI / vLLM logits processing before sampling, in place, touching only the
// logits of the tokens a sequence lists (never the whole row).
//
// Per sequence s (row s of logits, one workgroup), with l = logits[s, :] and the record seq[s]:
//   0. append: when append_len == 1 and output_len >= 1, the entry `append` (resolved, below) is
//      first written to tokens[output_offset + output_len - 1], the last output token of the
//      list. The engine keeps each penalised request's prompt and output so far in `tokens` for
//      the request's lifetime, and appends this way the token fed as the row's last input (a
//      reference to the step's resolved input ids), so a step uploads only the records.
//   1. logit bias: l[t] += b for every pair (t, b) of bias[bias_offset .. + bias_len]
//      (tokens must be distinct within a sequence; t >= vocab is ignored)
//   2. for every DISTINCT token t < vocab of P = tokens[prompt_offset .. + prompt_len] and
//      O = tokens[output_offset .. + output_len] (the output so far), with c = count of t in O:
//        repetition (vLLM / HF):  if t in P or c > 0:  l[t] = l[t] > 0 ? l[t] / repetition
//                                                                   : l[t] * repetition
//        frequency and presence:  if c > 0:  l[t] -= frequency * c + presence
//   Each distinct token is processed exactly once, whatever its number of occurrences.
// A token list entry (or `append`) with bit 31 set is a reference: it stands for
// sampled[entry & 0x7fffffff] (as in token_feed, an index past the end of `sampled` yields
// token 0). The engine binds `sampled` to the step's resolved input ids.
// Records with repetition == 1, presence == 0, frequency == 0 and bias_len == 0 return at once
// (after the append).
//
// Deduplication: one workgroup per sequence builds an open-addressing hash table in global
// memory, in the sequence's own region of `table` (2 * n slots of 2 words for the n listed
// tokens, so the table is at most half full): key = token + 1 (0: empty), value = bit 31 "in the
// prompt" | count in the output. Phases, separated by storage barriers: (a) append, clear the
// region and add the biases, (b) insert every listed token with atomics (claim a slot with
// compare-exchange, linear probing; atomicOr the prompt flag or atomicAdd the count), (c) every
// occupied slot (one per distinct token) updates its logit. Work and memory are O(n) per
// sequence, independent of the vocabulary. Prompt tokens are not inserted when repetition == 1.
//
// Bindings (group 0):
//   0 logits  : storage rw     array<f32>               [num_seqs, vocab] (row stride vocab)
//   1 seq     : storage read   array<SeqParams>         [num_seqs] (48 bytes each, see below)
//   2 tokens  : storage rw     array<u32>               [total tokens] prompt and output lists
//                                                       (written only by the append)
//   3 bias    : storage read   array<BiasEntry>         [total bias pairs] (token u32, bias f32)
//   4 sampled : storage read   array<u32>               [num_sampled] ids references point into
//   5 table   : storage rw     array<atomic<u32>>       [scratch words] hash tables; sequence s
//                                                       uses 4 * (prompt_len + output_len)
//                                                       words from table_offset
//   6 p       : uniform        Params
// Limits: an invocation runs about 8 * (prompt_len + output_len) / WG loop iterations; Mesa
// lavapipe silently ends loops after 65535 iterations per invocation, so lists stay below ~500k
// tokens there.
// Prelude (kernels/logits_process.ts): logit_row.wgsl (mix32, which spreads token ids over the
// table).
// Workgroup: WG (64) invocations, one workgroup per sequence; threads stride over the lists.
// Dispatch:  num_seqs workgroups as a 1-D grid folded into (x, y) (kernels/dispatch.ts dispatch1d).

struct Params {
  num_seqs: u32,
  vocab: u32,
}

struct SeqParams {
  repetition: f32, //    1: off; > 0
  presence: f32, //      0: off
  frequency: f32, //     0: off
  prompt_offset: u32, // index of the prompt tokens in `tokens`
  prompt_len: u32,
  output_offset: u32, // index of the output tokens in `tokens`
  output_len: u32,
  bias_offset: u32, //   index of the bias pairs in `bias`
  bias_len: u32,
  table_offset: u32, //  word index of the sequence's hash table in `table`
  append: u32, //        list entry written as the last output token (see 0. above)
  append_len: u32, //    1: append; 0: none
}

struct BiasEntry {
  token: u32,
  bias: f32,
}

const WG: u32 = 64u;
const IN_PROMPT: u32 = 0x80000000u;

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;
@group(0) @binding(1) var<storage, read> seq: array<SeqParams>;
@group(0) @binding(2) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<BiasEntry>;
@group(0) @binding(4) var<storage, read> sampled: array<u32>;
@group(0) @binding(5) var<storage, read_write> table: array<atomic<u32>>;
@group(0) @binding(6) var<uniform> p: Params;

/// The token id of a list entry, resolving references to `sampled`.
fn resolve(entry: u32) -> u32 {
  if ((entry & 0x80000000u) == 0u) {
    return entry;
  }
  let s = entry & 0x7fffffffu;
  let n = arrayLength(&sampled);
  return select(0u, sampled[min(s, n - 1u)], s < n);
}

/// Inserts `token` into the table of `slots` slots at word `base`; returns its slot.
fn insert(token: u32, base: u32, slots: u32) -> u32 {
  let key = token + 1u;
  var slot = mix32(token) % slots;
  loop {
    let r = atomicCompareExchangeWeak(&table[base + 2u * slot], 0u, key);
    if (r.exchanged || r.old_value == key) {
      break;
    }
    if (r.old_value != 0u) {
      slot += 1u;
      if (slot == slots) {
        slot = 0u;
      }
    }
    // else: a spurious failure of the weak exchange; retry the same slot.
  }
  return slot;
}

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
) {
  let row = wid.x + wid.y * nwg.x;
  if (row >= p.num_seqs) {
    return;
  }
  let sp = seq[row];
  // (a) The append: visible to the whole workgroup after the barrier that ends phase (a).
  if (lid == 0u && sp.append_len != 0u && sp.output_len != 0u) {
    tokens[sp.output_offset + sp.output_len - 1u] = resolve(sp.append);
  }
  let use_rep = sp.repetition != 1.0;
  let use_out = use_rep || sp.presence != 0.0 || sp.frequency != 0.0;
  if (!use_out && sp.bias_len == 0u) {
    return;
  }
  let vocab = p.vocab;
  let base_l = row * vocab;

  // (a) Clear this sequence's table; add the biases.
  let prompt_n = select(0u, sp.prompt_len, use_rep);
  let output_n = select(0u, sp.output_len, use_out);
  let slots = 2u * (prompt_n + output_n);
  let base_t = sp.table_offset;
  for (var i = lid; i < 2u * slots; i += WG) {
    atomicStore(&table[base_t + i], 0u);
  }
  for (var j = lid; j < sp.bias_len; j += WG) {
    let e = bias[sp.bias_offset + j];
    if (e.token < vocab) {
      logits[base_l + e.token] += e.bias;
    }
  }
  if (slots == 0u) {
    return;
  }
  storageBarrier();

  // (b) Insert the listed tokens: prompt membership flag, output counts.
  for (var j = lid; j < prompt_n; j += WG) {
    let t = resolve(tokens[sp.prompt_offset + j]);
    if (t < vocab) {
      let slot = insert(t, base_t, slots);
      atomicOr(&table[base_t + 2u * slot + 1u], IN_PROMPT);
    }
  }
  for (var j = lid; j < output_n; j += WG) {
    let t = resolve(tokens[sp.output_offset + j]);
    if (t < vocab) {
      let slot = insert(t, base_t, slots);
      atomicAdd(&table[base_t + 2u * slot + 1u], 1u);
    }
  }
  storageBarrier();

  // (c) One update per distinct token.
  for (var i = lid; i < slots; i += WG) {
    let key = atomicLoad(&table[base_t + 2u * i]);
    if (key != 0u) {
      let v = atomicLoad(&table[base_t + 2u * i + 1u]);
      let c = v & ~IN_PROMPT;
      let at = base_l + key - 1u;
      var l = logits[at];
      if (use_rep) {
        l = select(l * sp.repetition, l / sp.repetition, l > 0.0);
      }
      if (c > 0u) {
        l -= sp.frequency * f32(c) + sp.presence;
      }
      logits[at] = l;
    }
  }
}
