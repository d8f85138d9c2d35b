#include "kernels/cuda/sampling.h"

#include <cfloat>
#include <climits>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/launch.cuh"

namespace fathom::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
// Probabilities relative to the row's largest one, as fixed-point integers: sums are then exact and
// independent of the order of addition, so a seeded draw gives the same token on every run.
constexpr float kFixedOne = 1099511627776.f;  // 2^40; up to 2^18 tokens of weight <= 1 fit 64 bits

// Order-preserving map of floats to unsigned keys (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) from (seed, draw, j) alone.
__device__ __forceinline__ double uniform01(uint64_t seed, uint64_t draw, int j) {
  const uint64_t z = splitmix(seed ^ splitmix(draw * 4 + uint64_t(j)));
  return double(z >> 11) * (1.0 / 9007199254740992.0);
}

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// (value, index) as one key whose maximum is the largest value, ties to the lowest index.
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
  return (static_cast<unsigned long long>(order_key(v)) << 32) | static_cast<uint32_t>(~i);
}
__device__ __forceinline__ float key_value(unsigned long long k) {
  const uint32_t u = uint32_t(k >> 32);
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}
__device__ __forceinline__ int key_index(unsigned long long k) { return int(~uint32_t(k)); }

static_assert(kWarps == 32, "the block reductions combine one warp's value a lane");

// The inverse CDF works on groups of kGroup consecutive ids (8 a lane of one warp: a warp reads
// 1 KB of the row at once): each group's weight in shared memory, thread g owning group g in the
// block's scan, then one warp finds the token inside the group the draw lands in.
constexpr int kGroup = 256;
constexpr int kMaxVocab = kGroup * kThreads;  // 2^18: the fixed-point weights' sum fits 64 bits

struct Shared {
  unsigned long long warp[kWarps];
  unsigned long long result;
  float f[kWarps];
  int token;
  int group;                      // the group the draw lands in (-1: none)
  unsigned long long offset;      // the draw's offset inside it
  unsigned long long gsum[kThreads];  // the groups' weights
};

// Block-wide reductions: each warp reduces, lane 0 posts, warp 0 combines the posts (a lane
// each) and posts the result, everyone reads it; the barrier at the end keeps the next
// reduction's writes away from this one's readers. Max and integer sums: exact in any order.
template <class Op>
__device__ unsigned long long block_reduce_u64(unsigned long long x, Op op, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffff, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh.warp[warp] = x;
  __syncthreads();
  if (warp == 0) {
    unsigned long long r = sh.warp[lane];
    for (int o = 16; o > 0; o >>= 1) r = op(r, __shfl_xor_sync(0xffffffff, r, o));
    if (lane == 0) sh.result = r;
  }
  __syncthreads();
  const unsigned long long r = sh.result;
  __syncthreads();
  return r;
}

struct MaxOp {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return a > b ? a : b; }
};
struct SumOp {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return a + b; }
};

// Largest (value, lowest index) over the block; every thread gets it.
__device__ void block_argmax(float& v, int& idx, Shared& sh) {
  const unsigned long long k = block_reduce_u64(idx == INT_MAX ? 0ull : argmax_key(v, idx), MaxOp{}, sh);
  if (k == 0) {
    v = -INFINITY, idx = INT_MAX;
  } else {
    v = key_value(k), idx = key_index(k);
  }
}

__device__ unsigned long long block_sum_u64(unsigned long long x, Shared& sh) { return block_reduce_u64(x, SumOp{}, sh); }

__device__ float block_sum(float x, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh.f[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = 0;
    for (int w = 0; w < kWarps; ++w) r += sh.f[w];
    sh.f[0] = r;
  }
  __syncthreads();
  const float r = sh.f[0];
  __syncthreads();
  return r;
}

// Inclusive prefix sum over a warp's lanes in order.
__device__ __forceinline__ unsigned long long warp_inclusive_scan(unsigned long long x, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(0xffffffff, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// Exclusive prefix sum over the threads in order; `total` gets the sum. Warp 0 scans the warps'
// sums (a lane each) into the prefix each warp adds.
__device__ unsigned long long block_exclusive_scan(unsigned long long x, unsigned long long& total, Shared& sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned long long inc = warp_inclusive_scan(x, lane);
  if (lane == 31) sh.warp[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const unsigned long long w_inc = warp_inclusive_scan(sh.warp[lane], lane);
    __syncwarp();
    sh.warp[lane] = w_inc;  // the sum of warps 0 .. lane
  }
  __syncthreads();
  const unsigned long long before = warp > 0 ? sh.warp[warp - 1] : 0ull;
  total = sh.warp[kWarps - 1];
  __syncthreads();
  return before + inc - x;
}

struct Weights {
  float m, inv_t;
  __device__ unsigned long long operator()(float x) const {
    return static_cast<unsigned long long>(__expf((x - m) * inv_t) * kFixedOne);
  }
};

// Sum of weights (count: 1 each) of the tokens whose key is >= t.
template <bool kByMass>
__device__ unsigned long long mass_from(const float* l, int V, uint32_t t, Weights w, Shared& sh) {
  unsigned long long s = 0;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float x = l[i];
    if (order_key(x) >= t) s += kByMass ? w(x) : 1ull;
  }
  return block_sum_u64(s, sh);
}

// The largest key t in [lo, hi] whose tokens at or above it weigh at least `target` (lo when the
// tokens from lo up weigh less). Binary search over keys: exact, with no atomics.
template <bool kByMass>
__device__ uint32_t select_key(const float* l, int V, uint32_t lo, uint32_t hi, unsigned long long target, Weights w,
                               Shared& sh) {
  if (mass_from<kByMass>(l, V, hi, w, sh) >= target) return hi;
  if (mass_from<kByMass>(l, V, lo, w, sh) < target) return lo;
  uint32_t a = lo, b = hi - 1;  // W(a) >= target, W(b + 1) < target
  while (a < b) {
    const uint32_t mid = a + (b - a + 1) / 2;
    if (mass_from<kByMass>(l, V, mid, w, sh) >= target) a = mid;
    else b = mid - 1;
  }
  return a;
}

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

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(float* logits, int V, const RowSampling* params,
                                                               LogitAdjustment* adjust, RowSample* out,
                                                               int32_t* top_ids, float* top_lp, int32_t* last_token,
                                                               const uint32_t* masks, const int32_t* row_argmax,
                                                               float* q_rows, int32_t* tokens) {
  pdl_prologue();
  __shared__ Shared sh;
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

  // 1. Logprobs come from the raw logits: logsumexp and the top k before any adjustment.
  if (P.logprobs >= 0) {
    float m = -INFINITY;
    int mi = INT_MAX;
    for (int i = tid; i < V; i += kThreads)
      if (better(l[i], i, m, mi)) m = l[i], mi = i;
    block_argmax(m, mi, sh);
    float s = 0;
    for (int i = tid; i < V; i += kThreads) s += __expf(l[i] - m);
    res.lse = m + logf(block_sum(s, sh));
    const int k = min(min(P.logprobs, kMaxTopLogprobs), V);
    float pv = INFINITY;
    int pi = -1;
    for (int r = 0; r < k; ++r) {  // the next (value, lowest index) below the previous pick
      float bv = -INFINITY;
      int bi = INT_MAX;
      for (int i = tid; i < V; i += kThreads) {
        const float v = l[i];
        if ((v < pv || (v == pv && i > pi)) && better(v, i, bv, bi)) bv = v, bi = i;
      }
      block_argmax(bv, bi, sh);
      if (tid == 0) {
        top_ids[int64_t(row) * kMaxTopLogprobs + r] = bi;
        top_lp[int64_t(row) * kMaxTopLogprobs + r] = bv - res.lse;
      }
      pv = bv, pi = bi;
    }
  }

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
  extern __shared__ float staged[];
  const float* lr = l;
  if (V <= kSampleRowsStagedVocab) {
    for (int i = tid; i < V; i += kThreads) staged[i] = l[i];
    __syncthreads();
    lr = staged;
  }

  // 3. The largest logit: the greedy choice, and the reference of the sampling weights. Where
  // nothing changed the row, argmax_rows' pick (the same value and lowest index) saves a pass.
  float m = -INFINITY;
  int amax = INT_MAX;
  const int picked = row_argmax && P.adjust_begin == P.adjust_end && (P.mask_row < 0 || !masks) ? row_argmax[row] : -1;
  if (picked >= 0 && picked < V) {
    amax = picked, m = lr[picked];
  } else {
    for (int i = tid; i < V; i += kThreads)
      if (better(lr[i], i, m, amax)) m = lr[i], amax = i;
    block_argmax(m, amax, sh);
  }

  int token = amax;
  bool accepted = P.draft >= 0 && amax == P.draft;
  float* q_write = P.q_out >= 0 && q_rows ? q_rows + int64_t(P.q_out) * V : nullptr;
  if (q_write && !(P.temperature > 0.f && isfinite(m)))  // a greedy draft: q one-hot at it
    for (int i = tid; i < V; i += kThreads) q_write[i] = i == amax ? 1.f : 0.f;
  if (P.temperature > 0.f) {
    const Weights w{m, 1.f / P.temperature};
    const uint32_t kmax = order_key(m);
    uint32_t lo = 0;
    if (P.top_k > 0 && P.top_k < V) lo = select_key<false>(lr, V, 0, kmax, uint64_t(P.top_k), w, sh);
    const uint32_t topk_key = lo;
    if (P.min_p > 0.f) lo = max(lo, min(kmax, order_key(m + P.temperature * logf(P.min_p))));
    uint32_t t = lo;
    if (P.top_p < 1.f) {
      // Top-p over the probabilities normalised on the top-k set (as the CPU sampler), cut from lo.
      const unsigned long long mass_k = mass_from<true>(lr, V, topk_key, w, sh);
      unsigned long long target = static_cast<unsigned long long>(double(P.top_p) * double(mass_k));
      target = max(target, 1ull);
      t = select_key<true>(lr, V, lo, kmax, target, w, sh);
    }
    // Inverse CDF over the kept tokens in id order, a group of kGroup ids a thread in the scans.
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
    unsigned long long mine = group_weights(V, weight, sh);
    unsigned long long before = block_exclusive_scan(mine, total, sh);  // the weight of the groups before mine
    if (q_write) {  // the distribution this row's draft is drawn from
      // One division a row: a double division an id is most of this pass on one SM at 248K ids
      // (q agrees with the CPU row sampler's w / total to rounding, as the weights do).
      const double inv_total = 1.0 / double(total);
      for (int i = tid; i < V; i += kThreads)
        q_write[i] = order_key(lr[i]) >= t ? float(double(w(lr[i])) * inv_total) : 0.f;
    }
    unsigned long long target = 0;
    bool draw = true;
    if (q) {  // accept with probability min(1, p(draft) / q(draft)), else draw from the residual
      if (uniform01(P.seed, P.draw, 0) * double(q[P.draft]) * double(total) < double(wd)) {
        token = P.draft, accepted = true, draw = false;
      } else {
        exclude = P.draft, residual = true;
        mine = group_weights(V, weight, sh);
        unsigned long long rest = 0;
        before = block_exclusive_scan(mine, rest, sh);
        if (rest == 0) {  // p = q up to rounding
          token = P.draft, accepted = true, draw = false;
        } else {
          target = static_cast<unsigned long long>(uniform01(P.seed, P.draw, 1) * double(rest));
        }
      }
    } else if (has_draft) {
      // Accept the draft with probability p(draft), else draw from p without it.
      if (uniform01(P.seed, P.draw, 0) * double(total) < double(wd) || total == wd) {
        token = P.draft, accepted = true, draw = false;
      } else {
        exclude = P.draft;
        const int draft_group = P.draft / kGroup;
        if (tid == draft_group) mine -= wd;
        if (tid > draft_group) before -= wd;
        target = static_cast<unsigned long long>(uniform01(P.seed, P.draw, 1) * double(total - wd));
      }
    } else {  // j = 2 for a draft drawn here: apart from its position's own draws
      target = static_cast<unsigned long long>(uniform01(P.seed, P.draw, q_write ? 2 : 0) * double(total));
    }
    if (draw) {
      accepted = false;
      const int found = draw_token(V, weight, mine, before, target, sh);
      token = found >= 0 ? found : amax;  // amax only if rounding left no owner
    }
  }

  if (tid == 0) {
    res.token = token;
    res.accepted = accepted ? 1 : 0;
    if (P.logprobs >= 0) {
      float raw = lr[token];
      for (int a = P.adjust_begin; a < P.adjust_end; ++a)
        if (adjust[a].token == token) raw = adjust[a].raw;
      res.logprob = raw - res.lse;
    }
    out[row] = res;
    if (tokens) tokens[row] = token;
    if (last_token && P.state_slot >= 0) last_token[P.state_slot] = token;
  }
}

}  // namespace

void sample_rows(float* logits, int rows, int vocab, const RowSampling* params, LogitAdjustment* adjust,
                 RowSample* out, int32_t* top_ids, float* top_logprobs, cudaStream_t s, int32_t* last_token,
                 const uint32_t* masks, const int32_t* row_argmax, float* q_rows, int32_t* tokens, bool programmatic) {
  if (rows == 0) return;
  FATHOM_CHECK(vocab <= kMaxVocab, "device sampling: a vocabulary of ", vocab, " ids is past the sampler's ",
               kMaxVocab);
  const size_t smem = vocab <= kSampleRowsStagedVocab ? size_t(vocab) * sizeof(float) : 0;
  if (programmatic) {
    launch(sample_rows_kernel, dim3(rows), dim3(kThreads), smem, s, logits, vocab, params, adjust, out, top_ids,
           top_logprobs, last_token, masks, row_argmax, q_rows, tokens);
  } else {
    sample_rows_kernel<<<rows, kThreads, smem, s>>>(logits, vocab, params, adjust, out, top_ids, top_logprobs,
                                                    last_token, masks, row_argmax, q_rows, tokens);
  }
  FATHOM_CUDA_LAUNCH_CHECK();
  inject_backend_fault(kSamplingOp, kDeviceSampling, out, size_t(rows) * sizeof(RowSample), s);
}

}  // namespace fathom::cuda
