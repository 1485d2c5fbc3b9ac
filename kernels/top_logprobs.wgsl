// top_logprobs: per row, the n most likely tokens under the log-softmax of the logits, with
// their log-probabilities (OpenAI `top_logprobs`, vLLM `logprobs`).
//
// Per row s (one workgroup), with l = logits[s, :], m = max(l), lse = m + log(sum(exp(l - m)))
// and n = min(counts[s], p.k, vocab):
//   ids[s, j]      = the token of rank j (j < n): logits in descending order, equal logits by
//                    ascending token id
//   logprobs[s, j] = (l[ids[s, j]] - m) - log(sum(exp(l - m)))   (= l - lse, without the
//                    cancellation of forming lse first)
// Rows with counts[s] == 0 return at once; entries j >= n of a row are not written.
// Run it on the RAW logits (before logits_process and temperature), as vLLM does by default.
// Logits must not be NaN; -inf is allowed (logprob -inf; a row of only -inf gives NaN).
// Comparisons use an order-preserving u32 key of the f32 logit (key 0 is never a real value).
//
// Method (two reads of the row in the common case):
//   pass 1  each thread strides the row keeping an online max / sum(exp(l - max)) and its two
//           largest keys. The n-th largest of those 2 * WG keys, tau, is a lower bound of the
//           row's n-th largest key (they are 2 * WG distinct elements of the row).
//   pass 2  every element with key >= tau is appended to a candidate list in workgroup memory.
//           If at most CAP (256) were found, each candidate's rank is the number of candidates
//           that beat it (larger key, or equal key and lower id); ranks < n are written out.
//   else    (many ties at tau, or rows built so that one thread holds all large values): each
//           thread strides the row again keeping its own sorted top KMAX (an insertion network
//           of KMAX compare-swaps with constant indices), and thread 0 merges the WG lists.
//
// Bindings (group 0):
//   0 logits   : storage read   array<f32>  [num_seqs, vocab] (row stride vocab)
//   1 counts   : storage read   array<u32>  [row0 + num_seqs] tokens wanted per row (0: skip)
//   2 ids      : storage rw     array<u32>  [row0 + num_seqs, k] (row stride k) token ids (output)
//   3 logprobs : storage rw     array<f32>  [row0 + num_seqs, k] (row stride k) log-probs (output)
// Logits row s is row row0 + s of counts, ids and logprobs (row0: the first of a sub-batch of
// rows whose logits were computed into rows 0.. of `logits`, engine/sampler.ts).
//   4 p        : uniform        Params
// Prelude (kernels/top_logprobs.ts): `const WG` (invocations per workgroup, 16 to 128) and
// logit_row.wgsl (NEG_INF, order_key); KMAX (20) is the largest k. Each `ROW_SCAN(visit)` line
// becomes the loop of kernels/logit_row.ts: visit($logit, $index) for every logit of the row.
// Workgroup memory: 8 * WG * KMAX + 8 * CAP + 16 * WG + 16 bytes.
// Limits: an invocation runs about 3 * vocab / (4 * WG) + CAP * CAP / WG loop iterations;
// Mesa lavapipe silently ends loops after 65535 iterations per invocation (vocab <~ 1M at WG 16).
// Workgroup: WG invocations, one workgroup per row; threads stride the row, 4 loads in flight.
// Dispatch:  num_seqs workgroups as a 1-D grid folded into (x, y) (kernels/dispatch.ts dispatch1d).

struct Params {
  num_seqs: u32,
  vocab: u32,
  k: u32, // row stride of ids / logprobs, <= KMAX
  row0: u32, // index of logits row 0 in counts, ids and logprobs
}

struct Stats {
  m: f32,
  log_sum: f32,
  count: u32, // candidates found by pass 2
}

const KMAX: u32 = 20u;
const CAP: u32 = 256u;
const EMPTY: u32 = 0xffffffffu;

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> counts: array<u32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> logprobs: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> sh_key: array<u32, WG * KMAX>; // fallback: [thread][rank]
var<workgroup> sh_id: array<u32, WG * KMAX>;
var<workgroup> sh_top2: array<u32, 2 * WG>;
var<workgroup> sh_m: array<f32, WG>;
var<workgroup> sh_sum: array<f32, WG>;
var<workgroup> cand_key: array<u32, CAP>;
var<workgroup> cand_id: array<u32, CAP>;
var<workgroup> cand_n: atomic<u32>;
var<workgroup> sh_tau: atomic<u32>;
var<workgroup> sh_stats: Stats;

// Per-thread state: online max and sum, two largest keys; fallback: sorted top KMAX.
var<private> t_m: f32;
var<private> t_sum: f32;
var<private> t_k1: u32;
var<private> t_k2: u32;
var<private> t_key: array<u32, KMAX>;
var<private> t_id: array<u32, KMAX>;

/// Whether (ka, ia) ranks before (kb, ib): larger key, or equal key and lower id.
fn beats(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
  return ka > kb || (ka == kb && ia < ib);
}

fn stats_visit(l: f32) {
  if (l > t_m) {
    t_sum = t_sum * exp(t_m - l) + 1.0;
    t_m = l;
  } else if (l > NEG_INF) {
    t_sum += exp(l - t_m);
  }
  let key = order_key(l);
  t_k2 = max(t_k2, min(key, t_k1));
  t_k1 = max(t_k1, key);
}

fn collect_visit(l: f32, i: u32, tau: u32) {
  let key = order_key(l);
  if (key >= tau) {
    let at = atomicAdd(&cand_n, 1u);
    if (at < CAP) {
      cand_key[at] = key;
      cand_id[at] = i;
    }
  }
}

/// Fallback: inserts (key, i) into the thread's sorted top KMAX. A thread visits its tokens in
/// ascending order, so an equal key never displaces an earlier entry.
fn list_visit(l: f32, i: u32) {
  var key = order_key(l);
  if (key > t_key[KMAX - 1u]) {
    var id = i;
    for (var j = 0u; j < KMAX; j++) {
      let k = t_key[j];
      let d = t_id[j];
      let swap = key > k;
      t_key[j] = select(k, key, swap);
      t_id[j] = select(d, id, swap);
      key = select(key, k, swap);
      id = select(id, d, swap);
    }
  }
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
  let n = min(min(counts[p.row0 + row], min(p.k, KMAX)), vocab);
  if (n == 0u) {
    return;
  }
  let base = row * vocab;
  let out = (p.row0 + row) * p.k;

  // Pass 1: max, sum(exp(l - max)), the thread's two largest keys.
  t_m = NEG_INF;
  t_sum = 0.0;
  t_k1 = 0u;
  t_k2 = 0u;
  ROW_SCAN(stats_visit($logit));
  sh_m[lid] = t_m;
  sh_sum[lid] = t_sum;
  sh_top2[2u * lid] = t_k1;
  sh_top2[2u * lid + 1u] = t_k2;
  if (lid == 0u) {
    atomicStore(&sh_tau, select(EMPTY, 0u, n > 2u * WG));
    atomicStore(&cand_n, 0u);
  }
  workgroupBarrier();

  // tau = the n-th largest of the 2 * WG keys: the smallest key with fewer than n above it.
  for (var e = lid; e < 2u * WG; e += WG) {
    let key = sh_top2[e];
    var above = 0u;
    for (var j = 0u; j < 2u * WG; j++) {
      above += select(0u, 1u, sh_top2[j] > key);
    }
    if (above < n) {
      atomicMin(&sh_tau, key);
    }
  }
  if (lid == 0u) {
    var m = NEG_INF;
    for (var t = 0u; t < WG; t++) {
      m = max(m, sh_m[t]);
    }
    var sum = 0.0;
    for (var t = 0u; t < WG; t++) {
      let mt = sh_m[t];
      if (mt > NEG_INF) {
        sum += sh_sum[t] * exp(mt - m);
      }
    }
    sh_stats.m = m;
    sh_stats.log_sum = log(sum);
  }
  workgroupBarrier();

  // Pass 2: candidates with key >= tau.
  let tau = atomicLoad(&sh_tau);
  ROW_SCAN(collect_visit($logit, $index, tau));
  workgroupBarrier();
  if (lid == 0u) {
    sh_stats.count = atomicLoad(&cand_n);
  }
  let st = workgroupUniformLoad(&sh_stats);

  if (st.count <= CAP) {
    // Rank of each candidate among the candidates; the first n are the answer.
    for (var c = lid; c < st.count; c += WG) {
      let key = cand_key[c];
      let id = cand_id[c];
      var rank = 0u;
      for (var j = 0u; j < st.count; j++) {
        rank += select(0u, 1u, beats(cand_key[j], cand_id[j], key, id));
      }
      if (rank < n) {
        ids[out + rank] = id;
        logprobs[out + rank] = (logits[base + id] - st.m) - st.log_sum;
      }
    }
    return;
  }

  // Fallback: per-thread sorted top KMAX, merged by thread 0.
  for (var j = 0u; j < KMAX; j++) {
    t_key[j] = 0u;
    t_id[j] = EMPTY;
  }
  ROW_SCAN(list_visit($logit, $index));
  for (var j = 0u; j < n; j++) {
    sh_key[lid * KMAX + j] = t_key[j];
    sh_id[lid * KMAX + j] = t_id[j];
  }
  workgroupBarrier();
  if (lid != 0u) {
    return;
  }
  var head: array<u32, WG>;
  for (var t = 0u; t < WG; t++) {
    head[t] = 0u;
  }
  for (var r = 0u; r < n; r++) {
    var best_t = 0u;
    var best_key = 0u;
    var best_id = EMPTY;
    for (var t = 0u; t < WG; t++) {
      let h = head[t];
      if (h < n) {
        let key = sh_key[t * KMAX + h];
        let id = sh_id[t * KMAX + h];
        if (beats(key, id, best_key, best_id)) {
          best_t = t;
          best_key = key;
          best_id = id;
        }
      }
    }
    head[best_t] += 1u;
    ids[out + r] = best_id;
    logprobs[out + r] = (logits[base + best_id] - st.m) - st.log_sum;
  }
}
