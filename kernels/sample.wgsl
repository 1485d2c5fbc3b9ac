// sample: picks one token per sequence from its logits, on the GPU, over the full vocabulary.
//
// Per row s < num_seqs (one workgroup), with l = logits[s, :] and the row's SeqParams
// seq[row0 + s], writing tokens[row0 + s] and logprobs[row0 + s] (row0: the first of a sub-batch
// of rows whose logits were computed into rows 0.. of `logits`, engine/sampler.ts):
//   m      = max(l), argmax = lowest index holding m, lse = m + log(sum(exp(l - m)))
//   greedy (temperature <= 0):  token = argmax
//   random (temperature T > 0): filters, in vLLM's order, on the scaled distribution
//     q_i = exp((l_i - m) / T) (unnormalised):
//       min-p (min_p > 0):  keep l_i >= m + T * log(min_p)         (q_i >= min_p * max q)
//       top-k (top_k > 0):  keep l_i >= the k-th largest surviving logit (ties at it all kept)
//       top-p (top_p < 1):  keep i if the mass of survivors with a STRICTLY larger logit is
//                           < top_p * (mass of all survivors); equal logits are kept or dropped
//                           together (ties at the cut are all kept)
//     then token = argmax over survivors of (l_i - m) / T + G_i, G_i = -log(-log(u_i)) a Gumbel
//     variate, u_i in (0, 1) from a counter-based hash of (seed, counter, i): an exact draw from
//     softmax over the survivors, reproducible for the same (seed, counter, logits).
//   logprob = l[token] - lse  (raw log-softmax at temperature 1, before any filtering)
//   forced (target_id != 0xffffffff, for prompt logprobs / scoring): no draw; temperature, top-k,
//     top-p, min-p, seed and counter are ignored, and with lt = l[target]:
//       tokens[s]   = rank = 1 + #{i : l_i > lt}  (strictly greater: ties with lt do not count,
//                     -inf logits never count; the argmax, or any logit tied with it, has rank 1)
//       logprobs[s] = lt - lse  (same formula as above; -inf when lt is -inf)
//     A target >= vocab reads nothing and writes rank 0 and logprob -inf (callers must keep
//     target < vocab; the host cannot check it).
// Every filter keeps {i : key(l_i) >= tau} for an order-preserving u32 key of the f32 logit.
// tau for top-k / top-p is found by an NB-way radix search on the key: each pass histograms the
// elements inside the current key interval [lo, hi] into NB equal power-of-two sub-ranges
// (per-thread columns in workgroup memory: counts, and for top-p the masses q_i), and narrows
// [lo, hi] to the sub-range where the count (top-k) or mass (top-p) at-or-above crosses the
// target; it stops once that sub-range holds at most one element (or exactly k for top-k) or a
// single key: at most ceil(32 / log2(NB)) + 1 passes. Once at most CAP (1024) elements lie at or
// above lo, the next pass also copies them into a candidate list in workgroup memory, and the
// remaining passes and the draw read the list instead of the row. Sums of q are f32.
// Logits must not be NaN; -inf is allowed (never drawn unless the whole row is -inf, which
// yields token 0 and logprob +inf).
//
// Bindings (group 0):
//   0 logits   : storage read   array<f32>        [num_seqs, vocab] (row stride vocab)
//   1 seq      : storage read   array<SeqParams>  [row0 + num_seqs] (28 bytes each, see below)
//   2 tokens   : storage rw     array<u32>        [row0 + num_seqs]  chosen token ids (forced:
//                                                                    rank)
//   3 logprobs : storage rw     array<f32>        [row0 + num_seqs]  raw logprob of the chosen
//                                                                    (forced: target) token
//   4 p        : uniform        Params
// Prelude (kernels/sample.ts): `const WG` (invocations per workgroup), `const NB` (buckets per
// search pass) and `const NB_LOG2`; logit_row.wgsl (NEG_INF, POS_INF, order_key, mix32);
// workgroup memory ~ 8 * NB * WG + 8 * CAP + 16 * WG bytes. Each `ROW_SCAN(visit)` line becomes
// the loop of kernels/logit_row.ts: visit($logit, $index) for every logit of the row.
// Workgroup: WG invocations, one workgroup per sequence; each thread strides the row, 4 loads
// in flight.
// Dispatch:  num_seqs workgroups as a 1-D grid folded into (x, y) (kernels/dispatch.ts dispatch1d).

struct Params {
  num_seqs: u32,
  vocab: u32,
  row0: u32, // index of logits row 0 in seq, tokens and logprobs
}

struct SeqParams {
  temperature: f32, // <= 0: greedy
  top_k: u32, //       0: off
  top_p: f32, //       >= 1: off; in (0, 1]
  min_p: f32, //       0: off; in [0, 1]
  seed: u32,
  counter: u32, //     e.g. the output position: fresh randomness per step
  target_id: u32, //   the record's `target` (a reserved word in WGSL): 0xffffffff: sample;
  //                   else forced (scoring) mode, see above
}

// Search state shared by the workgroup (written by thread 0, read with workgroupUniformLoad).
struct Search {
  lo: u32,
  hi: u32,
  above_c: u32, // elements with key > hi (within the search's range)
  above_w: f32, // their mass
  goal: f32, //    top-p: top_p * mass of the range
  done: u32,
  list: u32, //    1: cand_* hold exactly the elements with key >= list_lo (list_n of them)
  list_lo: u32,
  list_n: u32,
  fill: u32, //    1: the next row scan appends the elements with key >= fill_lo to cand_*
  fill_lo: u32,
}

struct Stats {
  m: f32, //       max logit
  arg: u32, //     lowest index of the max
  sum: f32, //     sum(exp(l - m))
  mn: f32, //      smallest finite logit (+inf when none)
}

const CAP: u32 = 1024u; // candidate list capacity
const FAN: u32 = 8u; // entries combined per thread in the first level of a reduction

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> seq: array<SeqParams>;
@group(0) @binding(2) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(3) var<storage, read_write> logprobs: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> hist_c: array<u32, NB * WG>; // [bucket][thread]
var<workgroup> hist_w: array<f32, NB * WG>;
var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_g: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;
var<workgroup> red_h: array<f32, WG>;
var<workgroup> cand_v: array<f32, CAP>; // candidate list: logits and token ids
var<workgroup> cand_i: array<u32, CAP>;
var<workgroup> cand_n: atomic<u32>;
var<workgroup> sh_search: Search;
var<workgroup> sh_stats: Stats;

// Per-thread accumulators of the stats and Gumbel passes.
var<private> t_m: f32;
var<private> t_arg: u32;
var<private> t_sum: f32;
var<private> t_mn: f32;

fn stats_visit(l: f32, i: u32) {
  if (l > t_m) {
    t_sum = t_sum * exp(t_m - l) + 1.0;
    t_m = l;
    t_arg = i;
  } else if (l > NEG_INF) {
    t_sum += exp(l - t_m);
  }
  if (l > NEG_INF) {
    t_mn = min(t_mn, l);
  }
}

fn search_visit(
  l: f32,
  i: u32,
  s: Search,
  shift: u32,
  mass: bool,
  m: f32,
  inv_t: f32,
  lid: u32,
) {
  let key = order_key(l);
  if (s.fill != 0u && key >= s.fill_lo) {
    let at = atomicAdd(&cand_n, 1u);
    if (at < CAP) {
      cand_v[at] = l;
      cand_i[at] = i;
    }
  }
  if (key >= s.lo && key <= s.hi) {
    let lo = s.lo;
    let slot = ((key - lo) >> shift) * WG + lid;
    hist_c[slot] += 1u;
    if (mass) {
      hist_w[slot] += exp((l - m) * inv_t);
    }
  }
}

fn gumbel_visit(l: f32, i: u32, lo: u32, m: f32, inv_t: f32, k1: u32, k2: u32) {
  if (order_key(l) >= lo) {
    let h = mix32(mix32(i ^ k1) + k2);
    let u = (f32(h >> 8u) + 0.5) * (1.0 / 16777216.0);
    let score = (l - m) * inv_t - log(-log(u));
    if (score > t_m) {
      t_m = score;
      t_arg = i;
    }
  }
}

/// Max/argmax reduction of (red_f, red_u) over the workgroup; thread 0 gets the result in t_m,
/// t_arg. Ties go to the lower index.
fn reduce_argmax(lid: u32) {
  red_f[lid] = t_m;
  red_u[lid] = t_arg;
  workgroupBarrier();
  if (lid < WG / FAN) {
    var bm = red_f[lid * FAN];
    var ba = red_u[lid * FAN];
    for (var j = 1u; j < FAN; j++) {
      let v = red_f[lid * FAN + j];
      let a = red_u[lid * FAN + j];
      if (v > bm || (v == bm && a < ba)) {
        bm = v;
        ba = a;
      }
    }
    red_g[lid] = bm;
    hist_c[lid] = ba;
  }
  workgroupBarrier();
  if (lid == 0u) {
    var bm = red_g[0];
    var ba = hist_c[0];
    for (var j = 1u; j < WG / FAN; j++) {
      let v = red_g[j];
      let a = hist_c[j];
      if (v > bm || (v == bm && a < ba)) {
        bm = v;
        ba = a;
      }
    }
    t_m = bm;
    t_arg = ba;
  }
}

/// Finds the cut key of top-k (`mass` false: count at-or-above >= k) or top-p (`mass` true:
/// mass at-or-above >= top_p * mass of [lo, hi]) inside the key interval [lo, hi], where hi is
/// the key of the row maximum. Returns the smallest key that is kept.
fn search(
  s0: Search,
  mass: bool,
  k: u32,
  top_p: f32,
  m: f32,
  inv_t: f32,
  base: u32,
  vocab: u32,
  lid: u32,
) -> Search {
  var s = s0;
  s.above_c = 0u;
  s.above_w = 0.0;
  s.done = 0u;
  var first = true;
  for (var round = 0u; round < 12u; round++) {
    let span = s.hi - s.lo;
    let shift = u32(max(i32(32u - countLeadingZeros(span)) - i32(NB_LOG2), 0));
    for (var b = 0u; b < NB; b++) {
      hist_c[b * WG + lid] = 0u;
      hist_w[b * WG + lid] = 0.0;
    }
    if (s.list != 0u) {
      for (var i = lid; i < s.list_n; i += WG) {
        search_visit(cand_v[i], cand_i[i], s, shift, mass, m, inv_t, lid);
      }
    } else {
      ROW_SCAN(search_visit($logit, $index, s, shift, mass, m, inv_t, lid));
    }
    workgroupBarrier();
    // Bucket totals: thread t sums the WG columns of buckets t, t + WG, ... into column 0.
    for (var b = lid; b < NB; b += WG) {
      var c = 0u;
      var w = 0.0;
      for (var j = 0u; j < WG; j++) {
        c += hist_c[b * WG + j];
        w += hist_w[b * WG + j];
      }
      hist_c[b * WG] = c;
      hist_w[b * WG] = w;
    }
    workgroupBarrier();
    if (lid == 0u) {
      var total_c = s.above_c;
      var total_w = s.above_w;
      for (var b = 0u; b < NB; b++) {
        total_c += hist_c[b * WG];
        total_w += hist_w[b * WG];
      }
      if (first && mass) {
        s.goal = top_p * total_w;
      }
      if (first && !mass && total_c <= k) {
        s.done = 1u; // top-k keeps every element of the range
      } else {
        // Largest bucket j whose at-or-above count / mass reaches the target.
        var fc = s.above_c;
        var fw = s.above_w;
        var j = NB;
        var above_c = 0u;
        var above_w = 0.0;
        loop {
          if (j == 0u) {
            break;
          }
          j--;
          above_c = fc;
          above_w = fw;
          fc += hist_c[j * WG];
          fw += hist_w[j * WG];
          let ok = select(fc >= k, fw >= s.goal && fc >= 1u, mass);
          if (ok) {
            break;
          }
        }
        let new_lo = s.lo + (j << shift);
        let mask = (1u << shift) - 1u;
        let new_hi = select(new_lo + mask, s.hi, s.hi - new_lo <= mask);
        s.done = select(0u, 1u, new_lo == new_hi || hist_c[j * WG] <= 1u || (!mass && fc == k));
        s.lo = new_lo;
        s.hi = new_hi;
        s.above_c = above_c;
        s.above_w = above_w;
        // fc elements have key >= new_lo: if they fit, the next row scan collects them.
        if (s.fill == 0u && s.list == 0u && fc <= CAP) {
          s.fill = 2u;
          s.fill_lo = new_lo;
        }
      }
      if (s.fill == 1u) {
        // This pass filled the list.
        s.fill = 0u;
        s.list = 1u;
        s.list_lo = s.fill_lo;
        s.list_n = min(atomicLoad(&cand_n), CAP);
      }
      if (s.fill == 2u) {
        s.fill = 1u;
        atomicStore(&cand_n, 0u);
      }
      sh_search = s;
    }
    s = workgroupUniformLoad(&sh_search);
    first = false;
    if (s.done != 0u) {
      break;
    }
  }
  return s;
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
  let vocab = p.vocab;
  let base = row * vocab;
  let out = p.row0 + row;
  let sp = seq[out];

  // Pass 1: max, argmax, sum(exp(l - max)), smallest finite logit.
  t_m = NEG_INF;
  t_arg = 0xffffffffu;
  t_sum = 0.0;
  t_mn = POS_INF;
  ROW_SCAN(stats_visit($logit, $index));
  red_h[lid] = t_sum;
  hist_w[lid] = t_mn;
  reduce_argmax(lid); // keeps red_f[j] = thread j's max, red_h and hist_w intact
  if (lid == 0u) {
    let m = t_m;
    var sum = 0.0;
    var mn = hist_w[0];
    for (var j = 0u; j < WG; j++) {
      let mj = red_f[j];
      if (mj > NEG_INF) {
        sum += red_h[j] * exp(mj - m);
      }
      mn = min(mn, hist_w[j]);
    }
    sh_stats = Stats(m, select(0u, t_arg, t_arg < vocab), sum, mn);
  }
  let st = workgroupUniformLoad(&sh_stats);

  // Forced (scoring) mode: the rank and logprob of the target instead of a draw. sp is a read-only
  // storage value at a uniform index, so the branch (and the barrier inside) is uniform.
  let tgt = sp.target_id;
  if (tgt != 0xffffffffu) {
    if (tgt >= vocab) {
      if (lid == 0u) {
        tokens[out] = 0u;
        logprobs[out] = bitcast<f32>(0xff800000u); // -inf
      }
      return;
    }
    let lt = logits[base + tgt];
    var above = 0u;
    ROW_SCAN(above += u32($logit > lt));
    red_u[lid] = above; // red_u is free again: reduce_argmax's reads ended before sh_stats
    workgroupBarrier();
    if (lid == 0u) {
      var rank = 1u;
      for (var j = 0u; j < WG; j++) {
        rank += red_u[j];
      }
      tokens[out] = rank;
      // lt - m - log(sum) is -inf for lt = -inf except in an all -inf row (m = -inf): NaN there.
      logprobs[out] = select(bitcast<f32>(0xff800000u), lt - st.m - log(st.sum), lt >= NEG_INF);
    }
    return;
  }

  let temperature = sp.temperature;
  if (!(temperature > 0.0) || !(st.m > NEG_INF)) {
    // Greedy (or a row that is all -inf: token 0).
    if (lid == 0u) {
      tokens[out] = st.arg;
      logprobs[out] = -log(st.sum);
    }
    return;
  }

  let m = st.m;
  let inv_t = 1.0 / temperature;
  var s = Search(order_key(st.mn), order_key(m), 0u, 0.0, 0.0, 0u, 0u, 0u, 0u, 0u, 0u);
  if (sp.min_p > 0.0) {
    s.lo = max(s.lo, min(order_key(m + temperature * log(sp.min_p)), s.hi));
  }
  let hi = s.hi;
  if (sp.top_k > 0u && sp.top_k < vocab) {
    s = search(s, false, sp.top_k, 1.0, m, inv_t, base, vocab, lid);
    s.hi = hi;
  }
  if (sp.top_p < 1.0) {
    s = search(s, true, 0u, sp.top_p, m, inv_t, base, vocab, lid);
  }
  let lo = s.lo;

  // Gumbel-max over the survivors {key >= lo}, from the candidate list when it holds them.
  let k1 = mix32(sp.seed ^ mix32(sp.counter + 0x9e3779b9u));
  let k2 = mix32(k1 ^ 0x5bd1e995u);
  t_m = NEG_INF;
  t_arg = 0xffffffffu;
  if (s.list != 0u) {
    for (var j = lid; j < s.list_n; j += WG) {
      gumbel_visit(cand_v[j], cand_i[j], lo, m, inv_t, k1, k2);
    }
  } else {
    ROW_SCAN(gumbel_visit($logit, $index, lo, m, inv_t, k1, k2));
  }
  reduce_argmax(lid);
  if (lid == 0u) {
    let tok = select(st.arg, t_arg, t_arg < vocab);
    tokens[out] = tok;
    logprobs[out] = logits[base + tok] - m - log(st.sum);
  }
}
