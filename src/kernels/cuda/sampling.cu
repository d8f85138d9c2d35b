#include "kernels/cuda/sampling.h"

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sampling_block.cuh"
#include "kernels/cuda/sampling_select.cuh"

namespace fathom::cuda {
namespace {

using namespace sampling_detail;

// The inverse CDF over a row it does not stage works on groups of kGroup consecutive ids (8 a lane
// of one warp: a warp reads 1 KB of the row at once): each group's weight in shared memory, thread
// g owning group g in the block's scan, then one warp finds the token inside the group the draw
// lands in. A staged row is cheaper read a contiguous chunk a thread.
constexpr int kGroup = 256;
constexpr int kMaxVocab = kGroup * kThreads;  // 2^18: the fixed-point weights' sum fits 64 bits

// sh.gsum[g] = the weight of ids g * kGroup .. (g + 1) * kGroup - 1 (warp w takes groups w, w +
// kWarps, ...; lane l ids 8l .. 8l + 7 of a group). Returns thread g's group weight (0 past the
// groups) once every group is in.
template <class Weight>
__device__ unsigned long long group_weights(int V, Weight weight, Shared& sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, groups = (V + kGroup - 1) / kGroup;
  for (int g = warp; g < groups; g += kWarps) {
    const int i0 = g * kGroup + lane * 8;
    unsigned long long s = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (i0 + j < V) s += weight(i0 + j);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if (lane == 0) sh.gsum[g] = s;
  }
  __syncthreads();
  return int(threadIdx.x) < groups ? sh.gsum[threadIdx.x] : 0ull;
}

// The id where the running weight (ids in order) first passes `target`: thread g holds its group's
// weight `mine` and the weight of the groups before it `before`; -1 if the draw lands nowhere.
template <class Weight>
__device__ int draw_token(int V, Weight weight, unsigned long long mine, unsigned long long before,
                          unsigned long long target, Shared& sh) {
  if (threadIdx.x == 0) sh.token = -1, sh.group = -1;
  __syncthreads();
  if (mine > 0 && target >= before && target < before + mine) sh.group = int(threadIdx.x), sh.offset = target - before;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = sh.group;
  if (warp == 0 && g >= 0) {
    const int i0 = g * kGroup + lane * 8;
    unsigned long long wj[8], s = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) s += wj[j] = i0 + j < V ? weight(i0 + j) : 0ull;
    const unsigned long long inc = warp_inclusive_scan(s, lane), off = sh.offset;
    if (s > 0 && off >= inc - s && off < inc) {
      unsigned long long acc = inc - s;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        acc += wj[j];
        if (off < acc) {
          sh.token = i0 + j;
          break;
        }
      }
    }
  }
  __syncthreads();
  return sh.token;
}

// Who owns which ids in the inverse CDF's scans: thread o the ids [o * span, (o + 1) * span).
struct Owners {
  bool grouped;  // groups of kGroup ids read by warps (a row not staged), else a chunk a thread
  int span;
  __device__ Owners(int V, bool staged) : grouped(!staged), span(staged ? (V + kThreads - 1) / kThreads : kGroup) {}

  // This thread's ids' weight.
  template <class Weight>
  __device__ unsigned long long weigh(int V, Weight weight, Shared& sh) const {
    if (grouped) return group_weights(V, weight, sh);
    const int begin = min(V, int(threadIdx.x) * span), end = min(V, begin + span);
    unsigned long long s = 0;
    for (int i = begin; i < end; ++i) s += weight(i);
    return s;
  }

  // The id where the running weight first passes `target` (mine, before: this thread's weight and
  // the weight of the ids before its own); -1 if the draw lands nowhere.
  template <class Weight>
  __device__ int draw(int V, Weight weight, unsigned long long mine, unsigned long long before,
                      unsigned long long target, Shared& sh) const {
    if (grouped) return draw_token(V, weight, mine, before, target, sh);
    if (threadIdx.x == 0) sh.token = -1;
    __syncthreads();
    if (mine > 0 && target >= before && target < before + mine) {
      const int begin = min(V, int(threadIdx.x) * span), end = min(V, begin + span);
      unsigned long long acc = before;
      for (int i = begin; i < end; ++i) {
        acc += weight(i);
        if (target < acc) {
          sh.token = i;
          break;
        }
      }
    }
    __syncthreads();
    return sh.token;
  }
};

// Logprobs from the raw logits: the row's logsumexp (returned) and its top k before any adjustment.
__device__ float row_logprobs(const float* l, int V, int k, int32_t* top_ids, float* top_lp, Shared& sh) {
  float m = -INFINITY;
  int mi = INT_MAX;
  for_each_logit(l, V, [&](int i, float x) {
    if (better(x, i, m, mi)) m = x, mi = i;
  });
  block_argmax(m, mi, sh);
  float s = 0;
  for_each_logit(l, V, [&](int, float x) { s += __expf(x - m); });
  const float lse = m + logf(block_sum(s, sh));
  k = min(min(k, kMaxTopLogprobs), V);
  float pv = INFINITY;
  int pi = -1;
  for (int r = 0; r < k; ++r) {  // the next (value, lowest index) below the previous pick
    float bv = -INFINITY;
    int bi = INT_MAX;
    for_each_logit(l, V, [&](int i, float v) {
      if ((v < pv || (v == pv && i > pi)) && better(v, i, bv, bi)) bv = v, bi = i;
    });
    block_argmax(bv, bi, sh);
    if (threadIdx.x == 0) top_ids[r] = bi, top_lp[r] = bv - lse;
    pv = bv, pi = bi;
  }
  return lse;
}

// The cut-off key of a sampled row: tokens with keys below it are dropped (top-k, min-p, top-p).
// `space`: the bins' shared memory; null: by bisection (the reference form, for tests).
__device__ uint32_t cutoff_key(const float* lr, int V, const RowSampling& P, float m, Weights w, Shared& sh,
                               unsigned char* space) {
  const uint32_t kmax = order_key(m);
  uint32_t lo = 0;
  if (P.top_k > 0 && P.top_k < V) lo = select_key<false>(lr, V, 0, kmax, uint64_t(P.top_k), w, sh, space);
  const uint32_t topk_key = lo;
  if (P.min_p > 0.f) lo = max(lo, min(kmax, order_key(m + P.temperature * logf(P.min_p))));
  if (!(P.top_p < 1.f)) return lo;
  // Top-p over the probabilities normalised on the top-k set (as the CPU sampler), cut from lo.
  const unsigned long long mass_k = mass_from<true>(lr, V, topk_key, w, sh);
  unsigned long long target = static_cast<unsigned long long>(double(P.top_p) * double(mass_k));
  target = max(target, 1ull);
  return select_key<true>(lr, V, lo, kmax, target, w, sh, space);
}

struct Choice {
  int token;
  bool accepted;
};

// A row at a temperature: the token drawn from the kept tokens' weights in id order, a draft
// accepted with probability p(draft) (or min(1, p / q) for one drawn from q, refused drafts drawn
// again from the residual), and q written for a draft drawn here (q_write).
__device__ Choice sampled_choice(const float* lr, int V, bool staged, const RowSampling& P, float m, int amax,
                                 float* q_write, const float* q_rows, Shared& sh, unsigned char* space) {
  const Weights w{m, 1.f / P.temperature};
  const uint32_t t = cutoff_key(lr, V, P, m, w, sh, space);
  const Owners owners(V, staged);
  const int tid = threadIdx.x;
  const bool has_draft = P.draft >= 0 && P.draft < V;
  unsigned long long wd = 0;
  if (has_draft && order_key(lr[P.draft]) >= t) wd = w(lr[P.draft]);
  const float* q = has_draft && P.draft_q >= 0 && q_rows ? q_rows + int64_t(P.draft_q) * V : nullptr;
  int exclude = -1;
  // A kept token's weight in the draw: w, or after refusing a draft drawn from q the residual
  // max(w - q * total, 0) (none for the draft: refused only where p(draft) < q(draft)).
  bool residual = false;
  unsigned long long total = 0;
  auto weight = [&](int i) -> unsigned long long {
    if (i == exclude || order_key(lr[i]) < t) return 0ull;
    const unsigned long long wi = w(lr[i]);
    if (!residual) return wi;
    const unsigned long long qi = static_cast<unsigned long long>(double(q[i]) * double(total));
    return wi > qi ? wi - qi : 0ull;
  };
  unsigned long long mine = owners.weigh(V, weight, sh);
  unsigned long long before = block_exclusive_scan(mine, total, sh);  // the weight of the ids before mine
  if (q_write) {  // the distribution this row's draft is drawn from
    // One division a row: a double division an id is most of this pass on one SM at 248K ids
    // (q agrees with the CPU row sampler's w / total to rounding, as the weights do).
    const double inv_total = 1.0 / double(total);
    for_each_logit(lr, V, [&](int i, float x) {
      q_write[i] = order_key(x) >= t ? float(double(w(x)) * inv_total) : 0.f;
    });
  }
  unsigned long long target = 0;
  if (q) {  // accept with probability min(1, p(draft) / q(draft)), else draw from the residual
    if (uniform01(P.seed, P.draw, 0) * double(q[P.draft]) * double(total) < double(wd)) return {P.draft, true};
    exclude = P.draft, residual = true;
    mine = owners.weigh(V, weight, sh);
    unsigned long long rest = 0;
    before = block_exclusive_scan(mine, rest, sh);
    if (rest == 0) return {P.draft, true};  // p = q up to rounding
    target = static_cast<unsigned long long>(uniform01(P.seed, P.draw, 1) * double(rest));
  } else if (has_draft) {
    // Accept the draft with probability p(draft), else draw from p without it.
    if (uniform01(P.seed, P.draw, 0) * double(total) < double(wd) || total == wd) return {P.draft, true};
    exclude = P.draft;
    const int owner = P.draft / owners.span;
    if (tid == owner) mine -= wd;
    if (tid > owner) before -= wd;
    target = static_cast<unsigned long long>(uniform01(P.seed, P.draw, 1) * double(total - wd));
  } else {  // j = 2 for a draft drawn here: apart from its position's own draws
    target = static_cast<unsigned long long>(uniform01(P.seed, P.draw, q_write ? 2 : 0) * double(total));
  }
  const int found = owners.draw(V, weight, mine, before, target, sh);
  return {found >= 0 ? found : amax, false};  // amax only if rounding left no owner
}

// Dynamic shared memory: the staged row (rows that fit), then the cut-offs' bins and keys.
__host__ __device__ constexpr size_t staged_bytes(int V) {
  return V <= kSampleRowsStagedVocab ? (size_t(V) * sizeof(float) + 15) / 16 * 16 : 0;
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(float* logits, int V, const RowSampling* params,
                                                               LogitAdjustment* adjust, RowSample* out,
                                                               int32_t* top_ids, float* top_lp, int32_t* last_token,
                                                               const uint32_t* masks, const int32_t* row_argmax,
                                                               float* q_rows, int32_t* tokens, bool bisect) {
  pdl_prologue();
  __shared__ Shared sh;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  const int row = blockIdx.x, tid = threadIdx.x;
  const RowSampling P = params[row];
  if (P.skip) return;
  // A plain greedy row (no logprobs, adjustments or mask) takes the argmax already found: one
  // block would read the whole row again.
  if (row_argmax && P.temperature <= 0.f && P.logprobs < 0 && P.adjust_begin == P.adjust_end &&
      (P.mask_row < 0 || !masks) && P.q_out < 0) {
    if (tid == 0) {
      RowSample res{};
      res.token = row_argmax[row];
      res.accepted = P.draft >= 0 && res.token == P.draft ? 1 : 0;
      out[row] = res;
      if (tokens) tokens[row] = res.token;
      if (last_token && P.state_slot >= 0) last_token[P.state_slot] = res.token;
    }
    return;
  }
  float* l = logits + int64_t(row) * V;
  RowSample res{};

  // 1. Logprobs come from the raw logits.
  if (P.logprobs >= 0)
    res.lse = row_logprobs(l, V, P.logprobs, top_ids + int64_t(row) * kMaxTopLogprobs,
                           top_lp + int64_t(row) * kMaxTopLogprobs, sh);

  // 2. Penalties, logit bias and min_tokens masking (one entry per token of the row).
  for (int a = P.adjust_begin + tid; a < P.adjust_end; a += kThreads) {
    LogitAdjustment& e = adjust[a];
    const float x = l[e.token];
    e.raw = x;
    l[e.token] = adjusted_logit(e, x);
  }
  __syncthreads();
  // Structured output: tokens outside the grammar's mask (bit t of word t / 32) are impossible.
  if (P.mask_row >= 0 && masks) {
    const uint32_t* mw = masks + int64_t(P.mask_row) * ((V + 31) / 32);
    for (int i = tid; i < V; i += kThreads)
      if (!((mw[i >> 5] >> (i & 31)) & 1u)) l[i] = -INFINITY;
    __syncthreads();
  }

  // Rows that fit are staged in shared memory: the passes below read them several times.
  const bool staged = V <= kSampleRowsStagedVocab;
  const float* lr = l;
  if (staged) {
    float* copy = reinterpret_cast<float*>(dynamic_smem);
    for_each_logit(l, V, [&](int i, float x) { copy[i] = x; });
    __syncthreads();
    lr = copy;
  }

  // 3. The largest logit: the greedy choice, and the reference of the sampling weights. Where
  // nothing changed the row, argmax_rows' pick (the same value and lowest index) saves a pass.
  float m = -INFINITY;
  int amax = INT_MAX;
  const int picked = row_argmax && P.adjust_begin == P.adjust_end && (P.mask_row < 0 || !masks) ? row_argmax[row] : -1;
  if (picked >= 0 && picked < V) {
    amax = picked, m = lr[picked];
  } else {
    for_each_logit(lr, V, [&](int i, float x) {
      if (better(x, i, m, amax)) m = x, amax = i;
    });
    block_argmax(m, amax, sh);
  }

  Choice c{amax, P.draft >= 0 && amax == P.draft};
  float* q_write = P.q_out >= 0 && q_rows ? q_rows + int64_t(P.q_out) * V : nullptr;
  if (q_write && !(P.temperature > 0.f && isfinite(m)))  // a greedy draft: q one-hot at it
    for (int i = tid; i < V; i += kThreads) q_write[i] = i == amax ? 1.f : 0.f;
  if (P.temperature > 0.f)
    c = sampled_choice(lr, V, staged, P, m, amax, q_write, q_rows, sh,
                       bisect ? nullptr : dynamic_smem + staged_bytes(V));

  if (tid == 0) {
    res.token = c.token;
    res.accepted = c.accepted ? 1 : 0;
    if (P.logprobs >= 0) {
      float raw = lr[c.token];
      for (int a = P.adjust_begin; a < P.adjust_end; ++a)
        if (adjust[a].token == c.token) raw = adjust[a].raw;
      res.logprob = raw - res.lse;
    }
    out[row] = res;
    if (tokens) tokens[row] = c.token;
    if (last_token && P.state_slot >= 0) last_token[P.state_slot] = c.token;
  }
}

bool g_bisect_cutoffs = false;

}  // namespace

void set_sampling_cutoffs_by_bisection(bool on) { g_bisect_cutoffs = on; }

void sample_rows(float* logits, int rows, int vocab, const RowSampling* params, LogitAdjustment* adjust,
                 RowSample* out, int32_t* top_ids, float* top_logprobs, cudaStream_t s, int32_t* last_token,
                 const uint32_t* masks, const int32_t* row_argmax, float* q_rows, int32_t* tokens, bool programmatic) {
  if (rows == 0) return;
  FATHOM_CHECK(vocab <= kMaxVocab, "device sampling: a vocabulary of ", vocab, " ids is past the sampler's ",
               kMaxVocab);
  const size_t smem = staged_bytes(vocab) + kSelectBytes;
  allow_dynamic_smem(reinterpret_cast<const void*>(sample_rows_kernel), int(smem));
  if (programmatic) {
    launch(sample_rows_kernel, dim3(rows), dim3(kThreads), smem, s, logits, vocab, params, adjust, out, top_ids,
           top_logprobs, last_token, masks, row_argmax, q_rows, tokens, g_bisect_cutoffs);
  } else {
    sample_rows_kernel<<<rows, kThreads, smem, s>>>(logits, vocab, params, adjust, out, top_ids, top_logprobs,
                                                    last_token, masks, row_argmax, q_rows, tokens,
                                                    g_bisect_cutoffs);
  }
  FATHOM_CUDA_LAUNCH_CHECK();
  inject_backend_fault(kSamplingOp, kDeviceSampling, out, size_t(rows) * sizeof(RowSample), s);
}

}  // namespace fathom::cuda
